"""A whole cluster in one process under virtual time: the deterministic simulator.

:class:`SimCluster` runs N real :class:`cluster.node.Node` objects, K simulated clients
(:mod:`tests.sim.sim_client`) and a nemesis in ONE ``trio.run`` with
``MockClock(autojump_threshold=0)`` and Trio's deterministic scheduling seeded from the
run seed.  Nodes talk over a :class:`~cluster.transport.sim.SimNetwork`, read a virtual
clock, draw from seeded RNGs and do their archive I/O inline (no threads: autojump
would skip time while a thread runs), on real files under ``tmp_path`` (each member's
data directory modelled by :class:`~tests.sim.disk.DiskModel`).

One seed expands into a printed configuration (:class:`SimConfig`), so a failing seed
replays exactly::

    .venv/bin/python -m tests.sim.run --seed 1234 --nodes 3

A run is a **safety phase** (faults from the seed: delays, resets, partitions, the leader
cut off from the majority (half the time with its clock stopped until the heal: it
never notices by itself), one-way links, crash/restart with torn writes, pauses,
snapshot requests, an operator's SHUTDOWN or ABORT, a member's wall clock stepped back
or forward, power cuts of one member, a minority or all: the members sync for real on
the disk model of ``tests/sim/disk.py``, and a power cut loses what they had not
synced; a slow disk, bit rot and misdirected writes: ``tests/sim/disk_faults.py``)
followed by a
**liveness phase** (heal, restart everyone, require a leader and an acknowledged write
within a bound, then all members converged).  :class:`Checker` tests the invariants every
10 ms of virtual time and at the end:

1. at most one leader per term, ever;
2. committed log bytes never change, and every member's committed prefix is a prefix of
   the longest committed log seen;
3. applied entries are committed: ``applied <= commit`` on each member, every applied
   message is the committed record at its position, each position applied once per
   incarnation, and each member's store equals the committed log applied;
4. every acknowledged write is in every member's store after the run; no request is in
   the committed log (or applied) more often than the client sent it;
5. a cluster session id is opened once in the committed log, never reused;
6. a member stops by itself only for a SHUTDOWN or ABORT that it applied live (not in
   its start-up replay) and in its own term, once: an admin action acts on the cluster
   it was given to, never on one restarted after it (a stopped member is started again
   a little later, as an operator would);
7. exactly once in (issue 42): each session's messages in the committed log are its
   sequences 1, 2, 3... with no gap and no duplicate, each the payload its client
   numbered so (a prefix of what it offered), and each member applies a session's
   messages in that order, none twice; a CLOSED told the last one applied; at the end
   of the run, every session that stayed open has all it offered applied;
8. exactly once out (issue 42): every member gives a session's reply number n the same
   bytes (replies are deterministic), and each session's application got its replies
   numbered 1, 2, 3... in order, none twice, with no gap while the members' kept bound
   was not exceeded, each the bytes the members gave under its number; at the end of
   the run, every session that stayed open has got every reply given to it;
9. queries (issue 43, :mod:`tests.sim.queries`): an OK answer at log position P is
   the key's value in the committed log applied up to P, P is at most what was committed
   when it arrived, a linearizable one's P is at least the highest commit position any
   member had when the client first sent it, and every answer's P is at least the
   ``min_position`` it asked for and every position its client had received before.
10. slow and lying disks (issue 44, :mod:`tests.sim.disk_faults`): no member but the
    rotted one holds other bytes than the committed ones where a member's disk rotted
    (nothing rotted was served), a member that stops on its rotted log names the file
    and a position in the damage (anything else fails the run).  A slow disk has no
    invariant of its own in a seeded run (every other one holds through it); that a
    slow leader hands over (``--slow-disk-threshold``, 300 ms for 2 s here) is
    ``test_sim_disks.py``'s.
11. cluster time (issue 44, :mod:`tests.sim.clocks`, for the seeds that step members'
    wall clocks): the committed log's timestamps never decrease, a timer fires at or
    after its deadline and once, and every timer due fires.

A task that keeps running while virtual time stands still (a spin on a deadline) fails
the run as a livelock instead of hanging it.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import hashlib
import logging
import math
import os
import random
import shutil
import struct
import traceback
import zlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import msgspec
import trio
import trio.abc
import trio.lowlevel
import trio.testing

from cluster.archive.compaction import compact
from cluster.archive.record import iter_records
from cluster.archive.segments import FsyncPolicy, list_segments
from cluster.config import NodeConfig
from cluster.core.replication import LeaderReplication
from cluster.examples.auth import SharedSecretAuthenticator, SharedSecretCredentials
from cluster.examples.kv import KeyValueService, Put
from cluster.node import Node
from cluster.protocol import LOG
from cluster.protocol.enums import ClusterAction, Role
from cluster.protocol.ingress import SessionMessageHeader
from cluster.protocol.log import ClusterActionRequest, SessionCloseEvent, SessionOpenEvent
from cluster.service import ClientSession, Cluster
from cluster.transport.sim import SimNetwork

from .adversary import Adversary
from .clocks import CLOCK_STEP, TIMER_BASE, ClockChecker, draw_step, timer_for
from .disk import DiskModel, DiskModelError
from .disk_faults import ROT, SLOW_DISK, DiskFaults
from .queries import Answer, QueryChecker, encode_answer
from .sim_client import History, SimClient

EPOCH_OFFSET_NS = 1_700_000_000 * 1_000_000_000
SNAPSHOT_CHUNK = 1024
"""Snapshot bytes per chunk sent to a member that needs purged log: the simulator's
snapshots are a few KiB, and a transfer must take many chunks to be cut short."""
INGRESS_PORT, CONSENSUS_PORT, ADMIN_PORT = 9010, 9020, 9030
CHECK_INTERVAL = 0.010
APP, APP_SECRET = b"app", b"the workload's secret"
"""The one principal of :attr:`SimConfig.authenticate`, and its secret."""

_decode_put = msgspec.msgpack.Decoder(Put).decode


def replay_command(seed: int, nodes: int, flags: str = "") -> str:
    return f".venv/bin/python -m tests.sim.run --seed {seed} --nodes {nodes}{flags}"


class SimFailure(AssertionError):
    """An invariant broke (or the cluster did not recover) in a simulated run."""

    def __init__(
        self, seed: int, nodes: int, reason: str, trace_tail: str = "", replay: str = ""
    ) -> None:
        self.seed = seed
        self.nodes = nodes
        self.reason = reason
        self.trace_tail = trace_tail
        self.replay = replay or replay_command(seed, nodes)
        message = f"SIM SEED {seed} failed: {reason}; replay with: {self.replay}"
        if trace_tail:
            message += f"\nlast events:\n{trace_tail}"
        super().__init__(message)


class _Violation(Exception):
    pass


def _leaf(exc: BaseException) -> str:
    """The first real exception inside (nested) exception groups, as ``Type: message``."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------- configuration


FAULTS = (
    "partition",
    "isolate-leader",
    "one-way",
    "crash",
    "pause",
    "reset",
    "slow",
    "snapshot",
    "wipe",
)
POWER_CUT = "power-cut"
"""A power cut (``tests/sim/disk.py``) of one member, a minority or all of them at once
(drawn for about half the seeds, from an RNG of its own, as :data:`STOP_CLUSTER`):
what they had not made durable is lost, and they are started again a little later."""
STOP_CLUSTER = "stop-cluster"
"""An operator's SHUTDOWN or ABORT through the leader (drawn for about a third of the
seeds, from an RNG of its own so that the other seeds' runs stay as they were): every
member that applies it live stops by itself and is started again a little later."""


