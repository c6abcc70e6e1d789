"""A fake ``flyctl`` (installed as ``flyctl`` and/or ``fly``), for the commands the Fly.io adapter runs.

The world file ``fly.json`` (all keys optional):
    logged_in       bool (default true)
    apps            {name: {"org": slug}}       apps the user can see
    taken           [name]                      names other accounts hold (create fails)
    releases        {app: [release]}            newest first, flyctl's JSON shape (Version, ImageRef, ...)
    machines        {app: [machine]}            flyctl's machine JSON (id, state, config.metadata, checks)
    status_script   {app: [[machine], ...]}     machines answered by successive `status` calls, one list
                                                per call, before falling back to ``machines``
    logs            {app: [line]}
    secrets         {app: {NAME: length}}       written by `secrets import --stage` (names, lengths only);
                                                `secrets list --json` prints their names
    volumes         {app: [volume]}             fly-go Volume JSON (id, name, state, attached_machine_id);
                                                a deploy whose fly.toml has [mounts] creates and attaches one
    deploy_error    text: `deploy` fails with it
    deploys         [{app, image, config}]      written by `deploy`: what each deploy shipped

Like flyctl, a deploy whose fly.toml has no [mounts] while a machine has a volume mounted asks whether to
detach it, and without a terminal (always, here) fails: `--yes` does not answer that question.

Shapes follow flyctl's ``--json`` output: `status` prints the app (ID, Name, Deployed, Status, Hostname,
Version, Organization, Machines); `releases` prints fly-go Release objects; `apps create` fails with
"Validation failed: Name has already been taken" for a taken name.
"""

from __future__ import annotations

import sys
import tomllib
from typing import Any

from tests.deploy.fakes._runtime import Invocation, UsageError, emit, fail, parse

ALIASES = {"-a": "--app", "-c": "--config", "-j": "--json", "-o": "--org", "-i": "--image", "-y": "--yes"}
NOT_LOGGED_IN = "Error: no access token available. Please login with 'flyctl auth login'"


def machine(
    machine_id: str,
    version: int,
    *,
    state: str = "started",
    checks: tuple[str, ...] = ("passing",),
    region: str = "iad",
    port: int = 3001,
) -> dict[str, Any]:
    """A machine as `flyctl status --json` prints it (one http service check per entry of ``checks``)."""
    return {
        "id": machine_id,
        "name": f"machine-{machine_id}",
        "state": state,
        "region": region,
        "image_ref": {"registry": "registry.fly.io", "repository": "app", "tag": f"deployment-{version}"},
        "config": {"metadata": {"fly_release_version": str(version), "fly_platform_version": "v2"}},
        "checks": [
            {"name": f"servicecheck-{i:02d}-http-{port}", "status": status, "output": ""}
            for i, status in enumerate(checks)
        ],
        "updated_at": "2025-01-01T00:00:00Z",
    }


def release(version: int, image: str, *, status: str = "complete") -> dict[str, Any]:
    """A release as `flyctl releases --json --image` prints it."""
    return {
        "ID": f"rel_{version:04d}",
        "Version": version,
        "Stable": status == "complete",
        "InProgress": False,
        "Reason": "deploy",
        "Description": "Deploy image",
        "Status": status,
        "User": {"Email": "dev@example.com"},
        "CreatedAt": f"2025-01-01T00:{version:02d}:00Z",
        "ImageRef": image,
    }


def _app_flag(inv: Invocation, parsed: Any) -> str:
    app = parsed.value("--app")
    if not app:
        raise UsageError("the config for your app is missing an app name, add an app field or pass --app")
    return str(app)


def _whoami(inv: Invocation, rest: list[str]) -> int:
    parse(rest, boolean=["--json"], aliases=ALIASES)
    if not inv.world.get("logged_in", True):
        return fail(NOT_LOGGED_IN)
    emit({"email": "dev@example.com"})
    return 0


def _apps(inv: Invocation, rest: list[str]) -> int:
    if not inv.world.get("logged_in", True):
        return fail(NOT_LOGGED_IN)
    sub, rest = (rest[0], rest[1:]) if rest else ("", [])
    apps: dict[str, Any] = inv.world.setdefault("apps", {})
    if sub in ("list", "ls"):
        parse(rest, boolean=["--json", "--quiet"], valued=["--org"], aliases=ALIASES)
        emit(
            [
                {
                    "ID": name,
                    "Name": name,
                    "Status": "deployed" if inv.world.get("releases", {}).get(name) else "pending",
                    "Deployed": bool(inv.world.get("releases", {}).get(name)),
                    "Hostname": f"{name}.fly.dev",
                    "Organization": {"Slug": info.get("org", "personal")},
                }
                for name, info in sorted(apps.items())
            ]
        )
        return 0
    if sub == "create":
        parsed = parse(
            rest,
            boolean=["--json", "--generate-name", "--yes", "--save"],
            valued=["--org", "--name", "--network"],
            aliases=ALIASES,
        )
        name = parsed.positionals[0] if parsed.positionals else parsed.value("--name")
        if not name:
            return fail("Error: an app name is required without a TTY")
        if name in apps or name in inv.world.get("taken", []):
            return fail("Error: Validation failed: Name has already been taken")
        org = parsed.value("--org") or "personal"
        apps[name] = {"org": org}
        inv.save()
        emit({"ID": name, "Name": name, "Status": "pending", "Organization": {"Slug": org}})
        return 0
    raise UsageError(f'unknown command {sub!r} for "flyctl apps"')


