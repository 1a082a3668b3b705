"""The snapshot transfer's state machines, sans-IO: the leader's side
(cluster.core.replication: needs_snapshot, snapshot_next/chunk, acknowledgements) and
the follower's (cluster.core.install.SnapshotReceiver), wired through a message queue
that the tests deliver, drop or forge; the "file" is a bytearray."""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

from core_harness import Port
from msgspec.structs import replace

from cluster.core.base import ConsensusConfig
from cluster.core.install import SnapshotReceiver
from cluster.core.log import ReplicatedLog
from cluster.core.replication import SNAPSHOT_WINDOW, LeaderReplication
from cluster.core.terms import TermHistory
from cluster.core.validate import check_consensus_message
from cluster.protocol.consensus import (
    MAX_SNAPSHOT_CHUNK,
    SNAPSHOT_HELD,
    SnapshotChunk,
    SnapshotChunkAck,
)

MEMBERS = (0, 1, 2)
POSITION, TERM, BASE = 80_000, 1, 0


@dataclass
class View:
    leadership_term_id: int = 2
    leader_member_id: int = 0
    is_ready_leader: bool = True
    in_election: bool = False


class Pair:
    """A leader (member 0) whose log starts at 50,000 and a follower (member 1) that
    needs log from 100."""

    def __init__(self, size: int = 2 * MAX_SNAPSHOT_CHUNK + 12_345) -> None:
        self.snapshot = random.Random(size).randbytes(size)
        self.leader_port, self.follower_port = Port(), Port()
        leader_log = ReplicatedLog(100_000, TermHistory([(1, 0), (2, 90_000)]), 0)
        leader_log.start_position = 50_000
        self.view = View()
        self.leader = LeaderReplication(
            ConsensusConfig(member_id=0, member_ids=MEMBERS),
            leader_log,
            self.view,
            self.leader_port,
        )
        self.leader.start(100_000, 0)
        progress = self.leader.progress.get(1)
        assert progress is not None
        progress.maybe_decr_to(100)
        self.follower_log = ReplicatedLog(100, TermHistory([(0, 0)]), 0)
        self.receiver = SnapshotReceiver(
            ConsensusConfig(member_id=1, member_ids=MEMBERS),
            self.follower_log,
            View(),
            self.follower_port,
        )
        self.file = bytearray()

    def leader_sends(self) -> int:
        """Send what the window allows; return how many messages."""
        sent = 0
        while (step := self.leader.snapshot_next(1, POSITION, len(self.snapshot))) is not None:
            offset, size = step
            chunk = self.leader.snapshot_chunk(
                1,
                position=POSITION,
                term=TERM,
                term_base=BASE,
                length=len(self.snapshot),
                offset=offset,
                data=self.snapshot[offset : offset + size],
            )
            assert check_consensus_message(chunk, MEMBERS, 1, 0) is None
            self.leader_port.sent.append((1, chunk))
            sent += 1
            if size == 0:
                break
        return sent

    def deliver_to_follower(self, drop: bool = False) -> None:
        for _, message in self.leader_port.sent:
            if not drop:
                self.receiver.on_chunk(message)
                self.write()
        self.leader_port.sent.clear()

    def write(self) -> None:
        """The shell: write each chunk where it goes, durably, and report it."""
        for write in self.receiver.take_writes():
            assert write.offset == len(self.file)
            self.file += write.data
            self.receiver.on_written(write.transfer, len(self.file))

    def deliver_to_leader(self, drop: bool = False) -> None:
        for _, message in self.follower_port.sent:
            if not drop:
                self.leader.on_snapshot_ack(message, 0)
        self.follower_port.sent.clear()

    def run(self, rounds: int = 50) -> None:
        for _ in range(rounds):
            if self.receiver.complete is not None:
                return
            self.leader_sends()
            self.deliver_to_follower()
            self.deliver_to_leader()


def test_a_follower_below_the_leaders_log_start_is_sent_the_snapshot_in_chunks() -> None:
    pair = Pair()
    assert pair.leader.needs_snapshot(1)
    assert not pair.leader.needs_snapshot(2)
    assert pair.leader_sends() == 1  # a probe first
    probe = pair.leader_port.sent[0][1]
    assert probe.data == b""
    assert probe.offset == 0
    assert pair.leader_sends() == 0  # nothing more until it answers
    pair.deliver_to_follower()
    pair.deliver_to_leader()
    assert pair.leader.snapshot_acked(1) == 0
    # then at most the window, in chunks of at most 1 MiB
    assert pair.leader_sends() == SNAPSHOT_WINDOW // MAX_SNAPSHOT_CHUNK
    assert all(len(m.data) <= MAX_SNAPSHOT_CHUNK for _, m in pair.leader_port.sent)
    pair.run()
    assert bytes(pair.file) == pair.snapshot
    complete = pair.receiver.complete
    assert complete is not None
    assert complete.log_position == POSITION
    assert pair.receiver.installing
    assert pair.leader.snapshot_acked(1) == len(pair.snapshot)
    assert pair.leader.snapshot_next(1, POSITION, len(pair.snapshot)) is None


