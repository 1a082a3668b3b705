"""Pieces for running pure consensus modules together without Trio: an in-memory
network, storage that checks candidate terms only grow, and the driver's shell for a
member whose archive is a bytearray.

Used by ``test_replication.py`` and ``test_hardening.py`` (:class:`Cluster`: seeded runs
with invariants checked every step) and ``test_transcripts.py`` (scripted scenarios in
``testdata/*.txt``).  Members are driven by
:func:`cluster.core.driver.drive`, the loop the node uses.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from cluster.core.base import ConsensusConfig, Event
from cluster.core.consensus import ConsensusModule
from cluster.core.driver import drive
from cluster.core.terms import TermHistory
from cluster.core.validate import check_records
from cluster.protocol.enums import Role
from cluster.protocol.ingress import SessionMessageHeader

MS = 1_000_000
SECOND = 1_000 * MS


class NullEgress:
    def __init__(self) -> None:
        self.replies: list[tuple[Any, Any]] = []
        """What went back on client connections: ``(source, message)``."""

    def connect(self, egress_id: int, channel: str) -> None:
        pass

    def send(self, egress_id: int, message: Any) -> bool:
        return True

    def reply(self, source: Any, message: Any) -> bool:
        self.replies.append((source, message))
        return True

    def attach(self, egress_id: int, source: Any) -> None:
        pass

    def close(self, egress_id: int) -> None:
        pass


class Port:
    """A ConsensusPort that records what it is given to send."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, Any]] = []

    def send(self, member_id: int, message: Any) -> bool:
        self.sent.append((member_id, message))
        return True