def _secrets(inv: Invocation, rest: list[str]) -> int:
    sub, rest = (rest[0], rest[1:]) if rest else ("", [])
    if sub in ("list", "ls"):
        parsed = parse(rest, boolean=["--json"], valued=["--app", "--config"], aliases=ALIASES)
        app = _app_flag(inv, parsed)
        if not inv.world.get("logged_in", True):
            return fail(NOT_LOGGED_IN)
        if app not in inv.world.get("apps", {}):
            return fail(f'Error: Could not find App "{app}"')
        names = sorted(inv.world.get("secrets", {}).get(app, {}))
        emit([{"name": name, "digest": f"digest-{name.lower()}", "status": "Deployed"} for name in names])
        return 0
    if sub != "import":
        raise UsageError(f'unknown command {sub!r} for "flyctl secrets"')
    parsed = parse(rest, boolean=["--stage", "--detach"], valued=["--app", "--config"], aliases=ALIASES)
    app = _app_flag(inv, parsed)
    if app not in inv.world.get("apps", {}):
        return fail(f'Error: Could not find App "{app}"')
    names: dict[str, int] = {}
    for line in inv.stdin.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            return fail(f"Error: Secrets must be provided as NAME=VALUE pairs ({key} is invalid)")
        value = value.lstrip(" ")
        if value.startswith('"') and value.endswith('"') and len(value) >= 2:
            value = value[1:-1]
        names[key.strip()] = len(value)
    if not names:
        return fail("Error: requires at least one SECRET=VALUE pair")
    inv.world.setdefault("secrets", {}).setdefault(app, {}).update(names)
    inv.save()
    if not parsed.has("--stage"):
        print("Updating machines with the new secrets")
    return 0


def _deploy(inv: Invocation, rest: list[str]) -> int:
    parsed = parse(
        rest,
        boolean=["--remote-only", "--local-only", "--yes", "--detach", "--now", "--ha", "--no-cache"],
        valued=["--app", "--config", "--dockerfile", "--image", "--region", "--strategy", "--primary-region"],
        aliases=ALIASES,
    )
    if not inv.world.get("logged_in", True):
        return fail(NOT_LOGGED_IN)
    app = _app_flag(inv, parsed)
    if app not in inv.world.get("apps", {}):
        return fail(f'Error: Could not find App "{app}"')
    config_path = inv.cwd / (parsed.value("--config") or "fly.toml")
    if not config_path.is_file():
        return fail(f"Error: the config file {config_path} does not exist")
    try:
        config = tomllib.loads(config_path.read_text())
    except tomllib.TOMLDecodeError as exc:
        return fail(f"Error: failed loading app config from {config_path}: {exc}")
    image = parsed.value("--image")
    if image is None:
        dockerfile = inv.cwd / (parsed.value("--dockerfile") or "Dockerfile")
        if not dockerfile.is_file():
            return fail(f"Error: dockerfile '{dockerfile}' not found")
        if not parsed.has("--remote-only"):
            return fail("Error: failed to fetch an image or build from source: no local docker daemon")
    if image is None:
        print("==> Building image with Depot\n--> build step 1/3 done", flush=True)
    if inv.world.get("deploy_error"):
        return fail(str(inv.world["deploy_error"]))
    mounts = config.get("mounts")
    mounts = mounts[0] if isinstance(mounts, list) and mounts else mounts
    current = inv.world.setdefault("machines", {}).get(app) or []
    if not mounts:
        for item in current:
            if item.get("config", {}).get("mounts"):
                print(
                    f"Warning! machine {item['id']} [app] has a volume mounted but app config does not specify "
                    "a volume.\nThis usually indicates a misconfiguration.",
                    file=sys.stderr,
                )
                return fail("Error: yes flag must be specified when not running interactively")
    releases: list[dict[str, Any]] = inv.world.setdefault("releases", {}).setdefault(app, [])
    version = max((int(r["Version"]) for r in releases), default=0) + 1
    image = image or f"registry.fly.io/{app}:deployment-{version:04d}"
    releases.insert(0, release(version, image))
    port = int((config.get("http_service") or {}).get("internal_port") or 8080)
    machines = inv.world.setdefault("machines", {}).get(app) or [machine("m1", version, port=port)]
    for item in machines:
        item.setdefault("config", {}).setdefault("metadata", {})["fly_release_version"] = str(version)
        item["state"] = "started"
        if mounts:
            volumes = inv.world.setdefault("volumes", {}).setdefault(app, [])
            volume = next((v for v in volumes if v["name"] == mounts["source"]), None)
            if volume is None:
                volume = {"id": f"vol_{len(volumes) + 1}", "name": mounts["source"], "state": "created"}
                volumes.append(volume)
            volume["attached_machine_id"] = item["id"]
            item["config"]["mounts"] = [{"volume": volume["id"], "path": mounts["destination"]}]
        for check in item.get("checks", []):
            check["status"] = "passing"
    inv.world["machines"][app] = machines
    inv.world.setdefault("deploys", []).append({"app": app, "image": image, "config": config})
    inv.save()
    if parsed.value("--image") is None:
        print("--> Pushing image done")
    print(f"image: {image}\n\nVisit your newly deployed app at https://{app}.fly.dev/")
    return 0