@dataclass
class SimConfig:
    """Everything a seed decides, printed in full so a run can be understood and replayed."""

    seed: int
    nodes: int = 3
    clients: int = 3
    safety_duration: float = 10.0
    liveness_timeout: float = 15.0
    latency: tuple[float, float] = (0.0005, 0.005)
    reset_probability: float = 0.0
    fault_interval: tuple[float, float] = (0.2, 1.5)
    faults: tuple[str, ...] = FAULTS
    torn_probability: float = 0.5
    max_crashed: int = 1
    client_window: int = 2
    disk_latency: tuple[float, float] = (0.0001, 0.001)
    segment_size: int = 64 << 10
    clock_skew_ms: tuple[int, ...] = ()
    clock_overshoot: float = 0.0
    adversary: bool = False
    """A process on the network that speaks the consensus protocol with random, replayed,
    mutated and forged messages during the safety phase (``tests/sim/adversary.py``)."""
    authenticate: bool = False
    """Members challenge every client (:class:`~cluster.examples.auth.SharedSecretAuthenticator`
    with one principal, ``app``); the workload's clients answer with its secret."""
    query_share: float = 0.3
    """The share of the workload's operations that are queries (the value of a key,
    half linearizable, half follower): invariant (9)."""
    node: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_seed(cls, seed: int, nodes: int = 3, **overrides: Any) -> SimConfig:
        rng = random.Random(f"config-{seed}")
        faults = tuple(f for f in FAULTS if rng.random() < 0.75) or ("partition",)
        config = cls(
            seed=seed,
            nodes=nodes,
            clients=rng.randint(1, 4),
            latency=rng.choice([(0.0005, 0.002), (0.0005, 0.005), (0.001, 0.02)]),
            reset_probability=rng.choice([0.0, 0.0, 0.0005, 0.002]),
            fault_interval=rng.choice([(0.1, 0.6), (0.2, 1.5), (0.5, 3.0)]),
            faults=faults,
            max_crashed=(nodes - 1) // 2 if nodes > 1 else 1,
            client_window=rng.randint(1, 4),
            segment_size=rng.choice([4 << 10, 64 << 10, 1 << 20]),
            clock_skew_ms=tuple(rng.randint(-50, 50) for _ in range(nodes)),
            node={
                "session_timeout": 4_000_000_000,
                "leader_heartbeat_timeout": 1_000_000_000,
                "leader_heartbeat_interval": 100_000_000,
                "election_timeout": 300_000_000,
                "startup_canvass_timeout": 1_000_000_000,
                # real syncs, made cheap by the disk model (tests/sim/disk.py): what
                # they make durable is what a power cut keeps
                "fsync": FsyncPolicy.BATCH,
                # inline: log writes in the duty cycle, the disk instant; thread: through
                # the run_blocking seam, after a seeded disk latency; auto: thread on the
                # leader, inline on followers
                "archive_io": rng.choice(["inline", "thread", "auto"]),
                # a leader whose disk is slow hands over (tests/sim/disk_faults.py)
                "slow_disk_threshold": 300_000_000,
                "slow_disk_period": 2_000_000_000,
            },
            adversary=rng.random() < 0.35,
        )
        if random.Random(f"stop-cluster-{seed}").random() < 0.3:
            config.faults += (STOP_CLUSTER,)
        if random.Random(f"power-cut-{seed}").random() < 0.5:
            config.faults += (POWER_CUT,)
        if random.Random(f"slow-disk-{seed}").random() < 0.25:
            config.faults += (SLOW_DISK,)
        if random.Random(f"rot-{seed}").random() < 0.25:
            config.faults += (ROT,)
        if random.Random(f"clock-step-{seed}").random() < 0.3:
            config.faults += (CLOCK_STEP,)
        node_fields = {f.name for f in fields(NodeConfig)}
        for key, value in overrides.items():
            if hasattr(config, key):  # the simulator's (segment_size: both)
                setattr(config, key, value)
            elif key in node_fields:
                config.node[key] = value
            else:
                raise TypeError(f"unknown simulator or node setting {key!r}")
        return config

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in asdict(self).items())


def members_string(nodes: int) -> str:
    return ",".join(f"{i}=n{i}:{INGRESS_PORT}:{CONSENSUS_PORT}:{ADMIN_PORT}" for i in range(nodes))


def ingress_endpoints(nodes: int) -> str:
    return ",".join(f"{i}=n{i}:{INGRESS_PORT}" for i in range(nodes))


# ---------------------------------------------------------------------- the service


ReplyGiven = Callable[[int, int, bytes, bool], None]
"""(session id, reply number, payload, whether the kept bound dropped unconfirmed ones:
the oldest kept is past the first the client has not confirmed)."""


class SimKV(KeyValueService):
    """The KV service, journaling every message it gets: (log position, session, payload),
    counting the requests it applies, and telling ``on_reply`` each numbered reply it
    gives (exactly once out: the checker compares them with what clients receive)."""

    def __init__(
        self,
        on_reply: ReplyGiven | None = None,
        on_timer: Callable[[int, int], None] | None = None,
    ) -> None:
        super().__init__()
        self.on_timer = on_timer
        """Given: every third write schedules a timer of its own (``tests/sim/clocks.py``),
        told here as (correlation id, deadline)."""
        self.journal: list[tuple[int, int, bytes]] = []
        self.applications: dict[int, int] = {}
        self.on_reply = on_reply
        self.cluster: Cluster | None = None
        self.installed_at = 0
        """Where the journal stands when a snapshot from the leader was installed."""
        self.install_points: list[int] = []
        """Where the journal stood at each install (the messages in the snapshot were
        never applied here)."""

    def on_start(self, cluster: Cluster, snapshot: bytes | None) -> None:
        if self.cluster is not None:
            # a snapshot from the leader was installed: the state is the snapshot's,
            # and only the messages after it are this service's own applications
            self.installed_at = len(self.journal)
            self.install_points.append(self.installed_at)
            self.applications = {}
        self.cluster = cluster
        super().on_start(cluster, snapshot)

    def on_timer_event(self, correlation_id: int, timestamp: int) -> None:
        if correlation_id < TIMER_BASE:  # a TTL's (none in this workload)
            super().on_timer_event(correlation_id, timestamp)

    def on_query(self, payload: bytes) -> bytes:
        """The value of the key ``payload`` names (:func:`~tests.sim.queries.encode_answer`);
        read-only."""
        return encode_answer(self.store.get(payload.decode()))

    def on_session_message(
        self, session: ClientSession | None, timestamp: int, payload: bytes
    ) -> None:
        if session is None:
            super().on_session_message(session, timestamp, payload)
            return
        assert self.cluster is not None
        self.journal.append((self.cluster.log_position, session.id, bytes(payload)))
        rid = _decode_put(payload).request_id
        self.applications[rid] = self.applications.get(rid, 0) + 1
        if self.on_timer is not None:
            timer = timer_for(self.cluster.log_position, rid, timestamp)
            if timer is not None:
                self.cluster.schedule_timer(*timer)
                self.on_timer(*timer)
        # the container numbers and keeps each reply the service gives (every member)
        replies = session.replies  # type: ignore[attr-defined]
        before = replies.last
        super().on_session_message(session, timestamp, payload)
        if self.on_reply is not None and replies.last > before:
            kept = replies.kept
            trimmed = bool(kept) and kept[0].reply > replies.confirmed + 1
            for reply in kept:
                if reply.reply > before:
                    assert type(reply) is SessionMessageHeader
                    self.on_reply(session.id, reply.reply, reply.payload, trimmed)


# ---------------------------------------------------------------------- nodes


class _ObservedNode(Node):
    """A node that notes the term it is in when it applies each cluster action: (6)
    judges a member's stop by the term in which it decided to stop, not the one it is
    in once the snapshot it takes first is written (a new term may come meanwhile)."""

    action_terms: dict[int, int]

    def _build(self) -> None:
        super()._build()
        self.action_terms = {}
        decide = self.container.on_cluster_action
        assert decide is not None

        def noted(position: int, action: ClusterActionRequest) -> None:
            self.action_terms[position] = self.cm.leadership_term_id
            decide(position, action)

        self.container.on_cluster_action = noted


