"""A fake ``railway`` CLI for the commands the Railway adapter runs.

The world file ``railway.json`` (all keys optional):
    logged_in     bool (default true)
    workspaces    number of workspaces (default 1); with more, `init` needs --workspace (no TTY to ask)
    projects      {id: {id, name, environments: [{id, name}], services: [{id, name}]}}
    links         {directory: {project, environment, service}}   like the CLI's per-directory links; a
                  command uses the closest linked ancestor of its working directory
    deployments   {service_id: [deployment]} newest first: {id, status, createdAt, meta, script}; each
                  `deployment list` first moves every deployment one step along its ``script``
    up_script     statuses a new `up` deployment goes through (default BUILDING, DEPLOYING, SUCCESS)
    up_error      text: `up` fails with it
    up_quiet      true: `up` prints no build-logs URL (so no deployment id)
    variables     {service_id: {NAME: {"value": plain value} | {"stdin_length": n}}} (secrets: lengths only)
    volumes       {service_id: mount path}
    volume_error  text: `volume add` fails with it
    domains       {service_id: host}
    logs          {service_id: [{timestamp, message, level}]}
    uploads       [{service, files}]   what each `up` uploaded (relative paths)

When a deployment reaches SUCCESS the previous SUCCESS ones become REMOVED, as on Railway.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tests.deploy.fakes._runtime import Invocation, UsageError, emit, fail, parse

NOT_LINKED = "No linked project found. Run railway link to connect to a project"
UNAUTHORIZED = "Unauthorized. Please login with `railway login`"
DEFAULT_UP_SCRIPT = ["BUILDING", "DEPLOYING", "SUCCESS"]


def stamp(number: int) -> str:
    return f"2025-01-01T{number // 3600:02d}:{number // 60 % 60:02d}:{number % 60:02d}Z"


def deployment(
    deployment_id: str, status: str, number: int, script: list[str] | None = None
) -> dict[str, Any]:
    """A deployment as the world stores it (``script``: statuses still to come)."""
    return {
        "id": deployment_id,
        "status": status,
        "createdAt": stamp(number),
        "meta": {},
        "script": script or [],
    }


def _link(inv: Invocation) -> tuple[str, dict[str, Any]] | None:
    links: dict[str, Any] = inv.world.get("links", {})
    for directory in (inv.cwd, *inv.cwd.parents):
        if str(directory) in links:
            return str(directory), links[str(directory)]
    return None


def _project(inv: Invocation) -> tuple[dict[str, Any], dict[str, Any]]:
    if not inv.world.get("logged_in", True):
        raise PermissionError(UNAUTHORIZED)
    found = _link(inv)
    if found is None:
        raise LookupError(NOT_LINKED)
    link = found[1]
    project = inv.world.get("projects", {}).get(link["project"])
    if project is None:
        raise LookupError("Project not found. Run `railway link` to link a valid project")
    return project, link


def _service(project: dict[str, Any], link: dict[str, Any], wanted: str | None) -> dict[str, Any]:
    for service in project.get("services", []):
        if wanted in (service["id"], service["name"]) or (
            wanted is None and service["id"] == link.get("service")
        ):
            return dict(service)
    if wanted is None:
        raise LookupError("No service linked and no service specified. Run `railway service` to link one")
    raise LookupError(f"Service '{wanted}' not found")


def _connection(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"edges": [{"node": {"id": item["id"], "name": item["name"]}} for item in items]}


def _whoami(inv: Invocation, rest: list[str]) -> int:
    parsed = parse(rest, boolean=["--json"])
    if not inv.world.get("logged_in", True):
        return fail(UNAUTHORIZED)
    if parsed.has("--json"):
        emit({"name": "Dev", "email": "dev@example.com"})
    else:
        print("Logged in as Dev (dev@example.com)")
    return 0


def _status(inv: Invocation, rest: list[str]) -> int:
    parse(rest, boolean=["--json"])
    project, _ = _project(inv)
    emit(
        {
            "id": project["id"],
            "name": project["name"],
            "environments": _connection(project["environments"]),
            "services": _connection(project["services"]),
        }
    )
    return 0


def _init(inv: Invocation, rest: list[str]) -> int:
    parsed = parse(rest, valued=["--name", "--workspace"], boolean=["--json"], aliases={"-n": "--name"})
    if not inv.world.get("logged_in", True):
        return fail(UNAUTHORIZED)
    if int(inv.world.get("workspaces", 1)) > 1 and not parsed.has("--workspace"):
        return fail("Multiple workspaces found. Specify one with --workspace (no terminal to ask)")
    number = inv.next_number()
    project_id = f"proj-{number}"
    name = parsed.value("--name") or f"random-name-{number}"
    environment = {"id": f"env-{number}", "name": "production"}
    inv.world.setdefault("projects", {})[project_id] = {
        "id": project_id,
        "name": name,
        "environments": [environment],
        "services": [],
    }
    inv.world.setdefault("links", {})[str(inv.cwd)] = {
        "project": project_id,
        "environment": environment["id"],
        "service": None,
    }
    inv.save()
    print(f"Created project {name} on Personal\nhttps://railway.com/project/{project_id}")
    return 0


def _link_command(inv: Invocation, rest: list[str]) -> int:
    parsed = parse(
        rest,
        valued=["--project", "--environment", "--service", "--workspace"],
        boolean=["--json"],
        aliases={"-p": "--project", "-e": "--environment", "-s": "--service"},
    )
    project = inv.world.get("projects", {}).get(parsed.value("--project"))
    if project is None:
        return fail("Project not found")
    environment = parsed.value("--environment") or project["environments"][0]["id"]
    inv.world.setdefault("links", {})[str(inv.cwd)] = {
        "project": project["id"],
        "environment": environment,
        "service": None,
    }
    inv.save()
    print(f"Project {project['name']} linked successfully!")
    return 0


def _add(inv: Invocation, rest: list[str]) -> int:
    parsed = parse(
        rest,
        optional_value=["--service"],
        valued=["--database", "--repo", "--image", "--variables"],
        boolean=["--json"],
        aliases={"-s": "--service", "-d": "--database", "-r": "--repo", "-i": "--image", "-v": "--variables"},
    )
    if not parsed.has("--service"):
        return fail("What do you need? (needs a terminal; pass --service, --database, --repo or --image)")
    project, link = _project(inv)
    number = inv.next_number()
    name = parsed.value("--service") or f"service-{number}"
    if any(service["name"] == name for service in project["services"]):
        return fail(f"A service named {name} already exists")
    service = {"id": f"svc-{number}", "name": name}
    project["services"].append(service)
    link["service"] = service["id"]
    inv.save()
    print(f'Successfully created the service "{name}" and linked to it')
    return 0


def _volume(inv: Invocation, rest: list[str]) -> int:
    # `railway volume [--service S] [--environment E] <subcommand> [flags]`
    head: list[str] = []
    while rest and rest[0].startswith("-"):
        head += rest[:2]  # every flag of `railway volume` itself takes a value
        rest = rest[2:]
    top = parse(head, valued=["--service", "--environment", "--project"], aliases={"-s": "--service"})
    if not rest or rest[0] not in ("add", "create", "new", "list", "ls"):
        raise UsageError("fake railway: only `volume add` and `volume list` are implemented")
    project, link = _project(inv)
    volumes = inv.world.setdefault("volumes", {})
    if rest[0] in ("list", "ls"):
        parse(rest[1:], boolean=["--json"])
        names = {service["id"]: service["name"] for service in project["services"]}
        emit(
            {
                "project": project["name"],
                "environment": "production",
                "volumes": [
                    {"id": f"vol-{sid}", "name": f"{names.get(sid, sid)}-volume", "mountPath": mount,
                     "serviceName": names.get(sid), "status": "READY"}
                    for sid, mount in sorted(volumes.items())
                ],
            }
        )  # fmt: skip
        return 0
    sub = parse(rest[1:], valued=["--mount-path"], boolean=["--json"], aliases={"-m": "--mount-path"})
    wanted = top.value("--service") or link.get("service")
    if not any(service["id"] == wanted for service in project["services"]):
        # `volume add` looks the service's name up by id and unwraps the answer: a name panics.
        print(
            "thread 'main' panicked at src/commands/volume.rs:834:10:\n"
            "called `Option::unwrap()` on a `None` value",
            file=sys.stderr,
        )
        return 101
    service = _service(project, link, wanted)
    if inv.world.get("volume_error"):
        return fail(str(inv.world["volume_error"]))
    mount = sub.value("--mount-path")
    if not mount or not mount.startswith("/"):
        return fail("Mount path must start with `/`")
    volumes = inv.world.setdefault("volumes", {})
    if service["id"] in volumes:
        return fail(f"A volume is already mounted on service {service['name']} in environment production")
    volumes[service["id"]] = mount
    inv.save()
    print(f"Volume created and mounted at {mount}")
    return 0


def _variables(inv: Invocation, rest: list[str]) -> int:
    parsed = parse(
        rest,
        valued=["--service", "--environment", "--set", "--set-from-stdin"],
        boolean=["--kv", "--json", "--skip-deploys"],
        aliases={"-s": "--service", "-e": "--environment", "-k": "--kv"},
    )
    project, link = _project(inv)
    service = _service(project, link, parsed.value("--service"))
    store: dict[str, Any] = inv.world.setdefault("variables", {}).setdefault(service["id"], {})
    for pair in parsed.values("--set"):
        key, sep, value = pair.partition("=")
        if not sep or not value:
            return fail(f"Invalid variable {key!r}: use KEY=VALUE")
        store[key] = {"value": value}
    if (stdin_key := parsed.value("--set-from-stdin")) is not None:
        secret = inv.stdin.rstrip("\n").rstrip("\r")
        if not secret:
            return fail("Empty value provided via stdin")
        store[stdin_key] = {"stdin_length": len(secret)}
    inv.save()
    if parsed.has("--json") and not parsed.values("--set") and stdin_key is None:
        emit({key: item.get("value", "*" * item.get("stdin_length", 0)) for key, item in store.items()})
    return 0


def _domain(inv: Invocation, rest: list[str]) -> int:
    parsed = parse(rest, valued=["--service", "--port"], boolean=["--json"], aliases={"-s": "--service"})
    project, link = _project(inv)
    service = _service(project, link, parsed.value("--service"))
    domains = inv.world.setdefault("domains", {})
    if service["id"] in domains:
        # Older CLIs print this text even with --json.
        print(f"Domains already exists on the service:\n🚀 https://{domains[service['id']]}")
        return 0
    host = f"{service['name']}-production.up.railway.app"
    domains[service["id"]] = host
    inv.save()
    emit({"domain": f"https://{host}"})
    return 0


def _files(root: Path) -> list[str]:
    """What `railway up` uploads: the folder less what .railwayignore names (folder prefixes here)."""
    ignore_file = root / ".railwayignore"
    ignored = (
        [line.strip().rstrip("/") + "/" for line in ignore_file.read_text().splitlines()]
        if ignore_file.is_file()
        else []
    )
    names = (str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())
    return sorted(
        name for name in names if not any(name.startswith(prefix) for prefix in ignored if prefix != "/")
    )


def _up(inv: Invocation, rest: list[str]) -> int:
    parsed = parse(
        rest,
        valued=["--service", "--environment", "--project", "--message", "--workspace"],
        boolean=["--detach", "--ci", "--json", "--yes", "--no-gitignore", "--path-as-root", "--verbose"],
        aliases={"-s": "--service", "-e": "--environment", "-d": "--detach", "-c": "--ci", "-y": "--yes"},
    )
    project, link = _project(inv)
    service = _service(project, link, parsed.value("--service"))
    found = _link(inv)
    assert found is not None
    root = Path(found[0])  # the CLI uploads the linked directory
    if not (root / "Dockerfile").is_file():
        return fail("fake railway: no Dockerfile in the uploaded directory")
    if inv.world.get("up_error"):
        return fail(str(inv.world["up_error"]))
    number = inv.next_number()
    script = list(inv.world.get("up_script") or DEFAULT_UP_SCRIPT)
    new = deployment(f"dep-{number:04d}", script[0], number, script[1:])
    inv.world.setdefault("deployments", {}).setdefault(service["id"], []).insert(0, new)
    inv.world.setdefault("uploads", []).append({"service": service["name"], "files": _files(root)})
    inv.save()
    logs_url = f"https://railway.com/project/{project['id']}/service/{service['id']}?id={new['id']}&"
    print(
        "Indexing...\nUploading..."
        if inv.world.get("up_quiet")
        else f"Indexing...\nUploading...\n  Build Logs: {logs_url}"
    )
    return 0


def advance(deployments: list[dict[str, Any]]) -> None:
    """Move every deployment one step along its script, oldest first, retiring replaced ones."""
    for item in reversed(deployments):
        if item.get("script"):
            item["status"] = item["script"].pop(0)
            if item["status"] == "SUCCESS":
                for other in deployments:
                    if other is not item and other["status"] == "SUCCESS":
                        other["status"] = "REMOVED"


def _deployment(inv: Invocation, rest: list[str]) -> int:
    if not rest or rest[0] not in ("list", "ls"):
        raise UsageError("fake railway: only `deployment list` is implemented")
    parsed = parse(
        rest[1:],
        valued=["--service", "--environment", "--limit"],
        boolean=["--json"],
        aliases={"-s": "--service", "-e": "--environment"},
    )
    project, link = _project(inv)
    service = _service(project, link, parsed.value("--service"))
    deployments = inv.world.setdefault("deployments", {}).setdefault(service["id"], [])
    advance(deployments)
    inv.save()
    emit([{key: item[key] for key in ("id", "status", "createdAt", "meta")} for item in deployments])
    return 0


def _logs(inv: Invocation, rest: list[str]) -> int:
    parsed = parse(
        rest,
        valued=["--service", "--environment", "--lines", "--filter"],
        boolean=["--json", "--build", "--deployment"],
        aliases={"-s": "--service", "-e": "--environment", "-n": "--lines", "-f": "--filter"},
    )
    project, link = _project(inv)
    service = _service(project, link, parsed.value("--service"))
    lines = inv.world.get("logs", {}).get(service["id"], [])
    count = int(parsed.value("--lines") or 0)
    for entry in lines[-count:] if count else lines:
        print(json.dumps(entry) if parsed.has("--json") else entry["message"])
    return 0


COMMANDS = {
    "whoami": _whoami,
    "status": _status,
    "init": _init,
    "link": _link_command,
    "add": _add,
    "volume": _volume,
    "variables": _variables,
    "domain": _domain,
    "up": _up,
    "deployment": _deployment,
    "logs": _logs,
}


def main() -> int:
    inv = Invocation("railway")
    args = list(inv.args)
    command = COMMANDS.get(args[0]) if args else None
    try:
        if command is None:
            raise UsageError(f"unrecognized subcommand '{args[0] if args else ''}'")
        return command(inv, args[1:])
    except UsageError as exc:
        return fail(f"error: {exc}", 2)
    except PermissionError as exc:
        return fail(str(exc))
    except LookupError as exc:
        return fail(str(exc))


if __name__ == "__main__":
    sys.exit(main())
