"""A bounded, fair queue in front of the password-hashing threads.

argon2 is meant to be slow, so a burst of sign-ins is a queue. Unbounded, that queue made a real sign-in wait
behind every junk one (40 of them: about 6 s). Here at most ``waiting`` checks wait for one of the ``workers``
threads, and one key (the client address) may have at most ``per_key`` checks waiting or running; past either
bound the caller gets ``QueueFull`` at once, with a suggested wait.

Fairness between keys: the next check to run is one of the key served longest ago (a key with nothing in hand
counts as never served), so a sign-in waits for the checks running and at most one waiting check of each
other busy address, not for a burst. When the queue is full, a newcomer that was not refused itself a moment
ago gets in by refusing someone else's newest waiting check (``_make_room``): one of a key refused a moment
ago (a flood keeps asking for more than its share, and so keeps being refused), else one of a key with two
more waiting than the newcomer. A key asking one check at a time is never pushed out, so floods from many
addresses can neither keep a sign-in out nor push it out.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["HashQueue", "QueueFull"]

T = TypeVar("T")


#: How long a key refused a check counts as flooding, and how many such keys are remembered.
_REFUSED_MEMORY = 10.0
_REFUSED_KEYS = 10_000
#: How much lower the hashing threads' CPU priority is than the rest of the process (Linux nice steps).
_NICE = 10


def _lower_priority() -> None:
    """Run this hashing thread (and the lane threads argon2 starts from it) at a lower CPU priority: on a
    small machine a burst of hashing otherwise starves the event loop, and every request waits, even the
    refusals that should come at once. Linux sets niceness per thread; elsewhere this does nothing."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _NICE)


class QueueFull(Exception):
    """No room for another password check; ``per_key`` says whether the caller's own share is what is full."""

    def __init__(self, retry_after: float, *, per_key: bool) -> None:
        super().__init__("the password-check queue is full")
        self.retry_after = retry_after
        self.per_key = per_key


@dataclass(slots=True, eq=False)
class _Job:
    key: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    started: float = 0.0
    queued: bool = field(default=True)


class HashQueue:
    def __init__(self, workers: int, *, waiting: int, per_key: int) -> None:
        self.workers = max(1, int(workers))
        self.waiting = max(0, int(waiting))
        self.per_key = max(1, int(per_key))
        self._pool: ThreadPoolExecutor | None = None
        self._queues: dict[str, deque[_Job]] = {}
        self._per_key: dict[str, int] = {}
        # When each key with checks in hand was last served (a turn number); forgotten when it has none.
        self._served: dict[str, int] = {}
        self._turn = 0
        # Keys refused (or pushed out) lately, when: a flood's mark (see _make_room). Bounded.
        self._refused: OrderedDict[str, float] = OrderedDict()
        self._queued = 0
        self._running = 0
        self._seconds = 0.1  # moving average of one check's duration, for Retry-After

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def retry_after(self) -> float:
        """Seconds until the queue has probably drained (at least 1)."""
        rounds = (self._queued + self._running) / self.workers + 1
        return max(1.0, math.ceil(rounds * self._seconds))

    async def run(self, key: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a hashing thread, after the checks queued before it (fairly, by key)."""
        if self._per_key.get(key, 0) >= self.per_key:
            self._note_refused(key)
            raise QueueFull(self.retry_after(), per_key=True)
        if self._running >= self.workers and self._queued >= self.waiting and not self._make_room(key):
            self._note_refused(key)
            raise QueueFull(self.retry_after(), per_key=False)
        loop = asyncio.get_running_loop()
        job = _Job(key, fn, args, loop, loop.create_future())
        # Retrieved even when its caller went away meanwhile (no "exception never retrieved" warning).
        job.future.add_done_callback(lambda f: None if f.cancelled() else f.exception())
        self._per_key[key] = self._per_key.get(key, 0) + 1
        self._queues.setdefault(key, deque()).append(job)
        self._queued += 1
        self._dispatch()
        try:
            result: T = await asyncio.shield(job.future)
        except asyncio.CancelledError:
            if job.queued:  # never started: take it out (a running check finishes and is dropped)
                self._unqueue(job)
            raise
        return result

    def _note_refused(self, key: str) -> None:
        refused = self._refused
        refused[key] = time.monotonic()
        refused.move_to_end(key)
        while len(refused) > _REFUSED_KEYS:
            refused.popitem(last=False)

    def _refused_recently(self, key: str) -> bool:
        when = self._refused.get(key)
        return when is not None and time.monotonic() - when < _REFUSED_MEMORY

    def _make_room(self, key: str) -> bool:
        """Refuse one waiting check so that ``key``'s may wait instead, unless ``key`` was itself refused a
        moment ago (a flood does not get to push others out). The check refused is the newest of a key that
        was refused a moment ago (a flood: it keeps asking for more than its share), the one with the most
        waiting; failing that, of a key with at least two more waiting than ``key``. A key that asks one
        check at a time is never pushed out by a newcomer."""
        if self._refused_recently(key):
            return False
        mine = len(self._queues.get(key, ()))
        flooding = [
            (len(queue), place, other)
            for place, (other, queue) in enumerate(self._queues.items())
            if self._refused_recently(other)
        ]
        longer = [
            (len(queue), place, other)
            for place, (other, queue) in enumerate(self._queues.items())
            if len(queue) >= mine + 2
        ]
        if not flooding and not longer:
            return False
        _, _, victim_key = max(flooding or longer)  # the longest; on a tie, the one that came last
        victim = self._queues[victim_key][-1]
        self._unqueue(victim)
        self._note_refused(victim_key)
        if not victim.future.done():
            victim.future.set_exception(QueueFull(self.retry_after(), per_key=False))
        return True

    def _unqueue(self, job: _Job) -> None:
        queue = self._queues.get(job.key)
        if queue is not None and job in queue:
            queue.remove(job)
            if not queue:
                del self._queues[job.key]
            job.queued = False
            self._queued -= 1
            self._release(job.key)

    def _release(self, key: str) -> None:
        left = self._per_key.get(key, 1) - 1
        if left > 0:
            self._per_key[key] = left
        else:
            self._per_key.pop(key, None)
            self._served.pop(key, None)

    def _dispatch(self) -> None:
        while self._running < self.workers and self._queues:
            # The key served longest ago (or never, while it has checks in hand) goes first: a key whose
            # check just ran waits behind every other key with one waiting.
            key = min(self._queues, key=lambda k: self._served.get(k, -1))
            queue = self._queues[key]
            job = queue.popleft()
            if not queue:
                del self._queues[key]
            self._turn += 1
            self._served[key] = self._turn
            job.queued = False
            self._queued -= 1
            self._running += 1
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self.workers, thread_name_prefix="offline-argon2", initializer=_lower_priority
                )
            job.started = time.monotonic()
            done = self._pool.submit(job.fn, *job.args)
            done.add_done_callback(lambda f, job=job: self._from_thread(job, f))  # type: ignore[misc]

    def _from_thread(self, job: _Job, done: Future[Any]) -> None:
        try:
            job.loop.call_soon_threadsafe(self._finished, job, done)
        except RuntimeError:  # the loop is closed: nobody waits for this any more
            self._running -= 1
            self._release(job.key)

    def _finished(self, job: _Job, done: Future[Any]) -> None:
        self._running -= 1
        self._release(job.key)
        self._seconds = 0.8 * self._seconds + 0.2 * (time.monotonic() - job.started)
        if not job.future.done():
            error = done.exception()
            if error is not None:
                job.future.set_exception(error)
            else:
                job.future.set_result(done.result())
        self._dispatch()