@dataclass
class SimNode:
    index: int
    host: str
    dir: Path
    rng: random.Random
    node: Node | None = None
    service: SimKV | None = None
    scope: trio.CancelScope | None = None
    done: trio.Event | None = None
    incarnation: int = 0
    running: bool = False
    restart_at: float | None = None
    frozen_at: float | None = None
    """Its clock stands still at this virtual time (:meth:`SimCluster.freeze`)."""
    blocking: bool = False
    """In a call through its ``run_blocking`` seam (the writer thread)."""
    sync_debt: float = 0.0
    """Seconds of slow syncs made in that call: it returns that much later."""
    blocked_until: float = 0.0
    """An inline slow sync blocks its event loop until then: its clock reads at least
    this (it jumped when the sync returned) and its network is held until then."""
    skew_ns: int = 0
    """Its wall clock's distance from the others' (the seed's ``clock_skew_ms``)."""
    clock_step_ns: int = 0
    """How far its wall clock was stepped (the fault ``clock-step``; the machine's clock:
    kept across restarts)."""

    def clock_ns(self) -> int:
        """The member's monotonic clock: virtual time, unless frozen (or blocked)."""
        frozen = self.frozen_at
        now = trio.current_time() if frozen is None else frozen
        return int(max(now, self.blocked_until) * 1e9)

    def wall_clock_ns(self) -> int:
        """The member's wall clock (epoch ns): its monotonic clock, skewed and stepped."""
        return EPOCH_OFFSET_NS + self.skew_ns + self.clock_step_ns + self.clock_ns()

    def state(self) -> str:
        node = self.node
        if node is None or not self.running:
            return f"n{self.index}: down"
        cm = getattr(node, "cm", None)
        archive = getattr(node, "archive", None)
        log_agent = getattr(node, "log_agent", None)
        if cm is None:
            return f"n{self.index}: starting"
        return (
            f"n{self.index}: {cm.role.name} term={cm.leadership_term_id} "
            f"leader={cm.leader_member_id} commit={cm.commit_position} "
            f"append={archive.position if archive is not None else '?'} "
            f"applied={log_agent.applied_position if log_agent is not None else '?'}"
        )


# ---------------------------------------------------------------------- invariants


