"""Transcript tests of the pure consensus core, as etcd-io/raft writes them.

Each file in ``testdata/`` is a scenario: commands, each followed by ``----`` and the
output it must produce, then a blank line.  A reader sees at a glance what happens
when members campaign, lose messages, split and heal; the test fails on any change
of behaviour and shows the file and line.  After a deliberate change of behaviour,
regenerate the expected output with ``REWRITE_TRANSCRIPTS=1 pytest
tests/unit/test_transcripts.py`` and read the diff before committing it.

Commands (member ids as in the cluster; time starts at 1 s):

``add-nodes N [seed=S]``
    N members (``ConsensusModule``\\s), none in an election yet.
``campaign ID``
    member ID enters an election (as at start-up, or after its leader timed out).
``tick [ID ...] [ms=N]``
    time moves N ms (default 10); the members (default: all up) run their slow tick
    and cycle work, leader timeouts included, and are driven.
``deliver [from=A] [to=B] [drop]``
    each queued message (of those links) is delivered, or dropped; one round: what the
    receivers send in reply stays queued.
``stabilize``
    leaders ship their log, messages are delivered, until nothing is queued.
``run [ms=N]``
    N ms (default 1000) of 10 ms ticks, each followed by ``stabilize``, with the
    replicators' empty AppendRequest to every follower each 200 ms (their heartbeat);
    only role changes and leader readiness are printed.
``propose ID TEXT``
    ready leader ID appends a client message (as its session's message would be).
``partition A B | C`` / ``heal``
    cut every link between the groups / restore all links.
``status``, ``log ID``
    every member's role, term and positions / the records in member ID's log.
``quorum N`` / ``committed N P1 P2 ...``
    quorum arithmetic: the quorum of N members / the position a quorum of N holds.

Every delivery, role change and leader readiness is printed as it happens.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from core_harness import MS, SECOND, MemoryShell, Net, NullEgress, Storage, ship_log

from cluster.archive.record import RECORD_HEADER_LENGTH, iter_records
from cluster.core import quorum
from cluster.core.base import ConsensusConfig, Event, LeaderReady, RoleChanged
from cluster.core.consensus import ConsensusModule
from cluster.core.driver import drive
from cluster.protocol.codec import LOG
from cluster.protocol.consensus import (
    APPEND_POSITION_VERIFIED,
    AppendPosition,
    AppendRequest,
    CanvassPosition,
    CommitPosition,
    RequestVote,
    Vote,
)
from cluster.protocol.enums import Role
from cluster.protocol.ingress import SessionMessageHeader

TESTDATA = Path(__file__).parent / "testdata"
REWRITE = os.environ.get("REWRITE_TRANSCRIPTS") == "1"


def describe(message: Any) -> str:
    """One line per consensus message, with what a reader needs."""
    if isinstance(message, CanvassPosition):
        return (
            f"CanvassPosition log=(term {message.log_leadership_term_id}, "
            f"{message.log_position}) term={message.leadership_term_id}"
        )
    if isinstance(message, RequestVote):
        return (
            f"RequestVote term={message.candidate_term_id} "
            f"log=(term {message.log_leadership_term_id}, {message.log_position})"
        )
    if isinstance(message, Vote):
        granted = "granted" if message.vote else "refused"
        return f"Vote term={message.candidate_term_id} {granted}"
    if isinstance(message, AppendRequest):
        return (
            f"AppendRequest term={message.leadership_term_id} at={message.log_position} "
            f"prev_term={message.prev_term_id} data=(term {message.data_term_id}, "
            f"{len(message.data)} bytes) commit={message.commit_position}"
        )
    if isinstance(message, AppendPosition):
        verified = " verified" if message.flags & APPEND_POSITION_VERIFIED else ""
        return (
            f"AppendPosition term={message.leadership_term_id} at={message.log_position}{verified}"
        )
    if isinstance(message, CommitPosition):
        return f"CommitPosition term={message.leadership_term_id} at={message.log_position}"
    return repr(message)


class Env:
    """Members of one scenario, their network, disks and clock."""

    def __init__(self) -> None:
        self.out: list[str] = []
        self.members: dict[int, ConsensusModule] = {}
        self.disk: dict[int, bytearray] = {}
        self.applied: dict[int, int] = {}
        self.net = Net(random.Random(0))
        self.now = SECOND
        self.next_heartbeat = 0

    # ---- plumbing

    def drive(self, i: int) -> None:
        def on_event(event: Event) -> None:
            if isinstance(event, RoleChanged):
                self.out.append(f"  n{i} becomes {event.role.name}")
            elif isinstance(event, LeaderReady):
                self.out.append(
                    f"  n{i} is ready: leads term {event.leadership_term_id} "
                    f"from {event.log_position}"
                )

        cm = self.members[i]
        drive(cm, MemoryShell(cm, self.disk[i], self.applied, self.now, on_event), self.now)

    def deliver_queue(
        self, keep: Callable[[int, int], bool], drop: bool, quiet: bool = False
    ) -> None:
        queue, self.net.queue = self.net.queue, []
        for sender, receiver, message in queue:
            if not keep(sender, receiver):
                self.net.queue.append((sender, receiver, message))
                continue
            if not quiet:
                self.out.append(f"{sender}->{receiver} {describe(message)}{' dropped' * drop}")
            if not drop:
                self.members[receiver].on_consensus_message(message, self.now)
                self.drive(receiver)

    def ship(self, heartbeat: bool = False) -> None:
        for i, cm in self.members.items():
            if cm.role is Role.LEADER:
                ship_log(cm, self.disk[i], lambda: heartbeat)

    # ---- commands

    def add_nodes(self, n: str, seed: str = "0") -> None:
        for i in range(int(n)):
            cm = ConsensusModule(
                ConsensusConfig(
                    member_id=i,
                    member_ids=tuple(range(int(n))),
                    leader_heartbeat_interval_ns=200 * MS,
                    leader_heartbeat_timeout_ns=SECOND,
                    election_timeout_ns=300 * MS,
                    startup_canvass_timeout_ns=2 * SECOND,
                ),
                NullEgress(),
                consensus=self.net.port(i),
                storage=Storage(),
                rng=random.Random(int(seed) * 100 + i),
            )
            self.members[i] = cm
            self.disk[i] = bytearray()
            self.applied[i] = 0
        self.out.append("ok")

    def campaign(self, member: str) -> None:
        i = int(member)
        self.members[i].enter_election(self.now, "campaign")
        self.drive(i)
        self.out.append(f"n{i} in election: {self.members[i].election_state.name}")

    def tick(self, *members: str, ms: str = "10") -> None:
        self.now += int(ms) * MS
        for i in [int(m) for m in members] or list(self.members):
            cm = self.members[i]
            cm.on_slow_tick(self.now)
            cm.on_leader_timeout(self.now)
            self.drive(i)
        self.out.append(f"now {self.now // MS} ms")

    def deliver(self, *flags: str, **links: str) -> None:
        source = int(links["from"]) if "from" in links else None
        target = int(links["to"]) if "to" in links else None
        self.deliver_queue(
            lambda s, r: (source is None or s == source) and (target is None or r == target),
            drop="drop" in flags,
        )
        if not self.out:
            self.out.append("nothing queued")

    def stabilize(self, quiet: bool = False) -> None:
        for _ in range(100):
            self.ship()
            if not self.net.queue:
                return
            self.deliver_queue(lambda s, r: True, drop=False, quiet=quiet)
        raise AssertionError("not stable after 100 rounds")

    def run(self, ms: str = "1000") -> None:
        end = self.now + int(ms) * MS
        while self.now < end:
            self.now += 10 * MS
            if self.now >= self.next_heartbeat:
                self.ship(heartbeat=True)
                self.next_heartbeat = self.now + 200 * MS
            for i, cm in self.members.items():
                cm.on_slow_tick(self.now)
                cm.on_leader_timeout(self.now)
                self.drive(i)
            self.stabilize(quiet=True)
        self.out.append(f"now {self.now // MS} ms")

    def propose(self, member: str, text: str) -> None:
        cm = self.members[int(member)]
        if not cm.is_ready_leader:
            self.out.append(f"refused: n{member} is not a ready leader")
            return
        # sequenced as a session's message would be (sessions are not what this shows)
        cm.log.append(SessionMessageHeader(cm.leadership_term_id, 1, 0, text.encode()), True)
        self.drive(int(member))
        self.out.append(f"published up to {cm.log.published_position}")

    def partition(self, *groups: str) -> None:
        sides: list[list[int]] = [[]]
        for token in groups:
            if token == "|":
                sides.append([])
            else:
                sides[-1].append(int(token))
        for a in sides:
            for b in sides:
                if a is not b:
                    self.net.cut.update((x, y) for x in a for y in b)
        self.out.append("ok")

    def heal(self) -> None:
        self.net.cut.clear()
        self.out.append("ok")

    def status(self) -> None:
        for i, cm in self.members.items():
            rlog = cm.log
            self.out.append(
                f"n{i}: {cm.role.name} term={cm.leadership_term_id} "
                f"leader={cm.leader_member_id} election={cm.election_state.name} "
                f"commit={rlog.commit_position} durable={rlog.archive_position} "
                f"applied={rlog.applied_position}"
                + (f" truncated={cm.counters.truncated_bytes}" if cm.counters.truncations else "")
            )

    def log(self, member: str) -> None:
        position = 0
        for _, body in iter_records(bytes(self.disk[int(member)])):
            message = LOG.decode(body)
            end = position + RECORD_HEADER_LENGTH + len(body)
            if isinstance(message, SessionMessageHeader):
                what = f"message {message.payload.decode()!r}"
            else:
                what = f"{type(message).__name__} term={message.leadership_term_id}"
            self.out.append(f"{position}..{end} {what}")
            position = end
        if position == 0:
            self.out.append("empty")

    def quorum(self, n: str) -> None:
        self.out.append(str(quorum.threshold(int(n))))

    def committed(self, n: str, *positions: str) -> None:
        self.out.append(str(quorum.committed([int(p) for p in positions], int(n))))


def run_command(env: Env, line: str) -> list[str]:
    name, *words = line.split()
    args = [w for w in words if "=" not in w]
    kwargs = dict(w.split("=", 1) for w in words if "=" in w)
    env.out = []
    getattr(env, name.replace("-", "_"))(*args, **kwargs)
    return env.out


def parse(path: Path) -> list[tuple[int, str, list[str]]]:
    """``(line number, command, expected output lines)`` for each block."""
    blocks: list[tuple[int, str, list[str]]] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.startswith("#"):
            i += 1
            continue
        if i + 1 >= len(lines) or lines[i + 1] != "----":
            raise ValueError(f"{path.name}:{i + 1}: expected ---- after {line!r}")
        j = i + 2
        expected: list[str] = []
        while j < len(lines) and lines[j].strip():
            expected.append(lines[j])
            j += 1
        blocks.append((i + 1, line, expected))
        i = j
    return blocks


def rewrite(path: Path, outputs: dict[int, list[str]]) -> None:
    lines = path.read_text().splitlines()
    result: list[str] = []
    i = 0
    while i < len(lines):
        result.append(lines[i])
        if i + 1 in outputs:
            result.append("----")
            result.extend(outputs[i + 1])
            i += 2
            while i < len(lines) and lines[i].strip():
                i += 1
            continue
        i += 1
    path.write_text("\n".join(result) + "\n")


@pytest.mark.parametrize("path", sorted(TESTDATA.glob("*.txt")), ids=lambda p: p.stem)
def test_transcript(path: Path) -> None:
    env = Env()
    outputs: dict[int, list[str]] = {}
    failures: list[str] = []
    for lineno, command, expected in parse(path):
        actual = run_command(env, command)
        outputs[lineno] = actual
        if actual != expected and not REWRITE:
            failures.append(
                f"{path.name}:{lineno}: {command}\n  expected:\n    "
                + "\n    ".join(expected)
                + "\n  actual:\n    "
                + "\n    ".join(actual)
            )
            break  # later blocks depend on this one
    if REWRITE:
        rewrite(path, outputs)
    assert not failures, "\n".join(failures)
