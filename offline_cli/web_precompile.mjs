// Compiles the web client's Python to bytecode at build time, with the CPython the browser will run: the
// project's own Pyodide, under Node.js (offline_cli/web_build.py runs this; no other Python can, since
// bytecode is specific to CPython's version and Pyodide's is not the build machine's).
//
// Without it a first visit compiles every module it imports from source, in WebAssembly: Pyodide's
// standard library ships as source, and starting Python imports about 200 of its modules. That was most of
// a cold start (about 2.6 s of CPU out of 4 on the machine measured; see bench/browser.py's cold_path).
//
//   node web_precompile.mjs <node_modules/pyodide folder> <jobs.json> [compiled standard library zip]
//
// (The last argument, from an earlier build, makes Python start here faster too.)
//
// jobs.json: [{"source": zip, "target": zip, "sourceless": bool, "prefix": "/app/"}, ...]. Each job copies
// the zip `source` to `target` with each .py file compiled: `sourceless` (the standard library) replaces
// `x.py` by `x.pyc` (zipimport loads it, nothing is compiled or checked in the browser); otherwise the
// source stays and its bytecode goes beside it as `__pycache__/x.cpython-3XY.pyc`, checked against the
// source's hash on import (the app's code, which the worker unpacks into a folder: edited or stale bytecode
// is never run). `prefix`: where the files are in the browser, for the code objects' file names ("": the
// standard library's zip, where Pyodide puts it).
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [folder, jobsFile, stdlib] = process.argv.slice(2);
const { loadPyodide } = await import(pathToFileURL(join(folder, "pyodide.mjs")).href);
const pyodide = await loadPyodide({
  indexURL: folder.endsWith("/") ? folder : folder + "/", // (a path under Node.js, not a file: URL)
  ...(stdlib ? { stdLibURL: stdlib } : {}),
  stdout: (line) => console.error(line),
  stderr: (line) => console.error(line),
});

const compile = pyodide.runPython(`
import importlib.util
import sys
import zipfile
from importlib._bootstrap_external import _code_to_hash_pyc

STDLIB = next(path for path in sys.path if path.endswith(".zip")) + "/"


def precompile(source, target, sourceless, prefix):
    prefix = prefix or STDLIB
    compiled = 0
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            data = src.read(info)
            if not info.filename.endswith(".py"):
                out.writestr(info, data)
                continue
            try:
                code = compile(data, prefix + info.filename, "exec", dont_inherit=True)
            except (SyntaxError, ValueError):
                out.writestr(info, data)  # (the browser reports the error on import, as without bytecode)
                continue
            pyc = _code_to_hash_pyc(code, importlib.util.source_hash(data), not sourceless)
            if sourceless:
                name = info.filename + "c"
            else:
                out.writestr(info, data)
                name = importlib.util.cache_from_source(info.filename)
            entry = zipfile.ZipInfo(name, date_time=info.date_time)
            entry.compress_type = zipfile.ZIP_DEFLATED
            entry.external_attr = info.external_attr
            out.writestr(entry, pyc)
            compiled += 1
    return compiled


precompile
`);

for (const job of JSON.parse(readFileSync(jobsFile, "utf8"))) {
  pyodide.FS.writeFile("/tmp/source.zip", readFileSync(job.source));
  const count = compile("/tmp/source.zip", "/tmp/target.zip", job.sourceless, job.prefix);
  writeFileSync(job.target, pyodide.FS.readFile("/tmp/target.zip"));
  console.log(JSON.stringify({ target: job.target, compiled: count }));
}
