"""A stand-in for the AWS CLI's `aws lightsail push-container-image`, run as `aws` from a test's PATH.

Like the real CLI it hands the push to the `lightsailctl` plugin (``--plugin --input-stdin`` with a JSON
request on stdin) and relays its output, and it fails with the CLI's "plugin was not found" message when
lightsailctl is not on PATH. Every invocation is appended to the JSON-lines file named by FAKE_AWS_LOG.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

PLUGIN_MISSING = (
    "The Lightsail Control (lightsailctl) plugin was not found. To download and install it, see "
    "https://docs.aws.amazon.com/lightsail/latest/userguide/amazon-lightsail-install-software.html"
)


def record(entry: dict[str, object]) -> None:
    log = os.environ.get("FAKE_AWS_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")


def option(args: list[str], name: str) -> str | None:
    if name in args:
        index = args.index(name)
        if index + 1 < len(args):
            return args[index + 1]
    return None


def main() -> int:
    args = sys.argv[1:]
    record({"program": "aws", "argv": args})
    if args[:2] != ["lightsail", "push-container-image"]:
        print(f"fake aws: unsupported command: {' '.join(args[:3])}", file=sys.stderr)
        return 252
    missing = [flag for flag in ("--service-name", "--label", "--image") if option(args, flag) is None]
    if missing:
        print(f"aws: error: the following arguments are required: {', '.join(missing)}", file=sys.stderr)
        return 252
    plugin = shutil.which("lightsailctl")
    if plugin is None:
        print(PLUGIN_MISSING, file=sys.stderr)
        return 255
    request = {
        "inputVersion": "1",
        "operation": "PushContainerImage",
        "payload": {
            "service": option(args, "--service-name"),
            "label": option(args, "--label"),
            "image": option(args, "--image"),
        },
        "configuration": {"region": option(args, "--region") or os.environ.get("AWS_DEFAULT_REGION")},
    }
    done = subprocess.run(
        [plugin, "--plugin", "--input-stdin"], input=json.dumps(request), capture_output=True, text=True
    )
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
