"""Run every benchmark and print one JSON object to stdout (progress goes to stderr)."""

from __future__ import annotations

import argparse
import json
import sys

from bench import (
    backup,
    browser,
    catch_up,
    cli_startup,
    core,
    cross_record_rules,
    growth,
    load,
    machine,
    node_identity,
    richtext,
    sign_in,
    store,
    sync,
    trust_boundary,
)

SUITES = {
    "machine": machine.run,  # first: the others are read against it
    "core": core.run,
    "store": store.run,
    "growth": growth.run,
    "richtext": richtext.run,
    "cli": cli_startup.run,
    "sync": sync.run,
    "catch_up": catch_up.run,
    "load": load.run,
    "trust_boundary": trust_boundary.run,
    "browser": browser.run,
    "sign_in": sign_in.run,
    "backup": backup.run,
    "cross_record_rules": cross_record_rules.run,
    "node_identity": node_identity.run,
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("suites", nargs="*", help=f"suites to run: {', '.join(SUITES)} (default all)")
    args = parser.parse_args()
    figures: dict[str, object] = {"python": sys.version.split()[0]}
    unknown = [name for name in args.suites if name not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s) {unknown}; choose from {list(SUITES)}")
    for name in args.suites or list(SUITES):
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        figures[name] = SUITES[name]()
    json.dump(figures, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