class Checker:
    """Invariants over the nodes' state, checked incrementally."""

    def __init__(self, sim: SimCluster) -> None:
        self.sim = sim
        self.leaders: dict[int, int] = {}  # term -> leader member id
        self.committed = bytearray()  # the longest committed log seen
        self.records: dict[int, Any] = {}  # end position -> decoded record of `committed`
        self.sessions_opened: dict[int, int] = {}  # session id -> position of its open event
        self._parsed = 0
        self.verified: dict[int, int] = {}  # node -> its log matches `committed` up to here
        self.journal_seen: dict[tuple[int, int], int] = {}  # (node, incarnation) -> entries
        self.last_applied: dict[tuple[int, int], int] = {}
        self.pending_applied: list[tuple[int, tuple[int, int], int, int, bytes]] = []
        self.sequences: dict[int, int] = {}  # session -> its last sequence in `committed`
        self.closed_at: dict[int, int] = {}  # session -> position of its committed close
        #: (node, (incarnation, installs), session) -> its last sequence applied there
        self.applied_sequences: dict[tuple[int, tuple[int, int], int], int] = {}
        self.max_term: dict[tuple[int, int], int] = {}
        #: (8) session -> the payloads of the replies given to it, by number (from 1)
        self.replies: dict[int, list[bytes]] = {}
        #: (8) sessions some member dropped unconfirmed replies of (the kept bound)
        self.replies_trimmed: set[int] = set()
        #: (8) session -> how many of its delivered replies were checked
        self.delivered_checked: dict[int, int] = {}
        self.checks = 0
        self.elections_seen = 0
        #: (11) cluster time and timers
        self.clocks = ClockChecker(self.fail)
        #: (9) the queries' answers
        self.queries = QueryChecker(self.fail, lambda: len(self.committed))

    def fail(self, reason: str) -> None:
        raise _Violation(reason)

    # -- log -------------------------------------------------------------------------

    def _extend_committed(self, data: bytes) -> None:
        self.committed += data
        for offset, body in iter_records(self.committed, self._parsed):
            end = offset + 8 + len(body)
            record = self.records[end] = LOG.decode(body)
            self._parsed = end
            self.queries.on_record(end, record, _decode_put)
            self.clocks.on_record(end, record)
            if type(record) is SessionMessageHeader and record.sequence:
                self._check_sequence(record, end)
            elif isinstance(record, SessionCloseEvent):
                self.closed_at.setdefault(record.cluster_session_id, end)
            if isinstance(record, SessionOpenEvent):
                first = self.sessions_opened.setdefault(record.cluster_session_id, end)
                if first != end:
                    self.fail(
                        f"cluster session id {record.cluster_session_id} reused: opened at "
                        f"log position {first} and again at {end} (term "
                        f"{record.leadership_term_id})"
                    )

    def _check_sequence(self, record: SessionMessageHeader, end: int) -> None:
        """(7) a session's next message in the committed log is its next sequence, and
        the payload its client numbered so."""
        session_id, sequence = record.cluster_session_id, record.sequence
        last = self.sequences.get(session_id, 0)
        if sequence != last + 1:
            what = "twice" if sequence <= last else f"after {last}: a gap"
            self.fail(
                f"session {session_id}: message {sequence} committed at {end} {what} "
                "(exactly once in, in order)"
            )
        offered = self.sim.history.offered.get(session_id, [])
        if sequence > len(offered) or offered[sequence - 1] != record.payload:
            self.fail(
                f"session {session_id}: committed message {sequence} at {end} is not the "
                f"one its client numbered so (it offered {len(offered)})"
            )
        self.sequences[session_id] = sequence

    def check_node(self, sn: SimNode) -> None:
        node = sn.node
        if node is None or not sn.running:
            return
        cm = getattr(node, "cm", None)
        archive = getattr(node, "archive", None)
        if cm is None or archive is None:
            return
        i = sn.index
        key = (i, sn.incarnation)
        # (1) one leader per term
        term = cm.leadership_term_id
        if term > self.max_term.get(key, -1):
            self.max_term[key] = term
        elif term < self.max_term.get(key, -1):
            self.fail(f"n{i}: leadership term went back from {self.max_term[key]} to {term}")
        if cm.role is Role.LEADER:
            leader = self.leaders.setdefault(term, i)
            if leader != i:
                self.fail(f"two leaders in term {term}: n{leader} and n{i}")
        # (2) committed bytes never change
        position = archive.position
        verified = self.verified.get(i, 0)
        if position < verified:
            self.fail(f"n{i}: log truncated to {position} below its committed position {verified}")
        commit = min(cm.commit_position, position)
        if verified < archive.start_position:
            # compacted, or replaced by a snapshot install: only what it holds is checked
            if archive.start_position > len(self.committed):
                self.fail(
                    f"n{i}: its log begins at {archive.start_position}, past the committed "
                    f"log seen ({len(self.committed)})"
                )
            verified = min(archive.start_position, commit)
        if commit > verified:
            try:
                data = archive.read(verified, commit)
            except OSError:  # its power went (a cut mid-operation): checked once back
                return
            common = min(commit, len(self.committed))
            if common > verified:
                mine = data[: common - verified]
                theirs = self.committed[verified:common]
                if mine != theirs:
                    at = verified + next(k for k in range(len(mine)) if mine[k] != theirs[k])
                    pending = cm.log.pending_truncate
                    self.fail(
                        f"n{i}: committed log differs from the committed log seen at "
                        f"position {at} (its commit {cm.commit_position}, term {term}"
                        + (
                            f", while a truncation to {pending} is pending)"
                            if pending is not None
                            else ")"
                        )
                    )
            if commit > len(self.committed):
                self._extend_committed(data[len(self.committed) - verified :])
            self.verified[i] = commit
        # (3) applied <= commit; applied messages are the committed records
        log_agent = getattr(node, "log_agent", None)
        if log_agent is not None and log_agent.applied_position > cm.commit_position:
            self.fail(
                f"n{i}: applied position {log_agent.applied_position} is past its commit "
                f"position {cm.commit_position}"
            )
        service = sn.service
        if service is not None:
            seen = self.journal_seen.get(key, 0)
            journal = service.journal
            if len(journal) > seen:
                last = self.last_applied.get(key, -1)
                installs = service.install_points
                for index, (pos, session_id, payload) in enumerate(journal[seen:], seen):
                    if pos <= last:
                        self.fail(f"n{i}: applied position {pos} after {last} (twice?)")
                    if pos > cm.commit_position:
                        self.fail(
                            f"n{i}: applied a message at {pos} past its commit position "
                            f"{cm.commit_position}"
                        )
                    last = pos
                    # a snapshot installed meanwhile starts its sessions anew
                    era = (sn.incarnation, bisect.bisect_right(installs, index))
                    self.pending_applied.append((i, era, pos, session_id, payload))
                self.last_applied[key] = last
                self.journal_seen[key] = len(journal)
        if self.pending_applied:
            self._check_applied()

    def _check_applied(self, final: bool = False) -> None:
        still = []
        for i, era, pos, session_id, payload in self.pending_applied:
            if pos > len(self.committed):
                if final:
                    self.fail(f"n{i}: applied a message at {pos}, never committed")
                still.append((i, era, pos, session_id, payload))
                continue
            record = self.records.get(pos)
            if (
                type(record) is not SessionMessageHeader
                or record.cluster_session_id != session_id
                or record.payload != payload
            ):
                self.fail(
                    f"n{i}: applied session {session_id} message at {pos}, but the committed "
                    f"record there is {record!r:.200}"
                )
            assert isinstance(record, SessionMessageHeader)
            if record.sequence:
                # (7) in each member, in order, none twice (from wherever its log or a
                # snapshot let it start in this incarnation)
                key = (i, era, session_id)
                last = self.applied_sequences.get(key)
                if last is not None and record.sequence != last + 1:
                    self.fail(
                        f"n{i}: applied session {session_id}'s message {record.sequence} "
                        f"after {last}"
                    )
                self.applied_sequences[key] = record.sequence
        self.pending_applied = still

    def check(self) -> None:
        self.checks += 1
        for sn in self.sim.nodes:
            self.check_node(sn)
        self._check_delivered()
        self.queries.check_values()

    # -- exactly once out (8) ----------------------------------------------------------

    def reply_given(
        self, member: int, session_id: int, number: int, payload: bytes, trimmed: bool
    ) -> None:
        """Member ``member`` gave ``session_id`` its reply ``number`` while applying an
        entry (called at once, before anything can send it): the same bytes on every
        member, and numbered after the one before it."""
        given = self.replies.setdefault(session_id, [])
        if trimmed:
            self.replies_trimmed.add(session_id)
        if number <= len(given):
            if given[number - 1] != payload:
                self.fail(
                    f"n{member}: session {session_id}'s reply {number} is {payload!r:.80}, "
                    f"another member gave {given[number - 1]!r:.80} (replies deterministic)"
                )
        elif number == len(given) + 1:
            given.append(payload)
        else:
            self.fail(
                f"n{member}: gave session {session_id} reply {number}, but no member gave "
                f"more than {len(given)} before it"
            )

    def _check_delivered(self) -> None:
        """(8) each session's application got its replies in order, once, each the bytes
        the members gave under its number; a gap only where the kept bound dropped some."""
        for session_id, delivered in self.sim.history.delivered.items():
            checked = self.delivered_checked.get(session_id, 0)
            if checked == len(delivered):
                continue
            given = self.replies.get(session_id, [])
            last = delivered[checked - 1][0] if checked else 0
            for number, payload in delivered[checked:]:
                if number <= last:
                    self.fail(
                        f"session {session_id}: its client got reply {number} after "
                        f"{last} (twice, or out of order)"
                    )
                if number != last + 1 and session_id not in self.replies_trimmed:
                    self.fail(
                        f"session {session_id}: its client got reply {number} after {last}: "
                        "a gap, with every reply kept (exactly once out)"
                    )
                if number > len(given):
                    self.fail(
                        f"session {session_id}: its client got reply {number}, but the "
                        f"members gave {len(given)}"
                    )
                if payload != given[number - 1]:
                    self.fail(
                        f"session {session_id}: its client got {payload!r:.80} as reply "
                        f"{number}, the members gave {given[number - 1]!r:.80}"
                    )
                last = number
            self.delivered_checked[session_id] = len(delivered)

    def replies_undelivered(self, client: SimClient) -> int:
        """How many replies given to ``client``'s session it has not received."""
        if client.session_id < 0:
            return 0
        return len(self.replies.get(client.session_id, [])) - client.received_reply

    # -- end of run ------------------------------------------------------------------

    def expected_store(
        self, upto: int, count_from: int = 0
    ) -> tuple[dict[str, bytes], dict[int, int], dict[int, int]]:
        """Apply the committed log up to ``upto`` as the KV service does (every message
        of an open session, once: exactly once in needs no dedupe of the service's): the
        store, applications per request id of the entries after ``count_from``, and how
        often each request id is in the log."""
        store: dict[str, bytes] = {}
        applied: dict[int, int] = {}
        in_log: dict[int, int] = {}
        sessions: set[int] = set()
        for end, record in self.records.items():
            if end > upto:
                break
            if isinstance(record, SessionOpenEvent):
                sessions.add(record.cluster_session_id)
            elif isinstance(record, SessionCloseEvent):
                sessions.discard(record.cluster_session_id)
            elif type(record) is SessionMessageHeader:
                if record.cluster_session_id not in sessions:
                    continue
                put = _decode_put(record.payload)
                rid = put.request_id
                in_log[rid] = in_log.get(rid, 0) + 1
                store[put.key] = put.value
                if end > count_from:
                    applied[rid] = applied.get(rid, 0) + 1
        return store, applied, in_log

    def final(self, history: History) -> None:
        self.check()
        self._check_applied(final=True)
        if history.bad_responses:
            self.fail(f"bad responses: {history.bad_responses[:3]}")
        # (7) a CLOSED told the last applied; a session that stayed open has it all
        for session_id, told in history.closed_told.items():
            if session_id in self.closed_at and told != self.sequences.get(session_id, 0):
                self.fail(
                    f"session {session_id}: CLOSED told {told} applied, the committed log "
                    f"holds {self.sequences.get(session_id, 0)} before its close"
                )
        for client in self.sim.clients:
            session_id = client.session_id
            if session_id < 0 or session_id in self.closed_at:
                continue
            offered = len(history.offered.get(session_id, []))
            if self.sequences.get(session_id, 0) != offered:
                self.fail(
                    f"session {session_id} stayed open, but of the {offered} messages its "
                    f"client offered {self.sequences.get(session_id, 0)} are committed"
                )
            # (8) ...and got every reply given to it
            given = len(self.replies.get(session_id, []))
            delivered = history.delivered.get(session_id, [])
            got = delivered[-1][0] if delivered else 0
            if got != given:
                self.fail(
                    f"session {session_id} stayed open, but of the {given} replies the "
                    f"members gave it its client got {got}"
                )
        store, applied_counts, log_counts = self.expected_store(len(self.committed))
        self.queries.final(store)
        for request_id, count in log_counts.items():
            op = history.ops.get(request_id)
            sends = op.sends if op is not None else 0
            if count > sends:
                self.fail(
                    f"request {request_id} is {count} times in the committed log but was "
                    f"sent {sends} times"
                )
            sessions = len(set(op.sessions)) if op is not None else 0
            if applied_counts.get(request_id, 0) > sessions:
                self.fail(
                    f"request {request_id} applied {applied_counts[request_id]} times but "
                    f"sent on {sessions} sessions"
                )
        for sn in self.sim.nodes:
            node, service = sn.node, sn.service
            if node is None or service is None:
                continue
            applied = node.log_agent.applied_position
            # a member restarted from a snapshot saw only the messages after it
            journal = service.journal[service.installed_at :]
            first = journal[0][0] - 1 if journal else applied
            expected, counts, _ = self.expected_store(applied, first)
            if service.store != expected:
                missing = [k for k in expected if service.store.get(k) != expected[k]]
                extra = [k for k in service.store if k not in expected]
                self.fail(
                    f"n{sn.index}: store differs from the committed log applied to {applied}: "
                    f"wrong/missing {missing[:5]}, extra {extra[:5]}"
                )
            if service.applications != counts:
                wrong = {
                    rid: (service.applications.get(rid, 0), counts.get(rid, 0))
                    for rid in service.applications | counts
                    if service.applications.get(rid, 0) != counts.get(rid, 0)
                }
                self.fail(
                    f"n{sn.index}: applications per request differ from the committed log "
                    f"(request: (applied, expected)): {dict(list(wrong.items())[:5])}"
                )
            for op in history.acked:
                if service.store.get(op.key) != op.value:
                    self.fail(
                        f"n{sn.index}: acknowledged write {op.request_id} ({op.key}) is "
                        f"missing (applied to {applied}, committed {len(self.committed)})"
                    )


# ---------------------------------------------------------------------- the cluster


@contextlib.contextmanager
def deterministic_trio(seed: int) -> Iterator[None]:
    """Trio's scheduler is randomised; make it a function of ``seed`` (private API)."""
    import trio._core._run as trio_run

    saved = trio_run._ALLOW_DETERMINISTIC_SCHEDULING
    trio_run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]
    trio_run._r.seed(seed)
    try:
        yield
    finally:
        trio_run._ALLOW_DETERMINISTIC_SCHEDULING = saved  # type: ignore[misc]


