// `npm run build`: writes dist/, the web client the server serves. The work is done by the Python side
// of the `offline` package (python -m offline_cli.web_build), which bundles the project's Python modules
// with the offline library, copies Pyodide from node_modules and bakes in BUILD_SYNC_URL (default
// ws://localhost:3001/offline-sync; a path such as /offline-sync means "the server this page came from").
// The Python used: $OFFLINE_PYTHON, else the project's .venv, the active virtualenv, python3, python.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const windows = process.platform === "win32";
const venvPython = (root) => join(root, windows ? "Scripts/python.exe" : "bin/python");

if (!existsSync(join(here, "node_modules", "pyodide", "package.json"))) {
  console.log("pyodide is not installed yet: running npm install");
  const npm = spawnSync(windows ? "npm.cmd" : "npm", ["install", "--no-audit", "--no-fund"], { cwd: here, stdio: "inherit" });
  if (npm.status !== 0) process.exit(npm.status ?? 1);
}

const candidates = [
  process.env.OFFLINE_PYTHON,
  venvPython(join(here, ".venv")),
  venvPython(join(here, "venv")),
  process.env.VIRTUAL_ENV && venvPython(process.env.VIRTUAL_ENV),
  "python3",
  "python",
].filter(Boolean);
const python = candidates.find(
  (candidate) => spawnSync(candidate, ["-c", "import offline_cli.web_build"], { stdio: "ignore" }).status === 0,
);
if (!python) {
  console.error(
    "cannot find a Python with the offline package installed (tried " + candidates.join(", ") + ").\n" +
      "Install it (pip install offline) or set OFFLINE_PYTHON to that Python, then run npm run build again.",
  );
  process.exit(1);
}
const build = spawnSync(python, ["-m", "offline_cli.web_build", here], { cwd: here, stdio: "inherit" });
process.exit(build.status ?? 1);
