"""When the page registers its service worker (web/offline-reload.js), whose install downloads and stores the
whole build again: once the first sync is over, so the two do not compete for the network and the CPU.
Driven in Node.js with a stand-in client and a clock of its own (tests/js/first_sync_over.mjs): each list
says whether it was over after each step of the scenario."""

from __future__ import annotations

from typing import Any

import pytest

from .support import run_node_script


@pytest.fixture(scope="module")
def seen() -> dict[str, Any]:
    seen: dict[str, Any] = run_node_script("first_sync_over.mjs")
    return seen


def test_a_first_sync_is_over_once_connected_not_at_the_status_before_it_starts(seen: dict[str, Any]) -> None:
    # disconnected (the worker's status at ready), connecting, syncing, syncing, connected
    assert seen["firstSync"] == [False, False, False, False, True]
    assert seen["paused"] == [False, True]  # "disconnected" once sync ran: paused


def test_no_sync_to_wait_for_is_over_at_once(seen: dict[str, Any]) -> None:
    assert seen["disabled"] == [True] and seen["offline"] == [True] and seen["failed"] == [True]


def test_a_sync_that_never_settles_is_waited_for_a_while(seen: dict[str, Any]) -> None:
    assert seen["stuck"] == [False, False, True]  # connecting, half the time limit, past it
    # Still receiving past the time limit: waited for until done; once it stops receiving, not any more.
    assert seen["long"] == [False, False, False, False, False, True]
    assert seen["stalled"] == [False, False, True]