class _TraceLogHandler(logging.Handler):
    def __init__(self, sim: SimCluster) -> None:
        super().__init__(logging.DEBUG)
        self.sim = sim

    def emit(self, record: logging.LogRecord) -> None:
        try:
            now = trio.current_time()
        except RuntimeError:
            now = math.nan
        try:
            text = record.getMessage()
        except Exception:  # pragma: no cover - a bad log call must not end the run
            text = str(record.msg)
        self.sim.log_lines.append(f"{now:10.4f} log {record.levelname} {record.name}: {text}")


def sim_clock(overshoot: float = 0.0) -> trio.testing.MockClock:
    """``MockClock(autojump_threshold=0)``, optionally jumping ``overshoot`` s past deadlines.

    Autojump lands exactly on a deadline, which a real clock never does: code that
    re-derives the deadline with different float arithmetic (``now - last >= d`` after
    sleeping until ``last + d``) may see it as not yet reached and spin, stopping virtual
    time (:class:`_LivelockDetector` then fails the run).  Exact jumps (the default) find
    such code; an overshoot of 1e-9 s behaves like a real clock.  MockClock is final, so
    its private ``_autojump`` hook (trio 0.35) is replaced on the instance.
    """
    clock = trio.testing.MockClock(autojump_threshold=0)
    if overshoot:

        def autojump() -> None:
            jump = trio.lowlevel.current_statistics().seconds_to_next_deadline
            if 0 < jump < math.inf:
                clock.jump(jump + overshoot)

        clock._autojump = autojump  # type: ignore[method-assign]
    return clock


class _LivelockDetector(trio.abc.Instrument):
    """Fail the run when tasks keep running while virtual time stands still.

    Under autojump a task that spins (wakes at a deadline it thinks has not passed, and
    waits again on that same deadline) stops the clock for good: the run would hang.
    """

    def __init__(self, sim: SimCluster, limit: int = 50_000) -> None:
        self.sim = sim
        self.limit = limit
        self.at = -1.0
        self.steps = 0
        self.busiest: collections.Counter[str] = collections.Counter()
        self.tripped = False

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        now = trio.current_time()
        if now != self.at:
            self.at = now
            self.steps = 0
            if self.busiest:
                self.busiest.clear()
            return
        self.steps += 1
        if self.steps > self.limit // 2:
            self.busiest[task.name] += 1
            if self.steps > self.limit and not self.tripped:
                self.tripped = True
                tasks = ", ".join(f"{n} x{c}" for n, c in self.busiest.most_common(3))
                self.sim._fail(
                    f"livelock: virtual time stuck at {now:.6f}s after {self.steps} task "
                    f"steps; busiest tasks: {tasks}"
                )


Scenario = Callable[["SimCluster"], Awaitable[None]]


def _catching_up(sn: SimNode) -> bool:
    """Is ``sn``'s member a catch-up member (new or lost state, not voting yet)?"""
    cm = getattr(sn.node, "cm", None)
    return cm is None or cm.voting.catching_up


