"""A stand-in for the `lightsailctl` plugin, run from a test's PATH by the fake `aws`.

It reads the push request from stdin, records it in FAKE_AWS_LOG, numbers images per service and label the
way Lightsail does (``:service.label.1``, ``.2``, ... kept in FAKE_AWS_LOG + ".versions.json"), and prints
what the real plugin prints after a push. FAKE_LIGHTSAILCTL_FAIL makes the push fail with that message.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path


def main() -> int:
    request = json.loads(sys.stdin.read() or "{}")
    log = os.environ.get("FAKE_AWS_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(
                json.dumps({"program": "lightsailctl", "argv": sys.argv[1:], "input": request}) + "\n"
            )
    if sys.argv[1:] != ["--plugin", "--input-stdin"]:
        print("lightsailctl: run it through `aws lightsail push-container-image`", file=sys.stderr)
        return 2
    failure = os.environ.get("FAKE_LIGHTSAILCTL_FAIL")
    if failure:
        print(failure, file=sys.stderr)
        return 1
    payload = request.get("payload", {})
    service, label, image = payload.get("service"), payload.get("label"), payload.get("image")
    versions_file = Path(f"{log}.versions.json") if log else None
    versions = json.loads(versions_file.read_text()) if versions_file and versions_file.exists() else {}
    key = f"{service}.{label}"
    versions[key] = versions.get(key, 0) + 1
    if versions_file:
        versions_file.write_text(json.dumps(versions))
    digest = hashlib.sha256(f"{image}{versions[key]}".encode()).hexdigest()
    print(f"{digest[:12]}: Pushed")
    print(f"Digest: sha256:{digest}")
    print(f'Image "{key}.{versions[key]}" registered.')
    print(f'Refer to this image as ":{key}.{versions[key]}" in deployments.')
    return 0


if __name__ == "__main__":
    sys.exit(main())
