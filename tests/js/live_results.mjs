// Replays a live query's messages from offline/worker.py (JSON lines on stdin: {"orderBy": [...]} first,
// then "snapshot" and "changes" messages) through the page's LiveResults and prints, as JSON, the ids of
// the results in the order the page holds them after each message (a snapshot's parts count as one).
import { readFileSync } from "node:fs";
import { LiveResults } from "../../offline_cli/templates/project/web/offline-client.js";

const lines = readFileSync(0, "utf8").split("\n").filter(Boolean).map((line) => JSON.parse(line));
const results = new LiveResults(lines[0].orderBy);
const after = [];
let parts = [];
for (const message of lines.slice(1)) {
  if (message.type === "snapshot") {
    parts.push(...message.records);
    if (message.more) continue; // a part of a large snapshot: the results are replaced once all came
    results.reset(parts);
    parts = [];
  } else results.apply(message);
  after.push(results.rows.map((record) => record.id));
}
process.stdout.write(JSON.stringify(after));
