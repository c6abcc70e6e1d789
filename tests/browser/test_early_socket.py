"""The worker opens the sync connection while Python starts (web/early-socket.js) and hands it to the sync
engine's first ``new WebSocket(url)``: driven in Node.js with a stand-in WebSocket (tests/js/early_socket.mjs).
Nothing the server sends is lost: the new owner hears "open" first (again, if it had passed), then every
message in order; a socket the server spoke on (or closed) before the hand-over is never handed over."""

from __future__ import annotations

from typing import Any

import pytest

from .support import run_node_script

URL = "ws://127.0.0.1:3001/offline-sync"


@pytest.fixture(scope="module")
def seen() -> dict[str, Any]:
    seen: dict[str, Any] = run_node_script("early_socket.mjs")
    return seen


def test_an_open_socket_is_handed_over_and_nothing_it_receives_is_lost(seen: dict[str, Any]) -> None:
    opened = seen["openBefore"]
    assert opened["same"] and opened["sockets"] == 1 and not opened["earlyClosed"]
    heard = ["open", "message:handshake-response", "message:batch-1", "message:batch-2", "close"]
    assert opened["heard"] == heard
    assert opened["restored"]  # the browser's own WebSocket again, for every later connection
    assert opened["reports"] == ["opened", "handed-over"]  # (the worker's startup stages, for the bench)


def test_a_socket_still_connecting_is_handed_over_and_opens_once(seen: dict[str, Any]) -> None:
    connecting = seen["connecting"]
    assert connecting["same"] and connecting["sockets"] == 1
    assert connecting["heard"] == ["open", "message:handshake-response"]
    assert connecting["reports"] == ["handed-over"]


@pytest.mark.parametrize("case", ["heardFirst", "closedFirst", "tooLate"])
def test_a_socket_that_is_not_as_new_is_closed_and_a_new_one_made(seen: dict[str, Any], case: str) -> None:
    # The server spoke before any handshake (an error), closed it, or may be about to drop it (it waited
    # longer than the hand-over allows): the sync engine gets a socket of its own.
    result = seen[case]
    assert not result["same"] and result["sockets"] == 2 and result["earlyClosed"] and result["restored"]
    assert result.get("heard", []) == []
    assert result.get("fresh", URL) == URL
    assert result["reports"][-1] == "replaced"


def test_only_the_first_connection_to_the_same_url_gets_it(seen: dict[str, Any]) -> None:
    assert seen["otherUrl"]["fresh"] == "ws://127.0.0.1:3001/other" and seen["otherUrl"]["earlyClosed"]
    second = seen["second"]
    assert second["firstSame"] and not second["secondSame"] and not second["earlyClosed"]


def test_an_unclaimed_or_discarded_socket_is_closed(seen: dict[str, Any]) -> None:
    for case in ("unclaimed", "discarded"):
        assert seen[case]["earlyClosed"] and seen[case]["restored"] and seen[case]["sockets"] == 1, case
        assert seen[case]["reports"][-1:] == ["closed"], case
    assert seen["discarded"]["reports"] == ["closed"]  # (discarding twice closes once)
    # Once handed over, the socket is its new owner's: discarding it then changes nothing.
    after = seen["discardedAfter"]
    assert not after["earlyClosed"] and after["reports"] == ["opened", "handed-over"]
