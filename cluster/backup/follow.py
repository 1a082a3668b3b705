"""The continuous backup's loop (Aeron's ClusterBackup, pull-based): every ``interval``,
``describe`` every member, learn the cluster's commit position from the leader's view,
and bring the backup up to it from one member (:func:`cluster.backup.pull.sync`).

It is no member: it never votes, never counts toward a quorum, and the members do
nothing for it but answer its reads.  It prefers a follower (the most up to date one
that follows the current leader), so the leader's disk and loop are left to the
writers; the leader, then any member that answers, will do when no follower can.  A
leader change or a member going away is just another poll: whoever answers next.  Its
lag (the leader's commit position minus the end of the log it holds) and when its last
poll succeeded are kept in :class:`BackupState` for ``/metrics`` and ``/health``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import trio

from ..config import MemberEndpoints
from ..protocol.admin import decode_body
from ..protocol.errors import ProtocolError
from ..tool.client import Result, describe_all, find_leader
from ..transport.tls import TlsIdentity, is_tls_problem, tls_required
from .link import BackupLinkError, Link, Pull
from .pull import sync
from .store import BackupStore

log = logging.getLogger("cluster.backup")


@dataclass
class BackupState:
    """What the backup knows of itself and the cluster after its last poll."""

    cluster_commit: int = -1
    """The leader's commit position (-1: no leader seen yet)."""
    held: int = -1
    """The end of the log the backup holds (-1: none yet)."""
    log_start: int = -1
    snapshot_position: int = -1
    source_member: int = -1
    leader_member: int = -1
    polls: int = 0
    failures: int = 0
    last_error: str = ""
    last_ok: float | None = None
    """``time.monotonic()`` of the last poll that brought the backup up to date."""
    started: float = field(default_factory=time.monotonic)
    bytes_pulled: int = 0
    lag_before_pull: int = 0
    """The lag at the start of the last successful poll: how far behind the backup had
    fallen over the interval (``lag_bytes`` is what is left after the pull)."""
    snapshots_pulled: int = 0

    @property
    def lag_bytes(self) -> int:
        """The cluster's commit position minus what the backup holds (0 while unknown)."""
        if self.cluster_commit < 0:
            return 0
        return max(0, self.cluster_commit - max(self.held, 0))

    def health(self, max_lag: int, max_age: float) -> tuple[bool, list[str]]:
        """Healthy: the last poll succeeded within ``max_age`` seconds and the lag is
        within ``max_lag`` bytes; otherwise every reason."""
        reasons = []
        now = time.monotonic()
        if self.last_ok is None:
            reasons.append("no successful poll yet" + (f": {self.last_error}"
                                                        if self.last_error else ""))  # fmt: skip
        elif now - self.last_ok > max_age:
            reasons.append(
                f"last successful poll {now - self.last_ok:.1f} s ago (bound {max_age:g} s)"
                + (f": {self.last_error}" if self.last_error else "")
            )
        if self.lag_bytes > max_lag:
            reasons.append(f"lag {self.lag_bytes} bytes over the bound {max_lag}")
        if reasons:
            return False, reasons
        return True, [f"lag {self.lag_bytes} bytes, from member {self.source_member}"]


def source_order(described: Sequence[Result], leader: int, current: int = -1) -> list[int]:
    """Members to read from, best first: followers of the current leader (``current``,
    the one read from last time, first; then the most up to date), then the leader,
    then any other member that answered."""
    up = [r.status for r in described if r.status is not None]
    followers = sorted(
        (s for s in up if s.role == "FOLLOWER" and s.leader_member_id == leader >= 0
         and not s.catching_up),
        key=lambda s: (s.member_id != current, -s.commit_position),
    )  # fmt: skip
    order = [s.member_id for s in followers]
    if leader >= 0:
        order.append(leader)
    order += [s.member_id for s in up if s.member_id not in order]
    return order


class NeedsCertificates(Exception):
    """The members require TLS and the backup was given no certificates: no poll can
    ever succeed, so it stops (``cluster-backup`` exits 2) rather than retry for ever."""


