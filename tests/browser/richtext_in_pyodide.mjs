// Runs offline.merge.richtext in Pyodide under Node.js, as the browser's worker does: the offline library from
// a built project's Python bundle, Yjs from its node_modules/yjs registered as `offline_yjs` (pycrdt has no
// WebAssembly build). Usage: node richtext_in_pyodide.mjs PROJECT REQUEST.json; prints the answer as JSON.
// The request: {"initial": update, "clientId": n, "edits": [["insert", index, text] | ["delete", index, length]],
// "remote": [update], "orders": [[index into all updates]]}, updates in base64. The answer: {"backend",
// "updates" (this side's edits), "alone" (its text before the remote updates), "merged" (after them),
// "orders" (the text of every update folded afresh in each order: initial, remote..., own...), "states" (the
// rich text states, base64, of those folds), "state" (the state after the remote updates), "garbage"
// (whether a non-update left the state as it was)}.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [project, requestPath] = process.argv.slice(2);
const modules = join(project, "node_modules");
const { loadPyodide } = await import(pathToFileURL(join(modules, "pyodide", "pyodide.mjs")).href);
const config = (await import(pathToFileURL(join(project, "dist", "config.js")).href)).default;

const pyodide = await loadPyodide({ indexURL: join(modules, "pyodide") + "/" });
pyodide.unpackArchive(new Uint8Array(readFileSync(join(project, "dist", config.python))), "zip", { extractDir: "/app" });
pyodide.registerJsModule("offline_yjs", await import(pathToFileURL(join(modules, "yjs", "dist", "yjs.mjs")).href));
pyodide.globals.set("request_text", readFileSync(requestPath, "utf8"));
const answer = pyodide.runPython(`
import base64, json, sys
sys.path.insert(0, "/app")
from offline.merge import richtext, yjs

request = json.loads(request_text)
decode = base64.b64decode
state = richtext.fold_update(None, decode(request["initial"]))
updates = []
for kind, index, value in request["edits"]:
    size = len(richtext.text_of(state))
    if kind == "insert":
        edit = lambda t, i=index % (size + 1), v=value: t.insert(i, v)
    else:
        start = index % max(size, 1)
        edit = lambda t, a=start, b=min(size, start + value): t.__delitem__(slice(a, b))
    update, _ = richtext.edit_update(state, edit, client_id=request["clientId"])
    state = richtext.fold_update(state, update)
    updates.append(update)
alone = richtext.text_of(state)
for update in request["remote"]:
    state = richtext.fold_update(state, decode(update))
every = [decode(request["initial"]), *map(decode, request["remote"]), *updates]
texts = []
states = []
for order in request["orders"]:
    fresh = None
    for i in order:
        fresh = richtext.fold_update(fresh, every[i])
    texts.append(richtext.text_of(fresh))
    states.append(fresh)
json.dumps({
    "backend": yjs.backend().name,
    "updates": [base64.b64encode(u).decode("ascii") for u in updates],
    "alone": alone,
    "merged": richtext.text_of(state),
    "orders": texts,
    "states": states,
    "state": state,
    "garbage": richtext.fold_update(state, b"\\x05\\xff\\xff garbage") == state,
})
`);
process.stdout.write(answer);
