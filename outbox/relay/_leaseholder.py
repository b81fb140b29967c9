"""The shards a relay holds under lease: heartbeat, renewal, fair share, and the fence.

Relays heartbeat (``relay_members``) and renew their leases (``relay_leases``) in one
transaction every heartbeat, from a thread of their own while the relay runs, so that a
slow batch does not delay it; leases and heartbeat expire one TTL after it. Each renewal
also claims shards that are free or ran out, or hands shards back, towards a fair share
of the relays alive. Every claim raises the shard's epoch, which the relay stamps on each
message (``LeaseStamp``).

The relay keeps the local deadline of its leases (``_lease``). When a renewal shows a
shard lost, or the deadline comes without a renewal, the leaseholder fences the relay:
it has whatever is queued purged at once and forgets its shards, so nothing is produced
until the next renewal shows a lease valid again.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import SQLAlchemyError

from agent_blackbox.broker import LeaseStamp
from agent_blackbox.outbox.relay._lease import LeaseDeadline, LeaseTiming
from agent_blackbox.outbox.relay._log import Repeated, first_line, log

_SEED_LEASES = text(
    "INSERT INTO blackbox.relay_leases (shard) SELECT generate_series(0, :shards - 1) "
    "ON CONFLICT (shard) DO NOTHING"
)
_HEARTBEAT = text(
    "INSERT INTO blackbox.relay_members (owner, expires_at) "
    "VALUES (:me, now() + make_interval(secs => :ttl)) "
    "ON CONFLICT (owner) DO UPDATE SET expires_at = excluded.expires_at"
)
_LIVE_PEERS = text(
    "SELECT count(*) FROM blackbox.relay_members WHERE owner <> :me AND expires_at > now()"
)
_LEAVE = text("DELETE FROM blackbox.relay_members WHERE owner = :me")
# Only a lease that is still valid is renewed (its epoch kept); one that ran out, ours
# included, is claimed again, which raises its epoch.
_RENEW = text(
    "UPDATE blackbox.relay_leases SET expires_at = now() + make_interval(secs => :ttl) "
    "WHERE owner = :me AND shard < :shards AND expires_at >= now() RETURNING shard, epoch"
)
_CLAIM = text(
    """
    UPDATE blackbox.relay_leases
       SET owner = :me, expires_at = now() + make_interval(secs => :ttl), epoch = epoch + 1
     WHERE shard IN (
        SELECT shard FROM blackbox.relay_leases
         WHERE shard < :shards AND (owner IS NULL OR expires_at < now())
         ORDER BY shard LIMIT :wanted FOR UPDATE SKIP LOCKED)
    RETURNING shard, epoch
    """
)
# Seconds until the soonest lease held by another relay runs out (None: there is none).
_SOONEST_FOREIGN = text(
    "SELECT extract(epoch FROM min(expires_at) - now())::float8 FROM blackbox.relay_leases "
    "WHERE shard < :shards AND owner <> :me AND expires_at > now()"
)
_RELEASE = text(
    "UPDATE blackbox.relay_leases SET owner = NULL, expires_at = NULL "
    "WHERE owner = :me AND NOT shard = ANY(:keep)"
)
# Every transaction of the relay that takes row locks (lease renewal and claims, deletes)
# bounds how long it may sit idle: a relay frozen inside one (SIGSTOP, a VM pause) would
# otherwise hold its lease rows, so no other relay could claim them (the claim skips
# locked rows), or its outbox rows, so the next owner's deletes would wait. The server
# ends such a session after the bound, well before the frozen relay's leases run out.
_BOUNDED = text("SELECT set_config('idle_in_transaction_session_timeout', :idle_ms, true)")


class Leaseholder:
    """Keeps this relay's shard leases and its membership heartbeat.

    Args:
        engine: the write side's database.
        owner: this relay's lease owner id.
        shard_count: the outbox's shards (``Settings.outbox_shards``).
        timing: the lease's TTL, heartbeat, margin and message timeout.
        purge: stops what the relay has queued at once, returning how many messages it
            purged; called with the lease lock held when the relay must stop publishing.

    The relay's loop and the heartbeat thread both call it; a lock keeps one renewal or
    fence at a time. ``stamps`` and ``deadline`` are read afresh for every message
    produced: a renewal or fence on the heartbeat thread replaces them meanwhile.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        owner: str,
        shard_count: int,
        timing: LeaseTiming,
        purge: Callable[[], int],
    ) -> None:
        self._engine = engine
        self._owner = owner
        self._shard_count = shard_count
        self._timing = timing
        self._purge = purge
        self._idle_bound = {"idle_ms": str(timing.message_timeout_ms)}
        self.deadline = LeaseDeadline(timing)
        # A plain attribute, not a property: the produce loop reads it for every row.
        self.stamps: Mapping[int, tuple[str, bytes]] = {}
        """Each held shard's ``LeaseStamp`` header."""
        self._shards: list[int] = []
        self._epochs: dict[int, int] = {}
        self._over_share = False
        self._next_check = -math.inf
        self._seeded = False
        self._beating = False
        """True while the heartbeat thread renews the leases (``heartbeats``)."""
        self._lock = threading.RLock()
        self._renewals = Repeated("renew leases")

    @property
    def shards(self) -> list[int]:
        """The shards held, in order (replaced, never changed in place)."""
        return self._shards

    @property
    def epochs(self) -> Mapping[int, int]:
        """The lease epoch of every shard held."""
        return self._epochs

    @property
    def over_share(self) -> bool:
        """More shards are held than a fair share: some are to be handed back once
        nothing is queued."""
        return self._over_share

    @contextmanager
    def heartbeats(self) -> Iterator[None]:
        """Renew leases and heartbeat from a thread of its own while the block runs, so
        that a slow read or delete of a large batch does not let the leases run out.

        A process that freezes stops both, as it must. Handing shards back stays with
        the loop, between batches, when nothing is queued.
        """
        done = threading.Event()

        def beat() -> None:
            while not done.wait(max(self._next_check - time.monotonic(), 0.01)):
                self._renew_or_retry(wait=True)
                self.fence_if_expired("its leases could not be renewed before they ran out")

        thread = threading.Thread(target=beat, name=f"heartbeat {self._owner}", daemon=True)
        thread.start()
        self._beating = True
        try:
            yield
        finally:
            self._beating = False
            done.set()
            thread.join(timeout=30)

    def renew_next(self) -> None:
        """Renew (and claim or hand back) at the next chance, not a heartbeat later."""
        self._next_check = -math.inf

    def keep(self, *, may_release: bool, wait: bool = True) -> bool:
        """Heartbeat and renew when due; claim or (with ``may_release``, when nothing is
        queued) hand back shards towards a fair share. Without ``wait`` nothing is done
        while another thread renews (the loop does not stall behind the heartbeat).
        Whether a renewal was made.

        Raises:
            SQLAlchemyError: the renewal failed; the leases are as they were.
        """
        if time.monotonic() < self._next_check:
            return False
        if not self._lock.acquire(blocking=wait):
            return False
        try:
            return self._renew_if_due(may_release=may_release)
        finally:
            self._lock.release()

    def keep_between_batches(self, *, may_release: bool) -> None:
        """The loop's turn between batches: renewing is the heartbeat thread's when it
        runs, handing shards back (``renew_next``) is the loop's."""
        if not self._beating or self._next_check == -math.inf:
            self.keep(may_release=may_release, wait=False)

    def keep_alive(self) -> None:
        """While the loop waits for deliveries: renew if no heartbeat thread does, and
        fence the relay if the leases ran out meanwhile."""
        if not self._beating:
            self._renew_or_retry(wait=False)
        self.fence_if_expired("its leases could not be renewed before they ran out")

    def fence_if_expired(self, reason: str) -> None:
        """Fence the relay (see the module) if its leases are within the margin of
        their end without a renewal; ``reason`` goes into the log line."""
        if self._shards and self.deadline.expired(time.monotonic()):
            with self._lock:  # checked again: a renewal may have just finished
                if self._shards and self.deadline.expired(time.monotonic()):
                    self._fence(reason)

    def leave(self, *, release: bool) -> None:
        """End the membership and, with ``release``, hand every lease back (only when
        nothing is in flight; else they run out by themselves). A failure is logged."""
        try:
            with self._engine.begin() as conn:
                if release:
                    conn.execute(_RELEASE, {"me": self._owner, "keep": []})
                conn.execute(_LEAVE, {"me": self._owner})
        except SQLAlchemyError as exc:
            log.warning("could not release leases of %s: %s", self._owner, exc)
        self._forget()

    def _renew_or_retry(self, *, wait: bool) -> None:
        """Renew when due; a failed renewal is logged and tried again half a heartbeat
        later (the fence follows if none succeeds in time)."""
        try:
            renewed = self.keep(may_release=False, wait=wait)
        except SQLAlchemyError as exc:
            self._renewals.failed(first_line(exc), time.monotonic())
            self._next_check = time.monotonic() + self._timing.heartbeat_s / 2
        else:
            if renewed:
                self._renewals.succeeded(time.monotonic())

    def _renew_if_due(self, *, may_release: bool) -> bool:
        """Renew, claim or hand back in one transaction, then hold what it left us with;
        whether it was due. Called with the lease lock held."""
        started = time.monotonic()
        if started < self._next_check:
            return False
        with self._engine.begin() as conn:
            held, soonest = self._renew_txn(conn, may_release=may_release)
        self._seeded = True
        lost = sorted(set(self._shards) - held.keys())
        if lost:
            # Another relay holds them now (or they ran out): whatever is queued may
            # belong to them, so nothing queued may be sent.
            self._fence(f"shards {lost} are no longer its own")
        if sorted(held) != self._shards or held != self._epochs:
            log.info("relay %s now owns shards %s (epochs %s)", self._owner, sorted(held), held)
        self._shards = sorted(held)
        self._epochs = held
        self.stamps = {s: LeaseStamp(s, e).header() for s, e in held.items()}
        if held:
            self.deadline.renewed(started)
        else:
            self.deadline.lapse()
        self._next_check = started + self._timing.heartbeat_s
        if soonest is not None:
            # Look again the moment another relay's lease runs out: if it died, its
            # heartbeat ran out with it and its shards are ours to share.
            self._next_check = min(self._next_check, started + soonest + 0.01)
        return True

    def _renew_txn(
        self, conn: Connection, *, may_release: bool
    ) -> tuple[dict[int, int], float | None]:
        """Heartbeat, renew the valid leases, and claim or hand back shards towards a
        fair share; the shards held then (with their epochs), and the seconds until the
        soonest lease of another relay runs out (None: there is none)."""
        shards = self._shard_count
        params = {"me": self._owner, "ttl": self._timing.ttl_s, "shards": shards}
        conn.execute(_BOUNDED, self._idle_bound)
        if not self._seeded:
            conn.execute(_SEED_LEASES, {"shards": shards})
        conn.execute(_HEARTBEAT, params)
        held = {int(s): int(e) for s, e in conn.execute(_RENEW, params)}
        peers = int(conn.execute(_LIVE_PEERS, params).scalar_one())
        fair = math.ceil(shards / (1 + peers))
        self._over_share = len(held) > fair
        if len(held) > fair and may_release:
            # Hand shards back so a relay that just started gets its share.
            keep = sorted(held)[:fair]
            conn.execute(_RELEASE, {"me": self._owner, "keep": keep})
            held = {s: held[s] for s in keep}
            self._over_share = False
        elif len(held) < fair:
            claimed = conn.execute(_CLAIM, {**params, "wanted": fair - len(held)})
            held.update({int(s): int(e) for s, e in claimed})
        soonest = conn.execute(_SOONEST_FOREIGN, params).scalar_one()
        return held, None if soonest is None else float(soonest)

    def _fence(self, reason: str) -> None:
        """Stop producing at once and purge what is queued: the leases cannot be shown
        valid. The purged rows stay in the outbox for whichever relay holds them next.
        Called with the lease lock held."""
        purged = self._purge()
        log.warning(
            "relay %s stops publishing shards %s: %s; %d queued messages purged (their rows "
            "stay for the next owner)",
            self._owner,
            self._shards,
            reason,
            purged,
        )
        self._forget()
        self._next_check = -math.inf

    def _forget(self) -> None:
        self._shards, self.stamps, self._epochs = [], {}, {}
        self.deadline.lapse()