class Follower:
    """Keeps ``store`` up to the cluster (see the module docstring)."""

    def __init__(
        self,
        members: Sequence[MemberEndpoints],
        store: BackupStore,
        *,
        tls: TlsIdentity | None = None,
        keep: int = 2,
        interval: float = 1.0,
        limit: float = 10.0,
    ) -> None:
        self.members = list(members)
        self.store = store
        self.tls = tls
        self.keep = keep
        self.interval = interval
        self.limit = limit
        self.state = BackupState()
        self._pulls: dict[int, Pull] = {}
        self._errors: list[str] = []
        self._update_held()

    def _update_held(self) -> None:
        store, state = self.store, self.state
        state.held = -1 if store.log_end is None else store.log_end
        state.log_start = -1 if store.log_start is None else store.log_start
        state.snapshot_position = store.latest_snapshot

    def _pull(self, member_id: int) -> Pull:
        pull = self._pulls.get(member_id)
        if pull is None:
            member = next(m for m in self.members if m.member_id == member_id)
            pull = self._pulls[member_id] = Pull(Link(member, self.tls, self.limit))
        return pull

    async def _leader_commit(self) -> bool:
        """Ask the leader seen last time for its commit position (cheap); False when it
        no longer leads or does not answer (then every member is described)."""
        state = self.state
        if state.leader_member < 0:
            return False
        try:
            reply = await self._pull(state.leader_member).link.request(
                "backup-query", {"brief": "1"}
            )
        except BackupLinkError:
            return False
        try:
            body = decode_body(reply.body) if reply.ok else None
        except ProtocolError:
            return False
        if not isinstance(body, dict) or body.get("role") != "LEADER":
            return False
        state.cluster_commit = int(body["commit_position"])
        return True

    async def _discover(self) -> list[int]:
        """``describe`` every member: the leader, its commit, the members to read from."""
        state = self.state
        described = await describe_all(self.members, min(self.limit, 5.0))
        if self.tls is None and all(r.status is None for r in described):
            wanting = [r.member.member_id for r in described if is_tls_problem(r.failure)]
            if wanting:
                raise NeedsCertificates(
                    f"{tls_required(wanting)}: the folder of an admin principal "
                    "(`cluster-tool certs` makes client-admin)"
                )
        leader = find_leader(described)
        commits = [r.status.commit_position for r in described if r.status is not None]
        leading = [r.status for r in described
                   if r.status is not None and r.status.member_id == leader]  # fmt: skip
        if leading:
            state.cluster_commit = leading[0].commit_position
        elif commits:
            state.cluster_commit = max(commits)
        state.leader_member = leader
        self._errors = [f"member {r.member.member_id}: {r.failure}" for r in described
                        if r.status is None]  # fmt: skip
        return source_order(described, leader, state.source_member)

    async def _sync(self, member_id: int) -> bool:
        state = self.state
        before = state.lag_bytes  # the commit position was just asked for
        pulled = self.store.appended_bytes
        snapshot = self.store.latest_snapshot
        try:
            await sync(self.store, self._pull(member_id), keep=self.keep)
        except (BackupLinkError, OSError) as exc:
            self._errors.append(str(exc) if isinstance(exc, BackupLinkError)
                                else f"writing {self.store.out}: {exc}")  # fmt: skip
            return False
        finally:
            state.bytes_pulled += self.store.appended_bytes - pulled
            self._update_held()
        if self.store.latest_snapshot != snapshot:
            state.snapshots_pulled += 1
        if member_id != state.source_member:
            log.info("backing up from member %d (leader %d)", member_id, state.leader_member)
        state.source_member = member_id
        state.lag_before_pull = before
        state.last_ok = time.monotonic()
        state.last_error = ""
        return True

    async def poll(self) -> bool:
        """One poll; True when the backup was brought up to a member's committed end.

        The member read from last time and the leader's commit position are asked
        directly; any failure (a leader change, a member gone) and every member is
        described, and each is tried in :func:`source_order`."""
        state = self.state
        state.polls += 1
        self._errors = []
        source = state.source_member
        if (
            source >= 0
            and source != state.leader_member
            and await self._leader_commit()
            and await self._sync(source)
        ):
            return True
        for member_id in await self._discover():
            if await self._sync(member_id):
                return True
        state.failures += 1
        state.last_error = "; ".join(self._errors) or "no member answered"
        log.warning("poll failed: %s", state.last_error)
        return False

    async def run(self) -> None:
        """Poll every ``interval`` until cancelled."""
        try:
            while True:
                started = trio.current_time()
                try:
                    await self.poll()
                except NeedsCertificates:
                    raise
                except Exception as exc:  # a bug or a surprise: logged, the next poll
                    log.exception("poll failed")
                    self.state.failures += 1
                    self.state.last_error = f"poll failed: {exc!r}"
                await trio.sleep_until(started + self.interval)
        finally:
            for pull in self._pulls.values():
                await pull.link.aclose()
            self.store.close()
