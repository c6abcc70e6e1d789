"""Property: whatever the devices' clocks say, no write disappears.

3 to 5 replicas with clocks up to 15 minutes off either way sync through a lossy link (a `ChaosProxy` that
drops and duplicates frames) to an in-process server on the memory store, going offline and online at
random while they insert records and increment a shared counter. Once the link calms down and everyone is
back, every replica holds the same records, and every write any replica made is either in them or listed by
`app.sync.rejected()` on the replica that made it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offline import create_app, op
from offline.store import App
from server_runtime import MemoryServerStore, create_production_server
from tests.support.chaos_proxy import ChaosProxy
from tests.sync.test_integration import GENERAL, snapshot, wait_for

SHARED = "shared-counter"
CLIENT = {"backoff_initial": 0.05, "backoff_max": 0.5, "ack_timeout": 1.0, "handshake_timeout": 2.0}
SETTLE = 90.0

# One step of the plan: (replica, action); actions: write a new record, increment the shared counter, or
# flip between offline and online.
steps = st.lists(
    st.tuples(st.integers(0, 4), st.sampled_from(["insert", "insert", "increment", "toggle"])),
    min_size=5,
    max_size=25,
)


@contextlib.asynccontextmanager
async def lossy_server(seed: int) -> AsyncIterator[ChaosProxy]:
    """An in-process server behind a proxy that drops and duplicates frames (sync URL: proxy.url + PATH)."""
    store = MemoryServerStore()
    await store.set_schema(GENERAL)
    server = create_production_server(
        store=store, port=0, host="127.0.0.1", sync_options={"limits": {"ack_timeout": 1.0}}
    )
    url = await server.start()
    try:
        async with ChaosProxy(
            url.replace("http://", "ws://", 1), seed=seed, drop=0.05, duplicate=0.1, reorder=0.0
        ) as proxy:
            yield proxy
    finally:
        await server.stop()
        with contextlib.suppress(Exception):
            await store.close()


def skewed(skew_ms: int) -> Any:
    return lambda: time.time_ns() // 1_000_000 + skew_ms


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    skews=st.lists(st.integers(-900_000, 900_000), min_size=3, max_size=5),
    plan=steps,
    offline_at_start=st.lists(st.booleans(), min_size=5, max_size=5),
    seed=st.integers(0, 2**16),
)
def test_no_write_disappears_whatever_the_clocks(
    tmp_path_factory: Any,
    skews: list[int],
    plan: list[tuple[int, str]],
    offline_at_start: list[bool],
    seed: int,
) -> None:
    folder: Path = tmp_path_factory.mktemp("replicas")

    async def scenario() -> None:
        async with lossy_server(seed) as proxy:
            url = proxy.url + "/offline-sync"
            apps = [
                create_app(
                    GENERAL,
                    sync={"url": url, **CLIENT},
                    path=str(folder / f"r{i}.db"),
                    now=skewed(skew),
                )
                for i, skew in enumerate(skews)
            ]
            inserted: list[set[str]] = [set() for _ in apps]
            increments = [0 for _ in apps]
            online = [False for _ in apps]
            try:
                # The shared record exists everywhere before the increments (an increment needs it).
                apps[0].items.insert({"id": SHARED, "title": "shared"})
                for app in apps:
                    await app.sync.connect(wait=False)
                await wait_for(
                    lambda: all(a.items.find_by_id(SHARED) for a in apps), "the shared record", SETTLE
                )
                for i, app in enumerate(apps):
                    if offline_at_start[i]:
                        await app.sync.disconnect()
                    else:
                        online[i] = True
                for index, (who, action) in enumerate(plan):
                    i = who % len(apps)
                    app = apps[i]
                    if action == "insert":
                        record = app.items.insert({"title": f"r{i}-{index}"})
                        inserted[i].add(record["id"])
                    elif action == "increment":
                        app.items.update(SHARED, {"count": op.increment(1)})
                        increments[i] += 1
                    elif online[i]:
                        await app.sync.disconnect()
                        online[i] = False
                    else:
                        await app.sync.connect(wait=False)
                        online[i] = True
                    await asyncio.sleep(0.01)
                proxy.calm()
                for i, app in enumerate(apps):
                    if not online[i]:
                        await app.sync.connect(wait=False)
                await settle(apps)

                state = {r["id"]: r for r in apps[0].items.all().fetch()}
                for i, app in enumerate(apps):
                    refused = {entry["recordId"]: entry for entry in app.sync.rejected()}
                    lost = [
                        record_id
                        for record_id in inserted[i]
                        if record_id not in state and record_id not in refused
                    ]
                    assert not lost, f"replica {i} (clock {skews[i]} ms off) lost {lost}"
                refused_increments = sum(
                    1 for app in apps for entry in app.sync.rejected() if entry["recordId"] == SHARED
                )
                assert state[SHARED]["count"] == sum(increments) - refused_increments
            finally:
                for app in apps:
                    with contextlib.suppress(Exception):
                        await app.sync.disconnect()
                    app.close()

    asyncio.run(scenario())


async def settle(apps: list[App]) -> None:
    """Every replica synced, and all holding the same records."""
    for app in apps:
        await app.sync.wait_until_synced(SETTLE)

    def same() -> bool:
        first = snapshot(apps[0])
        return all(snapshot(other) == first for other in apps[1:]) and all(a.sync.pending == 0 for a in apps)

    await wait_for(
        same, lambda: "convergence: " + json.dumps([snapshot(a) for a in apps], default=str)[:2000], SETTLE
    )