def _status(inv: Invocation, rest: list[str]) -> int:
    parsed = parse(rest, boolean=["--json", "--all"], valued=["--app", "--config"], aliases=ALIASES)
    if not inv.world.get("logged_in", True):
        return fail(NOT_LOGGED_IN)
    app = _app_flag(inv, parsed)
    if app not in inv.world.get("apps", {}):
        return fail(f'Error: Could not find App "{app}"')
    script = inv.world.setdefault("status_script", {}).get(app) or []
    if script:
        machines = script.pop(0)
        inv.save()
    else:
        machines = inv.world.get("machines", {}).get(app, [])
    releases = inv.world.get("releases", {}).get(app, [])
    emit(
        {
            "ID": app,
            "Name": app,
            "Deployed": bool(releases),
            "Status": "deployed" if releases else "pending",
            "Hostname": f"{app}.fly.dev",
            "Version": max((int(r["Version"]) for r in releases), default=0),
            "AppURL": "",
            "Organization": {"Slug": inv.world["apps"][app].get("org", "personal")},
            "PlatformVersion": "machines",
            "Machines": machines,
        }
    )
    return 0


def _releases(inv: Invocation, rest: list[str]) -> int:
    parsed = parse(rest, boolean=["--json", "--image"], valued=["--app", "--config"], aliases=ALIASES)
    app = _app_flag(inv, parsed)
    if app not in inv.world.get("apps", {}):
        return fail(f'Error: Could not find App "{app}"')
    emit(inv.world.get("releases", {}).get(app, []))
    return 0


def _logs(inv: Invocation, rest: list[str]) -> int:
    parsed = parse(
        rest,
        boolean=["--no-tail", "--json"],
        valued=["--app", "--config", "--instance", "--region"],
        aliases={**ALIASES, "-n": "--no-tail", "-i": "--instance", "-r": "--region"},
    )
    app = _app_flag(inv, parsed)
    if not parsed.has("--no-tail"):
        return fail("fake flyctl: `logs` without --no-tail would stream forever")
    for line in inv.world.get("logs", {}).get(app, []):
        print(line)
    return 0


def _volumes(inv: Invocation, rest: list[str]) -> int:
    sub, rest = (rest[0], rest[1:]) if rest else ("", [])
    if sub not in ("list", "ls"):
        raise UsageError(f'unknown command {sub!r} for "flyctl volumes"')
    parsed = parse(rest, boolean=["--json", "--all"], valued=["--app", "--config"], aliases=ALIASES)
    app = _app_flag(inv, parsed)
    if not inv.world.get("logged_in", True):
        return fail(NOT_LOGGED_IN)
    if app not in inv.world.get("apps", {}):
        return fail(f'Error: Could not find App "{app}"')
    emit(inv.world.get("volumes", {}).get(app, []))
    return 0


COMMANDS = {
    "auth": None,
    "volumes": _volumes,
    "volume": _volumes,
    "apps": _apps,
    "secrets": _secrets,
    "deploy": _deploy,
    "status": _status,
    "releases": _releases,
    "logs": _logs,
}


def main() -> int:
    inv = Invocation("fly")
    args = list(inv.args)
    try:
        if args[:2] == ["auth", "whoami"]:
            return _whoami(inv, args[2:])
        command = COMMANDS.get(args[0]) if args else None
        if command is None:
            raise UsageError(f'unknown command {" ".join(args[:2])!r} for "flyctl"')
        return command(inv, args[1:])
    except UsageError as exc:
        return fail(f"Error: {exc}", 1)


if __name__ == "__main__":
    sys.exit(main())