class Net:
    """Messages queue up as ``(sender, receiver, message)`` until the test delivers
    them; ``cut`` links drop what is sent on them."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.queue: list[tuple[int, int, Any]] = []
        self.cut: set[tuple[int, int]] = set()
        self.down: set[int] = set()
        """Members that are down: a link to one is down too (its send says so)."""

    def port(self, sender: int) -> Any:
        net = self

        class Port:
            def send(self, member_id: int, message: Any) -> bool:
                if (sender, member_id) in net.cut or member_id in net.down:
                    return False
                net.queue.append((sender, member_id, message))
                return True

        return Port()


class Storage:
    def __init__(self) -> None:
        self.candidate = -1

    def save_candidate_term(self, candidate_term_id: int) -> None:
        assert candidate_term_id > self.candidate
        self.candidate = candidate_term_id

    def record_term(self, leadership_term_id: int, base_position: int, timestamp: int) -> None:
        pass

    def remove_terms_from(self, position: int) -> None:
        pass

    def save_voting(self) -> None:
        self.voting = True


class MemoryShell:
    """The driver's shell for one member: its "archive" is a bytearray that takes each
    log batch at once; applying only moves the applied position."""

    def __init__(
        self,
        cm: ConsensusModule,
        disk: bytearray,
        applied: dict[int, int],
        now: int,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        self.cm = cm
        self.disk = disk
        self.applied = applied
        self.member = cm.config.member_id
        self.now = now
        self.events = on_event
        self.stuck = False
        """The archive takes no writes (a full or failing disk)."""
        self.answered: list[tuple[Any, int]] = []
        """The queries answered, with the applied position they were answered at."""
        self.lagging = False
        """The service applies nothing for now (it lags behind the commit position)."""
        self.slow_ns = 0
        """Each write becomes durable this long after it was taken (a slow disk)."""
        self.writes: list[tuple[int, int]] = []
        """(when durable, log end) of the writes taken but not yet durable (slow_ns)."""

    @property
    def applied_position(self) -> int:
        return self.applied[self.member]

    def on_event(self, event: Event) -> None:
        if self.events is not None:
            self.events(event)

    def persist(self) -> None:
        cm = self.cm
        if self.stuck:
            return
        truncate = cm.log.pending_truncate
        if truncate is not None:
            del self.disk[truncate:]
            self.writes[:] = [(due, min(end, truncate)) for due, end in self.writes]
            cm.on_truncated(truncate)
        batch = cm.take_log_batch()
        if batch is not None:
            start, data = batch
            assert start == len(self.disk)
            self.disk += data
            if not self.slow_ns:
                cm.on_archive_position(len(self.disk), self.now)
            elif len(self.writes) > 1:  # joins the write waiting for the one under way
                self.writes[-1] = (self.writes[-1][0], len(self.disk))
            else:  # one write at a time, each slow_ns long (group commit)
                after = self.writes[-1][0] if self.writes else self.now
                self.writes.append((max(after, self.now) + self.slow_ns, len(self.disk)))
        durable = [end for due, end in self.writes if due <= self.now]
        if durable:
            del self.writes[: len(durable)]
            cm.on_archive_position(durable[-1], self.now)

    def apply(self, commit_position: int) -> bool:
        if self.lagging or commit_position <= self.applied[self.member]:
            return False
        self.applied[self.member] = commit_position
        return True

    def flush(self) -> None:
        pass

    def answer_queries(self) -> None:
        applied, reads = self.applied_position, self.cm.reads
        self.answered.extend((query, applied) for query in reads.take_answerable(applied))
        self.answered.extend((query, applied) for query in reads.follower.take_answerable(applied))


def ship_log(
    cm: ConsensusModule, disk: bytearray, heartbeat: Callable[[], bool] = lambda: False
) -> None:
    """What a leader's replicators do: send each follower the log it lacks (one request
    per follower, within one term), or an empty request if ``heartbeat()`` says so."""
    replication = cm.replication
    for member in [p.member_id for p in cm.followers]:
        start = replication.next_append(member)
        assert start is not None
        end = len(disk)
        if start < end:
            stop = replication.replication_stop(start, end)
            data = bytes(disk[start:stop])
            cm.consensus.send(member, replication.append_request(member, start, data))
        elif heartbeat():
            cm.consensus.send(member, replication.append_request(member, start, b""))


class Cluster:
    def __init__(self, n: int, seed: int = 0, *, catching_up: bool = False) -> None:
        self.rng = random.Random(seed)
        self.net = Net(self.rng)
        self.now = SECOND
        self.members: dict[int, ConsensusModule] = {}
        self.disk: dict[int, bytearray] = {}
        self.applied: dict[int, int] = {}
        self.leaders: dict[int, int] = {}  # term -> leader
        self.down = self.net.down
        self.n = n
        self.seed = seed
        self.restarts = 0
        self.stuck: set[int] = set()
        """Members whose archive takes no writes (a full or failing disk)."""
        self.ever_committed = b""
        """The longest log prefix any member has ever had committed (never lost)."""
        self.answered: dict[int, list[tuple[Any, int]]] = {i: [] for i in range(n)}
        """Per member, the queries it answered and the applied position it did at."""
        self.lagging: set[int] = set()
        """Members whose service applies nothing for now."""
        self.slow: dict[int, int] = {}
        """Members whose disk is slow: each write durable this many ns after it is taken."""
        self.writes: dict[int, list[tuple[int, int]]] = {i: [] for i in range(n)}
        for i in range(n):
            self._start(i, catching_up=catching_up)

    def _start(self, i: int, *, catching_up: bool, generation: int = 0) -> None:
        """Member ``i`` starting on an empty disk (``catching_up``: a new or wiped one)."""
        cm = ConsensusModule(
            ConsensusConfig(
                member_id=i,
                member_ids=tuple(range(self.n)),
                leader_heartbeat_timeout_ns=SECOND,
                election_timeout_ns=300 * MS,
                startup_canvass_timeout_ns=2 * SECOND,
            ),
            NullEgress(),
            consensus=self.net.port(i),
            storage=Storage(),
            catching_up=catching_up,
            rng=random.Random(self.seed * 100 + i + 1000 * generation),
        )
        self.members[i] = cm
        self.disk[i] = bytearray()
        self.writes[i] = []
        self.applied[i] = 0
        cm.enter_election(self.now, "start-up", is_startup=True)

    def wipe(self, i: int, generation: int = 1) -> None:
        """Member ``i`` restarts on a new, empty disk: a catch-up member."""
        self.net.queue = [m for m in self.net.queue if i not in (m[0], m[1])]
        self._start(i, catching_up=True, generation=generation)

    def restart(self, i: int, **config: Any) -> None:
        """Member ``i`` restarts on its intact disk: its log, terms and candidate term as
        it saved them, committed up to what it had applied (recovery replays that), its
        messages in flight lost; ``config`` overrides its settings."""
        old = self.members[i]
        self.net.queue = [m for m in self.net.queue if i not in (m[0], m[1])]
        disk = self.disk[i]
        ends: list[int] = []
        assert check_records(bytes(disk), ends) is None
        cm = ConsensusModule(
            replace(old.config, **config),
            NullEgress(),
            log_position=len(disk),
            consensus=self.net.port(i),
            storage=old.storage,
            terms=TermHistory(list(old.log.terms)),
            candidate_term_id=old.candidate_term_id,
            catching_up=old.voting.catching_up,
            rng=random.Random(self.seed * 100 + i + 7919 * self.restarts),
        )
        self.restarts += 1
        cm.restore(min(self.applied[i], len(disk)), ends)
        self.members[i] = cm
        self.down.discard(i)
        cm.enter_election(self.now, "start-up", is_startup=True)

    def persist(self, i: int) -> None:
        """Drive member ``i`` with the driver the node uses (its shell: a bytearray)."""
        shell = MemoryShell(self.members[i], self.disk[i], self.applied, self.now)
        shell.stuck = i in self.stuck
        shell.answered = self.answered.setdefault(i, [])
        shell.lagging = i in self.lagging
        shell.slow_ns = self.slow.get(i, 0)
        shell.writes = self.writes.setdefault(i, [])
        drive(self.members[i], shell, self.now)

    def step(self, dt: int = 10 * MS) -> None:
        self.now += dt
        for i, cm in self.members.items():
            if i in self.down:
                continue
            cm.on_slow_tick(self.now)
            if cm.leader_deadline_ns is not None and self.now >= cm.leader_deadline_ns:
                cm.on_leader_timeout(self.now)
            self.persist(i)
        queue, self.net.queue = self.net.queue, []
        self.rng.shuffle(queue)
        # keep per-link FIFO order, as TCP does
        queue.sort(key=lambda item: (item[0], item[1]))
        for sender, receiver, message in queue:
            if receiver in self.down or sender in self.down:
                continue
            self.members[receiver].on_consensus_message(message, self.now)
            self.persist(receiver)
        for i, cm in self.members.items():
            if i in self.down:
                continue
            # the leader ships its whole log to every follower (the shell's replicator)
            if cm.role is Role.LEADER:
                ship_log(cm, self.disk[i], heartbeat=lambda: self.rng.random() < 0.2)
            cm.consensus_work(self.now)
            self.persist(i)
        self.check()

    def check(self) -> None:
        for cm in self.members.values():
            if cm.role is Role.LEADER:
                leader = self.leaders.setdefault(cm.leadership_term_id, cm.config.member_id)
                assert leader == cm.config.member_id, "two leaders in one term"
        # committed prefixes agree
        committed = [
            bytes(self.disk[i][: cm.commit_position])
            for i, cm in self.members.items()
            if cm.commit_position <= len(self.disk[i])
        ]
        longest = max(committed, key=len, default=b"")
        for c in committed:
            assert longest.startswith(c), "committed logs diverge"
        ever = self.ever_committed
        if len(longest) > len(ever):
            assert longest.startswith(ever), "a committed entry was lost or changed"
            self.ever_committed = longest
        else:
            assert ever.startswith(longest), "a committed entry was lost or changed"

    def leader(self) -> ConsensusModule | None:
        ready = [cm for i, cm in self.members.items() if cm.is_ready_leader and i not in self.down]
        return max(ready, key=lambda cm: cm.leadership_term_id, default=None)

    def run_until(self, predicate: Any, limit: int = 2000) -> None:
        for _ in range(limit):
            if predicate():
                return
            self.step()
        raise AssertionError("condition not reached")

    def leader_with_a_committed_entry(self) -> ConsensusModule:
        """Elect a leader, append one entry and run until every member has committed it."""
        self.run_until(lambda: self.leader() is not None)
        leader = self.leader()
        assert leader is not None
        self.append(b"x")
        end = leader.log.published_position
        self.run_until(lambda: all(cm.commit_position >= end for cm in self.members.values()))
        return leader

    def append(self, payload: bytes) -> int:
        """Append a fake client message on the leader (no session checks)."""
        leader = self.leader()
        assert leader is not None
        return leader.log.append(
            SessionMessageHeader(leader.leadership_term_id, 1, 0, payload), True
        )
