"""A bounded, fair queue in front of the password-hashing threads.

argon2 is meant to be slow, so a burst of sign-ins is a queue. Unbounded, that queue made a real sign-in wait
behind every junk one (40 of them: about 6 s). Here at most ``waiting`` checks wait for one of the ``workers``
threads, and one key (the client address) may have at most ``per_key`` checks waiting or running; past either
bound the caller gets ``QueueFull`` at once, with a suggested wait. The next check to run is always one of
the key served longest ago (a key with nothing in hand counts as never served), so one address's burst
delays another address's sign-in by at most the checks running and one waiting check of each other busy
address; and when the queue is full, a key with nothing waiting takes the place of the newest check of a key
with two or more waiting (which is refused), so many addresses filling their shares cannot keep a new one out.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["HashQueue", "QueueFull"]

T = TypeVar("T")


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
            raise QueueFull(self.retry_after(), per_key=True)
        if self._running >= self.workers and self._queued >= self.waiting and not self._make_room(key):
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

    def _make_room(self, key: str) -> bool:
        """Refuse the newest waiting check of the key with the most waiting, when that is at least two more
        than ``key`` has: many addresses each filling their share cannot keep a new one out."""
        mine = len(self._queues.get(key, ()))
        candidates = [
            (len(queue), place, other)
            for place, (other, queue) in enumerate(self._queues.items())
            if len(queue) >= mine + 2
        ]
        if not candidates:
            return False
        _, _, victim_key = max(candidates)  # the longest; on a tie, the one that came last
        victim = self._queues[victim_key][-1]
        self._unqueue(victim)
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