def test_a_transfer_cut_short_resumes_from_what_the_follower_holds() -> None:
    pair = Pair()
    pair.leader_sends()
    pair.deliver_to_follower()
    pair.deliver_to_leader()
    pair.leader_sends()
    pair.deliver_to_follower()  # the follower writes the first window ...
    pair.deliver_to_leader(drop=True)  # ... but its answers are lost with the link
    held = len(pair.file)
    assert held == SNAPSHOT_WINDOW
    pair.leader.rewind_snapshot(1)  # the link broke: probe again
    assert pair.leader_sends() == 1
    pair.deliver_to_follower()
    pair.deliver_to_leader()
    assert pair.leader.snapshot_acked(1) == held  # resumes there, nothing sent twice
    step = pair.leader.snapshot_next(1, POSITION, len(pair.snapshot))
    assert step is not None
    assert step[0] == held
    pair.run()
    assert bytes(pair.file) == pair.snapshot


def test_a_chunk_not_where_the_transfer_stands_is_answered_with_the_offset_held() -> None:
    pair = Pair()
    pair.run(1)  # the probe
    chunk = pair.leader.snapshot_chunk(
        1,
        position=POSITION,
        term=TERM,
        term_base=BASE,
        length=len(pair.snapshot),
        offset=1000,
        data=pair.snapshot[1000:2000],
    )
    pair.receiver.on_chunk(chunk)
    assert pair.receiver.take_writes() == []
    [(leader, ack)] = pair.follower_port.sent
    assert leader == 0
    assert ack.offset == 0
    # a chunk of another term, or from a member that does not lead, is ignored
    pair.follower_port.sent.clear()
    pair.receiver.on_chunk(replace(chunk, offset=0, leadership_term_id=1))
    pair.receiver.on_chunk(replace(chunk, offset=0, leader_member_id=2))
    assert pair.receiver.take_writes() == []
    assert pair.follower_port.sent == []


def test_a_new_snapshot_replaces_the_transfer_and_failed_checks_start_over() -> None:
    pair = Pair()
    pair.run(2)
    assert 0 < len(pair.file) < len(pair.snapshot)
    other = pair.leader.snapshot_chunk(
        1, position=POSITION + 500, term=TERM, term_base=BASE, length=10, offset=0, data=b""
    )
    pair.receiver.on_chunk(other)
    assert pair.receiver.transfer is not None
    assert pair.receiver.transfer.log_position == POSITION + 500
    assert pair.receiver.offset == 0
    pair.file.clear()  # (the shell starts a new file)
    pair.receiver.on_install_failed(pair.receiver.transfer)
    assert pair.receiver.transfer is None
    assert pair.follower_port.sent[-1][1].offset == 0


def test_an_install_under_way_is_not_replaced() -> None:
    pair = Pair()
    pair.run()
    assert pair.receiver.installing
    transfer = pair.receiver.transfer
    pair.receiver.on_chunk(
        pair.leader.snapshot_chunk(
            1, position=POSITION + 500, term=TERM, term_base=BASE, length=10, offset=0, data=b""
        )
    )
    assert pair.receiver.transfer == transfer


def test_a_follower_that_holds_the_snapshots_position_asks_for_the_log_instead() -> None:
    pair = Pair()
    pair.follower_log.commit_position = POSITION + 1  # it has it, committed
    pair.leader_sends()
    pair.deliver_to_follower()
    [(_, ack)] = pair.follower_port.sent
    assert ack.offset == SNAPSHOT_HELD
    pair.deliver_to_leader()
    progress = pair.leader.progress.get(1)
    assert progress is not None
    assert progress.next_position == POSITION
    assert pair.receiver.take_writes() == []
    assert pair.file == bytearray()


def test_the_leader_ignores_stale_and_impossible_answers() -> None:
    pair = Pair()
    pair.leader_sends()
    for ack in (
        SnapshotChunkAck(
            leadership_term_id=1, follower_member_id=1, log_position=POSITION, offset=5
        ),
        SnapshotChunkAck(leadership_term_id=2, follower_member_id=1, log_position=77, offset=5),
        SnapshotChunkAck(
            leadership_term_id=2, follower_member_id=1, log_position=POSITION, offset=1 << 40
        ),
    ):
        pair.leader.on_snapshot_ack(ack, 0)
        assert pair.leader.snapshot_acked(1) == -1


def test_malformed_chunks_are_protocol_errors() -> None:
    good = SnapshotChunk(
        leadership_term_id=2,
        leader_member_id=0,
        log_position=POSITION,
        snapshot_term_id=1,
        term_base_log_position=0,
        length=100,
        offset=10,
        crc=zlib.crc32(b"abc"),
        data=b"abc",
    )
    assert check_consensus_message(good, MEMBERS, 1, 0) is None
    bad = {
        "crc": replace(good, crc=good.crc ^ 1),
        "past the end": replace(good, offset=98),
        "negative offset": replace(good, offset=-1),
        "huge": replace(good, length=1 << 50),
        "empty snapshot": replace(good, length=0, offset=0, data=b"", crc=0),
        "later term": replace(good, snapshot_term_id=3),
        "base after position": replace(good, term_base_log_position=POSITION),
        "too big a chunk": replace(
            good,
            length=4 * MAX_SNAPSHOT_CHUNK,
            offset=0,
            data=bytes(MAX_SNAPSHOT_CHUNK + 1),
            crc=zlib.crc32(bytes(MAX_SNAPSHOT_CHUNK + 1)),
        ),
        "not the sender": replace(good, leader_member_id=2),
    }
    for what, message in bad.items():
        assert check_consensus_message(message, MEMBERS, 1, 0) is not None, what
    ack = SnapshotChunkAck(leadership_term_id=2, follower_member_id=1, log_position=5, offset=-7)
    assert check_consensus_message(ack, MEMBERS, 0, 1) is not None
    assert check_consensus_message(replace(ack, offset=SNAPSHOT_HELD), MEMBERS, 0, 1) is None