class SimCluster:
    """N nodes, K clients, a nemesis and the checker in one deterministic ``trio.run``."""

    def __init__(
        self,
        seed: int,
        nodes: int = 3,
        tmp_path: Path | str | None = None,
        *,
        trace: bool = False,
        keep_dirs: bool = True,
        **config_overrides: Any,
    ) -> None:
        self.seed = seed
        self.config = SimConfig.from_seed(seed, nodes, **config_overrides)
        if tmp_path is None:
            raise TypeError("tmp_path is required")
        self.dir = Path(tmp_path) / f"sim-{seed}-{nodes}"
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.keep_dirs = keep_dirs
        self.print_trace = trace
        rng = random.Random(seed)
        self.net = SimNetwork(
            random.Random(rng.getrandbits(64)),
            latency=self.config.latency,
            reset_probability=self.config.reset_probability,
            keep_trace=trace,
        )
        self.nodes = [
            SimNode(i, f"n{i}", self.dir / f"node-{i}", random.Random(rng.getrandbits(64)))
            for i in range(nodes)
        ]
        self.disk = DiskModel()
        for sn in self.nodes:
            self.disk.add_root(sn.dir)
        self.disk.on_power_lost = self._power_lost
        self.disk_faults = DiskFaults(self, seed)
        self.disk.on_slow_sync = self.disk_faults.on_slow_sync
        self.workload_rng = random.Random(rng.getrandbits(64))
        self.nemesis_rng = random.Random(rng.getrandbits(64))
        self.history = History()
        self.clients: list[SimClient] = []
        self.checker = Checker(self)
        self.trace: list[tuple[Any, ...]] = []
        self.log_lines: list[str] = []
        self._hash = hashlib.sha256()
        self._nursery: trio.Nursery | None = None
        self._client_scopes: list[trio.CancelScope] = []
        self._failure: str | None = None
        self.stats: dict[str, int] = {
            "crashes": 0,
            "torn": 0,
            "restarts": 0,
            "partitions": 0,
            "pauses": 0,
            "freezes": 0,
            "elections": 0,
            "snapshot_requests": 0,
            "compactions": 0,
            "snapshots_installed": 0,
            "wipes": 0,
            "power_cuts": 0,
            "cluster_stops": 0,
            "stopped_by_action": 0,
            "clock_steps": 0,
        }
        self.stops_seen: set[tuple[int, int]] = set()
        """(member, log position) of every SHUTDOWN or ABORT that stopped a member."""
        self.adversary: Adversary | None = None
        self.members = members_string(nodes)
        self.endpoints = ingress_endpoints(nodes)
        self._next_client = 0
        self.commit_high = 0
        """The highest commit position any member was seen to have (:meth:`committed_now`)."""

    # ------------------------------------------------------------------ tracing

    def event(self, who: str, kind: str, *detail: Any) -> None:
        entry = (round(trio.current_time(), 9), who, kind, *detail)
        self._hash.update(repr(entry).encode())
        if self.print_trace:
            self.trace.append(entry)

    @property
    def trace_hash(self) -> str:
        h = self._hash.copy()
        h.update(self.net.trace_hash.encode())
        return h.hexdigest()

    def format_trace(self, tail: int | None = None) -> str:
        lines = [
            f"{e[0]:10.4f} {e[1]} {e[2]} {' '.join(map(str, e[3:]))}".rstrip() for e in self.trace
        ]
        if tail is not None:
            lines = lines[-tail:]
        return "\n".join(lines)

    # ------------------------------------------------------------------ nodes

    def _node_config(self, i: int) -> NodeConfig:
        return NodeConfig(
            member_id=i,
            members=self.members,
            dir=str(self.nodes[i].dir),
            segment_size=self.config.segment_size,
            **{"stall_threshold": 0, **self.config.node},  # real time means nothing here
        )

    async def _run_blocking(self, sn: SimNode, fn: Callable[..., Any], *args: Any) -> Any:
        """Archive I/O inline (no threads), after a seeded disk latency; a slow disk's
        syncs made in it make it return that much later (:mod:`tests.sim.disk_faults`)."""
        await trio.sleep(sn.rng.uniform(*self.config.disk_latency))
        if fn is compact:
            # the checker reads committed log from the members' archives: let it see what
            # a compaction is about to delete (a check every 10 ms could miss it)
            self.checker.check()
        sn.blocking, sn.sync_debt = True, 0.0
        try:
            result = fn(*args)
        finally:
            sn.blocking = False
        if sn.sync_debt:
            # the thread is still in its sync: a caller cancelled meanwhile waits for it
            # (cluster/agents/worker.py), as a killed process stuck in fsync does
            debt, sn.sync_debt = sn.sync_debt, 0.0
            with trio.CancelScope(shield=True):
                await trio.sleep(debt)
        return result

    async def _node_task(
        self, sn: SimNode, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        skew = self.config.clock_skew_ms[sn.index] if self.config.clock_skew_ms else 0
        sn.skew_ns = skew * 1_000_000
        checker, member = self.checker, sn.index
        service = SimKV(
            lambda session_id, number, payload, trimmed: checker.reply_given(
                member, session_id, number, payload, trimmed
            ),
            (
                (lambda cid, deadline: checker.clocks.scheduled(member, cid, deadline))
                if CLOCK_STEP in self.config.faults
                else None
            ),
        )
        sn.incarnation += 1
        sn.frozen_at = None  # a new process
        sn.blocking, sn.sync_debt = False, 0.0
        node = _ObservedNode(
            self._node_config(sn.index),
            service,
            authenticator=(
                SharedSecretAuthenticator({APP: APP_SECRET}) if self.config.authenticate else None
            ),
            network=self.net.host(sn.host),
            clock_ns=sn.clock_ns,
            wall_clock_ns=sn.wall_clock_ns,
            rng=random.Random(sn.rng.getrandbits(64)),
            run_blocking=lambda fn, *args: self._run_blocking(sn, fn, *args),
        )
        sn.node, sn.service = node, service
        sn.done = trio.Event()
        sn.running = True
        self.event(sn.host, "start", sn.incarnation)
        started = False
        try:
            with trio.CancelScope() as scope:
                sn.scope = scope
                task_status.started()
                started = True
                await node.run(handle_signals=False)
            if not scope.cancelled_caught and not self.disk.is_dead(sn.dir):
                self._stopped_by_itself(sn, node)
        except Exception as exc:
            self.log_lines.append("".join(traceback.format_exception(exc)))
            if self.disk.is_dead(sn.dir) and not isinstance(exc, (_Violation, DiskModelError)):
                self.event(sn.host, "died", _leaf(exc))  # its disk failing as the power went
            elif self.disk_faults.refused(sn, exc):
                pass  # its rotted log found and refused: the remedy follows
            else:
                self._fail(f"n{sn.index} raised {_leaf(exc)}")
            if not started:
                task_status.started()
        finally:
            self._note_commit(sn)  # what it committed counts once it has stopped
            sn.running = False
            catchup = getattr(node, "catchup", None)
            if catchup is not None:
                self.stats["compactions"] += catchup.compactions
                self.stats["snapshots_installed"] += catchup.installs
            sn.done.set()

    def _stopped_by_itself(self, sn: SimNode, node: Node) -> None:
        """A member may stop by itself only for a SHUTDOWN or ABORT that it applied live,
        in its own term, once (issue 41: an admin action acts on the cluster it was given
        to, and never again); it is started again a little later, as an operator would."""
        i = sn.index
        stopped_by = node.snapshots.stopped_by
        if stopped_by is None:
            self._fail(f"n{i} stopped by itself")
            return
        position, action = stopped_by
        if position <= node.snapshots.recovered_position:
            self._fail(f"n{i} stopped for the action at {position}, replayed at start-up")
        assert isinstance(node, _ObservedNode)
        term = node.action_terms.get(position, node.cm.leadership_term_id)
        if action.leadership_term_id != term:
            self._fail(
                f"n{i} in term {term} stopped for the action at {position} of term "
                f"{action.leadership_term_id}"
            )
        if (i, position) in self.stops_seen:
            self._fail(f"n{i} stopped twice for the action at log position {position}")
        self.stops_seen.add((i, position))
        self.stats["stopped_by_action"] += 1
        self.event(sn.host, "stopped", action.action.name, position)
        if self._nursery is not None:
            delay = self.nemesis_rng.uniform(0.2, 2.0)
            self._nursery.start_soon(self._restart_later, i, delay)

    async def stop_cluster(self, abort: bool) -> bool:
        """An operator's ABORT (or SHUTDOWN) through the leader; whether it was taken."""
        leader = self.leader()
        node = self.nodes[leader].node if leader is not None else None
        if node is None or not node.cm.is_ready_leader:
            return False
        action = ClusterAction.ABORT if abort else ClusterAction.SNAPSHOT
        ok, message = False, "the leader stopped before it answered"
        with trio.move_on_after(1.0):
            ok, message = await node.request_action(action, terminate=not abort)
        self.event(f"n{leader}", "abort" if abort else "shutdown", ok, message)
        self.stats["cluster_stops"] += ok
        return ok

    async def start(self, i: int) -> None:
        assert self._nursery is not None
        await self._nursery.start(self._node_task, self.nodes[i])

    async def crash(self, i: int, *, torn: bool = False) -> None:
        """Kill node ``i`` like a process crash; with ``torn`` its last write tears."""
        sn = self.nodes[i]
        if not sn.running:
            return
        self.checker.check_node(sn)  # what it applied before dying still counts
        self._note_commit(sn)
        self.net.crash(sn.host)
        assert sn.scope is not None
        assert sn.done is not None
        sn.running = False  # the checker must not read it while it unwinds
        sn.scope.cancel()
        await sn.done.wait()
        self.stats["crashes"] += 1
        detail = ""
        if torn:
            detail = self._tear(sn)
        self.event(sn.host, "crash", "torn" if torn else "", detail)

    def _tear(self, sn: SimNode) -> str:
        segments = list_segments(sn.dir / "archive")
        if not segments:
            return "no segment"
        last = segments[-1]
        rng = sn.rng
        promised = rng.randint(16, 400)
        partial = rng.randint(0, promised - 1)
        header = struct.pack("<II", promised, rng.getrandbits(32))
        written = rng.randint(1, 8) if rng.random() < 0.2 else 8
        data = header[:written] + (rng.randbytes(partial) if written == 8 else b"")
        if written == 8 and zlib.crc32(data[8:]) == struct.unpack("<I", header[4:])[0]:
            data = data[:-1]  # never a valid record by accident
        fd = os.open(last.path, os.O_WRONLY | os.O_APPEND)  # through the disk model
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        self.stats["torn"] += 1
        return f"{len(data)} bytes at {last.end}"

    async def wipe(self, i: int) -> None:
        """Crash node ``i`` and lose its whole data directory (a new disk)."""
        await self.crash(i)
        shutil.rmtree(self.nodes[i].dir, ignore_errors=True)
        self.checker.verified.pop(i, None)
        self.disk_faults.wiped(i)
        self.stats["wipes"] += 1
        self.event(self.nodes[i].host, "wipe")

    def _power_lost(self, path: str) -> None:
        """The disk model says a member's power went in the middle of what it was doing
        (its disk fails every change from now on): it stops at its next checkpoint."""
        for sn in self.nodes:
            if os.path.abspath(sn.dir) == path and sn.running and sn.scope is not None:
                self.event(sn.host, "power-lost")
                self.net.crash(sn.host)
                sn.scope.cancel()

    async def power_cut(
        self, victims: list[int], *, mid_operation: random.Random | None = None
    ) -> None:
        """Cut the power of ``victims`` at once: each stops (if it runs) and loses what it
        had not made durable (``tests/sim/disk.py``), its first unsynced page of each
        file perhaps torn.  ``mid_operation``: the power of each running victim goes
        just before a random one of its next 40 disk changes (an RNG draws which), or
        after a second of virtual time, in the middle of whatever it does."""
        if mid_operation is not None:
            armed = [sn for sn in (self.nodes[i] for i in victims) if sn.running]
            for sn in armed:
                self.disk.arm(sn.dir, mid_operation.randint(1, 40))
            with trio.move_on_after(1.0):
                while not all(self.disk.is_dead(sn.dir) for sn in armed):  # noqa: ASYNC110
                    await trio.sleep(0.001)
        for i in victims:
            await self.crash(i)
        for i in victims:
            sn = self.nodes[i]
            try:
                report = self.disk.power_cut(sn.dir, sn.rng)
            except DiskModelError as exc:
                raise _Violation(f"n{i}: {exc}") from None
            self.stats["power_cuts"] += 1
            self.event(sn.host, "power-cut", str(report))

    async def restart(self, i: int) -> None:
        sn = self.nodes[i]
        if sn.running:
            return
        self.stats["restarts"] += 1
        await self.start(i)

    def pause(self, i: int, duration: float) -> None:
        self.stats["pauses"] += 1
        self.event(self.nodes[i].host, "pause", round(duration, 4))
        self.net.clog(self.nodes[i].host, duration)

    def freeze(self, i: int) -> None:
        """Stop member ``i``'s clock until :meth:`heal` (or its next start): it runs and
        talks, but no timeout of its own ever fires, so it never notices by itself that
        it lost its followers (a leader cut off with it goes on believing it leads, as a
        paused process would; ReadIndex must not answer from its state: (9))."""
        sn = self.nodes[i]
        if sn.running and sn.frozen_at is None:
            sn.frozen_at = trio.current_time()
            self.stats["freezes"] += 1
            self.event(sn.host, "freeze")

    def step_clock(self, i: int, step_ns: int) -> None:
        """Step member ``i``'s wall clock by ``step_ns`` (back if negative): its
        monotonic clock goes on as before."""
        sn = self.nodes[i]
        sn.clock_step_ns += step_ns
        self.stats["clock_steps"] += 1
        self.event(sn.host, "clock-step", round(step_ns / 1e9, 3))

    def partition(self, *groups: list[int]) -> None:
        self.stats["partitions"] += 1
        self.event("net", "partition", *groups)
        self.net.partition(*([self.nodes[i].host for i in g] for g in groups))

    def heal(self) -> None:
        self.event("net", "heal")
        self.net.heal()
        for sn in self.nodes:
            sn.frozen_at = None
        for a in self.nodes:
            for b in self.nodes:
                self.net.set_latency(a.host, b.host, self.config.latency)

    # ------------------------------------------------------------------ observation

    def leader(self) -> int | None:
        """The running leader with the highest term, if any."""
        best: tuple[int, int] | None = None
        for sn in self.nodes:
            node = sn.node
            cm = getattr(node, "cm", None) if sn.running else None
            if (
                cm is not None
                and cm.role is Role.LEADER
                and (best is None or cm.leadership_term_id > best[0])
            ):
                best = (cm.leadership_term_id, sn.index)
        return None if best is None else best[1]

    async def wait_for(self, what: str, predicate: Callable[[], bool], within: float) -> None:
        """Poll node state (nothing signals it) until ``predicate``; else a liveness failure."""
        with trio.move_on_after(within):
            while not predicate():  # noqa: ASYNC110
                await trio.sleep(CHECK_INTERVAL)
            return
        raise _Violation(f"liveness: {what} within {within}s")

    async def wait_for_leader(self, within: float = 10.0) -> int:
        await self.wait_for("no leader", lambda: self.leader() is not None, within)
        leader = self.leader()
        assert leader is not None
        return leader

    def role_of(self, i: int) -> Role | None:
        sn = self.nodes[i]
        cm = getattr(sn.node, "cm", None) if sn.running else None
        return None if cm is None else cm.role

    def term_of(self, i: int) -> int:
        sn = self.nodes[i]
        cm = getattr(sn.node, "cm", None) if sn.running else None
        return -1 if cm is None else int(cm.leadership_term_id)

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)

    def node_states(self) -> str:
        return "; ".join(sn.state() for sn in self.nodes)

    # ------------------------------------------------------------------ clients

    def new_client(self, **options: Any) -> SimClient:
        index = self._next_client
        self._next_client += 1
        options.setdefault("window", self.config.client_window)
        # half the clients take their egress on their ingress connection (the default
        # of the real client), half listen for it (the seeds' response channel)
        options.setdefault("own_egress", index % 2 == 1)
        if self.config.authenticate:
            options.setdefault("credentials", SharedSecretCredentials(APP, APP_SECRET))
        return SimClient(
            index,
            self.net,
            self.endpoints,
            random.Random(self.workload_rng.getrandbits(64)),
            self.history,
            trace=self.event,
            committed=self.committed_now,
            on_answer=self._query_answered,
            **options,
        )

    def committed_now(self) -> int:
        """The highest commit position any member has now or had (also one that has
        stopped since, before the checker read its log), for (9)."""
        for sn in self.nodes:
            if sn.running:
                self._note_commit(sn)
        return max(self.commit_high, len(self.checker.committed))

    def _note_commit(self, sn: SimNode) -> None:
        node = sn.node
        cm = getattr(node, "cm", None)
        archive = getattr(node, "archive", None)
        if cm is not None and archive is not None:
            self.commit_high = max(self.commit_high, min(cm.commit_position, archive.position))

    def _query_answered(self, answer: Answer) -> None:
        """(9) at each OK answer, as it arrives."""
        try:
            self.checker.queries.answered(answer)
        except _Violation as exc:
            self._fail(str(exc))

    async def write(self, within: float = 10.0) -> int:
        """One write through a fresh client; returns its request id once acknowledged."""
        assert self._nursery is not None
        probe = self.new_client(max_ops=1, window=1)
        scope = trio.CancelScope()
        self._nursery.start_soon(self._run_client, probe, scope)
        try:
            await self.wait_for("a write was not acknowledged", lambda: probe.done, within)
        finally:
            scope.cancel()
        (op,) = [op for op in self.history.ops.values() if op.client == probe.index]
        return op.request_id

    def spawn_client(self, client: SimClient) -> trio.CancelScope:
        """Run ``client`` until the returned scope is cancelled (or the run ends)."""
        assert self._nursery is not None
        scope = trio.CancelScope()
        self._nursery.start_soon(self._run_client, client, scope)
        return scope

    async def _run_client(self, client: SimClient, scope: trio.CancelScope) -> None:
        with scope:
            await client.run()

    def add_client(self, client: SimClient) -> None:
        """Run ``client`` as one of the workload's: the liveness phase stops it, waits
        for what it offered and the replies to it, and the end checks its session."""
        self.clients.append(client)
        self._client_scopes.append(self.spawn_client(client))

    async def start_workload(self) -> None:
        for _ in range(self.config.clients):
            self.add_client(self.new_client(query_share=self.config.query_share))

    def stop_workload(self) -> None:
        for scope in self._client_scopes:
            scope.cancel()

    # ------------------------------------------------------------------ nemesis

    async def nemesis(self, duration: float) -> None:
        """Inject the seed's faults for ``duration`` seconds of virtual time."""
        assert self._nursery is not None
        rng = self.nemesis_rng
        config = self.config
        end = trio.current_time() + duration
        n = len(self.nodes)
        while True:
            await trio.sleep(rng.uniform(*config.fault_interval))
            if trio.current_time() >= end:
                return
            kind = rng.choice(config.faults)
            if rng.random() < 0.3:
                self.heal()
                continue
            if kind == "partition" and n > 1:
                order = list(range(n))
                rng.shuffle(order)
                cut = rng.randint(1, n - 1)
                self.partition(order[:cut], order[cut:])
            elif kind == "isolate-leader" and n > 1:
                leader = self.leader()
                if leader is None:
                    leader = rng.randrange(n)
                self.partition([leader], [i for i in range(n) if i != leader])
                if rng.random() < 0.5:
                    self.freeze(leader)  # ...and it never notices by itself
            elif kind == "one-way" and n > 1:
                a, b = rng.sample(range(n), 2)
                self.event("net", "one-way", a, b)
                self.net.one_way(self.nodes[a].host, self.nodes[b].host)
            elif kind == "crash":
                down = sum(not sn.running for sn in self.nodes)
                if down >= config.max_crashed:
                    continue
                leader = self.leader()
                running = [sn.index for sn in self.nodes if sn.running]
                victim = leader if leader is not None and rng.random() < 0.5 else None
                if victim is None:
                    victim = rng.choice(running)
                torn = rng.random() < config.torn_probability
                await self.crash(victim, torn=torn)
                self._nursery.start_soon(self._restart_later, victim, rng.uniform(0.2, 3.0))
            elif kind == "wipe" and n > 1:
                # A replaced disk: only while every other member runs and votes (two
                # members of three that lost their disks have lost what was acknowledged).
                if not all(sn.running and not _catching_up(sn) for sn in self.nodes):
                    continue
                if self.disk_faults.rots or self.disk_faults.repairing:
                    continue  # a rotted member is one that will lose its state too
                leader = self.leader()
                victim = leader if leader is not None and rng.random() < 0.5 else rng.randrange(n)
                await self.wipe(victim)
                self._nursery.start_soon(self._restart_later, victim, rng.uniform(0.2, 3.0))
            elif kind == POWER_CUT:
                draw = rng.random()
                if draw < 0.5 or n == 1:
                    victims = [rng.randrange(n)]
                elif draw < 0.75:
                    victims = rng.sample(range(n), (n - 1) // 2)
                else:
                    victims = list(range(n))  # a data-centre outage
                await self.power_cut(victims, mid_operation=rng if rng.random() < 0.5 else None)
                for victim in victims:
                    self._nursery.start_soon(self._restart_later, victim, rng.uniform(0.2, 3.0))
            elif kind == SLOW_DISK:
                self._nursery.start_soon(self.disk_faults.slow_spell, rng)
            elif kind == ROT:
                self.disk_faults.rot(rng.randrange(n), rng, misdirected=rng.random() < 0.5)
            elif kind == "pause":
                self.pause(rng.randrange(n), rng.uniform(0.05, 2.0))
            elif kind == "reset":
                victim = rng.randrange(n)
                self.event("net", "reset", victim)
                self.net.reset(self.nodes[victim].host)
            elif kind == STOP_CLUSTER:
                await self.stop_cluster(abort=rng.random() < 0.5)
            elif kind == CLOCK_STEP:
                leader = self.leader()
                victim = leader if leader is not None and rng.random() < 0.5 else rng.randrange(n)
                step = draw_step(rng)
                self.step_clock(victim, step)
                if n > 1 and rng.random() < 0.5:  # another member the other way
                    other = rng.choice([i for i in range(n) if i != victim])
                    self.step_clock(other, -draw_step(rng) if step > 0 else abs(draw_step(rng)))
            elif kind == "snapshot" and self.clients:
                self.stats["snapshot_requests"] += 1
                rng.choice(self.clients).request_snapshot()
            elif kind == "slow" and n > 1:
                a, b = rng.sample(range(n), 2)
                latency = rng.uniform(0.02, 0.3)
                self.event("net", "slow", a, b, round(latency, 4))
                self.net.set_latency(self.nodes[a].host, self.nodes[b].host, (latency, latency * 2))

    async def _restart_later(self, i: int, delay: float) -> None:
        await trio.sleep(delay)
        await self.restart(i)

    # ------------------------------------------------------------------ phases

    async def safety_phase(self) -> None:
        await self.start_workload()
        if self.config.adversary:
            assert self._nursery is not None
            self.adversary = Adversary(
                self, random.Random(f"adversary-{self.seed}"), CONSENSUS_PORT
            )
            self._nursery.start_soon(self.adversary.run, self.config.safety_duration)
        await self.nemesis(self.config.safety_duration)

    async def liveness_phase(self) -> None:
        """Heal, restart everyone, require a leader, a write, every open session's
        messages confirmed (exactly once in: its client kept none back) and every reply
        given to it received (exactly once out), and convergence."""
        for client in self.clients:
            client.stop()  # no new writes; what they hold goes on
        self.heal()
        self.disk_faults.end_slow()
        for sn in self.nodes:
            await self.restart(sn.index)
        self.event("sim", "liveness")
        timeout = self.config.liveness_timeout
        await self.wait_for_leader(timeout)
        await self.write(timeout)
        await self.wait_for(
            "a session's offered messages were not all confirmed",
            lambda: all(c.session_id < 0 or not c.outbox.unconfirmed for c in self.clients),
            timeout,
        )
        await self.wait_for(
            "a session's replies were not all received",
            lambda: not any(map(self.checker.replies_undelivered, self.clients)),
            timeout,
        )
        await self.wait_for(
            "a query was not answered", lambda: not any(c.queries for c in self.clients), timeout
        )
        await self.wait_for("a timer due did not fire", self._timers_fired, timeout)
        self.stop_workload()
        await self.wait_for("members did not converge", self._converged, timeout)

    def _timers_fired(self) -> bool:
        """(11) every timer due a second before the leader's cluster time has fired."""
        leader = self.leader()
        node = self.nodes[leader].node if leader is not None else None
        if node is None:
            return False
        self.checker.check()
        return not self.checker.clocks.overdue(node.cm.log.cluster_time(node.now_ns()))

    def _converged(self) -> bool:
        leader = self.leader()
        if leader is None:
            return False
        target = self.nodes[leader].node
        assert target is not None
        commit = target.cm.commit_position
        for sn in self.nodes:
            node = sn.node
            if not sn.running or node is None or getattr(node, "log_agent", None) is None:
                return False
            if node.cm.commit_position != commit or node.log_agent.applied_position != commit:
                return False
        return True

    async def _checker_task(self) -> None:
        while True:
            await trio.sleep(CHECK_INTERVAL)
            self.checker.check()
            self._observe_leaders()

    def _observe_leaders(self) -> None:
        for term, leader in self.checker.leaders.items():
            if term not in self._leaders_traced:
                self._leaders_traced[term] = leader
                self.stats["elections"] += 1
                self.event(f"n{leader}", "leader", term)

    def _fail(self, reason: str) -> None:
        if self._failure is None:
            self._failure = reason
            self.event("sim", "FAIL", reason)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def _main(self, scenario: Scenario | None, liveness: bool) -> None:
        self._leaders_traced: dict[int, int] = {}
        self.event("sim", "config", self.config.describe())
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._checker_task)
                for sn in self.nodes:
                    await self.start(sn.index)
                if scenario is None:
                    await self.safety_phase()
                else:
                    await scenario(self)
                if liveness:
                    await self.liveness_phase()
                self.checker.final(self.history)
                self.disk_faults.check_final()
                nursery.cancel_scope.cancel()
        except _Violation as exc:
            self._fail(str(exc))
        except BaseExceptionGroup as group:
            violations, rest = group.split(_Violation)
            if rest is not None:
                raise
            assert violations is not None
            first = violations.exceptions[0]
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            self._fail(str(first))

    # ------------------------------------------------------------------ running

    def _replay(self, scenario: Scenario | None) -> str:
        if scenario is not None:  # a scenario lives in a test: rerun that test
            test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
            return f".venv/bin/pytest '{test}'" if test else f"{scenario.__qualname__}"
        default = SimConfig.from_seed(self.seed, len(self.nodes))
        flags = ""
        if self.config.safety_duration != default.safety_duration:
            flags += f" --safety {self.config.safety_duration}"
        if self.config.clock_overshoot != default.clock_overshoot:
            flags += f" --clock-overshoot {self.config.clock_overshoot}"
        return replay_command(self.seed, len(self.nodes), flags)

    def run(self, scenario: Scenario | None = None, *, liveness: bool = True) -> SimResult:
        """Run the whole simulation; raise :class:`SimFailure` if an invariant broke."""
        logger = logging.getLogger("cluster")
        handler = _TraceLogHandler(self)
        saved = (logger.level, logger.propagate)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO if self.print_trace else logging.WARNING)
        logger.propagate = False
        clock = sim_clock(self.config.clock_overshoot)
        chunk_size = LeaderReplication.chunk_size
        LeaderReplication.chunk_size = SNAPSHOT_CHUNK
        try:
            with deterministic_trio(self.seed), self.disk.installed():
                trio.run(
                    self._main,
                    scenario,
                    liveness,
                    clock=clock,
                    instruments=[_LivelockDetector(self)],
                )
            for sn in self.nodes:  # nothing wrote around the disk model
                if self._failure is None:
                    try:
                        self.disk.verify(sn.dir)
                    except DiskModelError as exc:
                        self._failure = f"n{sn.index}: {exc}"
        finally:
            LeaderReplication.chunk_size = chunk_size
            logger.removeHandler(handler)
            logger.setLevel(saved[0])
            logger.propagate = saved[1]
            if not self.keep_dirs:
                shutil.rmtree(self.dir, ignore_errors=True)
        if self._failure is not None:
            tail = "\n".join(
                [*self.log_lines[-12:], f"nodes: {self.node_states()}"]
                + ([self.format_trace(40)] if self.print_trace else [])
            )
            raise SimFailure(
                self.seed, len(self.nodes), self._failure, tail, self._replay(scenario)
            )
        return SimResult(
            seed=self.seed,
            nodes=len(self.nodes),
            trace_hash=self.trace_hash,
            virtual_time=clock.current_time(),
            history=self.history.summary(),
            committed=len(self.checker.committed),
            terms=dict(self.checker.leaders),
            stats=dict(self.stats)
            | {f"net_{k}": v for k, v in self.net.stats.items()}
            | {f"disk_{k}": v for k, v in self.disk.stats.items()}
            | {k: v for k, v in self.disk_faults.stats.items() if v}
            | (
                {"timers_fired": len(self.checker.clocks.fired)}
                if CLOCK_STEP in self.config.faults
                else {}
            )
            | (
                {f"adversary_{k}": v for k, v in self.adversary.stats.items()}
                if self.adversary
                else {}
            ),
        )


@dataclass
class SimResult:
    seed: int
    nodes: int
    trace_hash: str
    virtual_time: float
    history: str
    committed: int
    terms: dict[int, int]
    stats: dict[str, int]

    def summary(self) -> str:
        return (
            f"seed {self.seed} nodes {self.nodes}: ok, {self.virtual_time:.1f}s virtual, "
            f"{self.history}, {self.committed} log bytes committed, "
            f"{len(self.terms)} terms, {self.stats}"
        )
