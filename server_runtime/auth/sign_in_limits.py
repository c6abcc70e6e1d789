"""Who may try a password now: failed sign-in limits that hold under concurrency and cannot lock the owner out.

An attempt is counted before its password is checked (``reserve``), in the same step as the check of the
limits (no ``await`` between them), so a burst of concurrent requests cannot all pass a check that counts only
finished failures. A correct password takes its reservation back (``Reservation.succeeded``); a wrong one
leaves it counted; a request that never reached the check (the argon2 queue was full) takes it back too.

Three windows, each ``RateLimits``' setting:

- per (account, address): ``account_attempts`` failures; what stops one address guessing one account;
- per address: ``address_attempts`` failures over all accounts; what stops one address trying many;
- per account over all addresses: ``account_total_attempts`` failures; what stops guessing spread over many
  addresses. It applies only to addresses that never signed in to that account: an address that did (in this
  process's memory, since its start) keeps its own per-(account, address) allowance, so an attacker elsewhere
  cannot lock the owner out. The owner on a new device at a new address during such an attack waits like the
  attacker (429 with ``Retry-After``), the one case a distributed attack can still cost it.

A device that sends the known-device token a past sign-in gave it (``devices``) is counted in a window of its
own for that account instead (``account_attempts`` per window), whatever its address: guesses from its
address or from anywhere else do not keep it out.

On PostgreSQL, which several processes may share, an attempt that passes these windows is also counted in
the database (``attempts``), so the limits hold over all the processes. Known addresses are remembered per
process (known-device tokens work everywhere).

Unknown accounts are counted like known ones (the key is the email as typed, normalised): a 429 reveals
nothing about existence.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from .rate_limit import RateLimits, SlidingWindow

__all__ = ["Reservation", "SignInLimiter"]

#: Addresses remembered per account as having signed in (the most recent ones), and accounts remembered.
_KNOWN_PER_ACCOUNT = 16
_KNOWN_ACCOUNTS = 100_000


@dataclass(slots=True)
class Reservation:
    """One counted attempt, until the password check says whether it was a failure."""

    limiter: SignInLimiter
    account: str
    address: str
    pair_key: str  # the key of its window in ``limiter.pair``: (account, address), or (account, device)
    stamps: list[tuple[SlidingWindow, str, float]] = field(default_factory=list)
    settled: bool = False

    def failed(self) -> None:
        """A wrong password: the attempt stays counted."""
        self.settled = True

    def cancelled(self) -> None:
        """The password was not checked (the server was too busy): the attempt does not count."""
        if not self.settled:
            self.settled = True
            for window, key, stamp in self.stamps:
                window.unhit(key, stamp)

    def succeeded(self) -> None:
        """The right password: not a failure, and this address now knows the account."""
        self.cancelled()
        self.limiter.pair.reset(self.pair_key)
        self.limiter.remember(self.account, self.address)


class SignInLimiter:
    def __init__(self, limits: RateLimits, *, now: Callable[[], float] | None = None) -> None:
        self.pair = SlidingWindow(limits.account_attempts, limits.account_window, now=now)
        self.address = SlidingWindow(limits.address_attempts, limits.address_window, now=now)
        self.account = SlidingWindow(limits.account_total_attempts, limits.account_window, now=now)
        self._known: OrderedDict[str, OrderedDict[str, None]] = OrderedDict()

    def known(self, account: str, address: str) -> bool:
        return address in self._known.get(account, ())

    def remember(self, account: str, address: str) -> None:
        """``address`` signed in to ``account`` (or signed it up)."""
        addresses = self._known.get(account)
        if addresses is None:
            addresses = self._known[account] = OrderedDict()
            while len(self._known) > _KNOWN_ACCOUNTS:
                self._known.popitem(last=False)
        else:
            self._known.move_to_end(account)
        addresses[address] = None
        addresses.move_to_end(address)
        while len(addresses) > _KNOWN_PER_ACCOUNT:
            addresses.popitem(last=False)

    def shared_windows(self, reservation: Reservation) -> list[tuple[str, int, float]]:
        """The windows ``reservation`` was counted in, as (key, attempts, seconds) for ``attempts``, whose
        keys name the window (the same limits, shared by the processes of one database)."""
        names = {id(self.pair): "pair", id(self.address): "address", id(self.account): "account"}
        return [
            (f"{names[id(window)]}\n{key}", window.attempts, window.window)
            for window, key, _ in reservation.stamps
        ]

    def shared_pair_key(self, reservation: Reservation) -> str:
        return f"pair\n{reservation.pair_key}"

    def reserve(self, account: str, address: str, *, device: str | None = None) -> Reservation | float:
        """A reservation for one password check, or the seconds to wait before trying again.

        ``device``: the request proved this device signed in to the account before (an id of its
        known-device token, see ``devices``). Its attempts then count in a window of their own for that
        account and device only: not the address's (the token is good for this one account, so it cannot be
        used to try others), nor the account's total; so neither guesses from a shared address (an office,
        a carrier's NAT) nor guesses from everywhere else keep the owner's own device out."""
        if device is not None:
            pair_key = _pair(account, f"device:{device}")
            checks: list[tuple[SlidingWindow, str]] = [(self.pair, pair_key)]
        else:
            pair_key = _pair(account, address)
            checks = [(self.pair, pair_key), (self.address, address)]
            if not self.known(account, address):
                checks.append((self.account, account))
        waits = [w for w in (window.retry_after(key) for window, key in checks) if w is not None]
        if waits:
            return max(waits)
        # Only windows below their limit are hit (a known address's failures do not count toward the
        # account's total), so no hit pushes an older event out and a take-back restores the count exactly.
        reservation = Reservation(self, account, address, pair_key)
        reservation.stamps = [(window, key, window.hit(key)) for window, key in checks]
        return reservation


def _pair(account: str, address: str) -> str:
    return f"{address}\n{account}"  # a newline is in neither an address nor a normalised email
