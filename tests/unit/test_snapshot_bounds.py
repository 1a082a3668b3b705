"""Issue 33, sans-IO: a snapshot transfer bounded by the follower's disk (a refusal the
leader learns), a transfer that stops dropped with its file, and a leader that falls
back to its snapshot for a follower whose next record is corrupt in its archive."""

from __future__ import annotations

from test_snapshot_transfer import POSITION, Pair

from cluster.core.install import Transfer
from cluster.protocol.consensus import SNAPSHOT_NO_ROOM, SnapshotChunkAck

SECOND = 1_000_000_000


def test_a_transfer_the_disk_cannot_hold_is_refused_and_the_leader_learns_it() -> None:
    pair = Pair()
    asked: list[Transfer] = []

    def room(transfer: Transfer) -> bool:
        asked.append(transfer)
        return False

    pair.receiver.room = room
    pair.leader_sends()  # the probe
    pair.deliver_to_follower()
    assert pair.receiver.transfer is None
    ((_, ack),) = pair.follower_port.sent
    assert isinstance(ack, SnapshotChunkAck)
    assert ack.flags == SNAPSHOT_NO_ROOM
    assert ack.offset == 0
    pair.deliver_to_leader()
    assert pair.leader.take_refusal(1)
    assert not pair.leader.take_refusal(1)  # said once
    assert asked[0].length == len(pair.snapshot)
    # a forged or stale chunk of the refused transfer writes nothing, asks the disk no more
    pair.leader.rewind_snapshot(1)
    pair.leader_sends()
    probe = pair.leader_port.sent[0][1]
    chunk = pair.leader.snapshot_chunk(
        1,
        position=POSITION,
        term=1,
        term_base=0,
        length=len(pair.snapshot),
        offset=0,
        data=pair.snapshot[:100],
    )
    pair.leader_port.sent[:] = [(1, chunk)]
    pair.deliver_to_follower()
    assert len(asked) == 1
    assert pair.file == bytearray()
    assert pair.receiver.take_writes() == []
    # room again: the next probe is taken and the transfer completes
    pair.follower_port.sent.clear()
    pair.receiver.room = lambda transfer: True
    pair.leader_port.sent[:] = [(1, probe)]
    pair.deliver_to_follower()
    pair.deliver_to_leader()
    pair.run()
    assert pair.receiver.complete is not None
    assert bytes(pair.file) == pair.snapshot


def test_a_transfer_with_no_chunk_for_the_timeout_is_dropped() -> None:
    pair = Pair()
    pair.leader_sends()
    pair.deliver_to_follower()
    pair.deliver_to_leader()
    pair.leader_sends()
    pair.deliver_to_follower()
    transfer = pair.receiver.transfer
    assert transfer is not None
    assert pair.receiver.offset > 0
    receiver = pair.receiver
    receiver.expire(0, 10 * SECOND)
    receiver.expire(9 * SECOND, 10 * SECOND)
    assert receiver.transfer == transfer
    assert receiver.take_dropped() == []
    receiver.expire(10 * SECOND, 10 * SECOND)
    assert receiver.transfer is None
    assert receiver.take_dropped() == [transfer]
    assert receiver.take_dropped() == []


def test_chunks_keep_a_transfer_alive_and_a_new_leader_drops_it() -> None:
    pair = Pair()
    pair.leader_sends()
    pair.deliver_to_follower()
    receiver = pair.receiver
    transfer = receiver.transfer
    for second in range(0, 40, 5):
        pair.leader.rewind_snapshot(1)
        pair.leader_sends()  # a probe: something of the transfer came
        pair.deliver_to_follower()
        receiver.expire(second * SECOND, 10 * SECOND)
        assert receiver.transfer == transfer
    receiver.writing = True  # a chunk being written is never dropped
    receiver.view.leadership_term_id = 3  # type: ignore[misc]
    receiver.expire(41 * SECOND, 10 * SECOND)
    assert receiver.transfer == transfer
    receiver.writing = False
    receiver.expire(41 * SECOND, 10 * SECOND)
    assert receiver.transfer is None
    assert receiver.take_dropped() == [transfer]


def test_a_transfer_replaced_by_another_is_dropped_with_its_file() -> None:
    pair = Pair()
    pair.leader_sends()
    pair.deliver_to_follower()
    old = pair.receiver.transfer
    assert old is not None
    pair.leader.rewind_snapshot(1)
    probe = pair.leader.snapshot_chunk(
        1, position=POSITION + 10, term=1, term_base=0, length=500, offset=0, data=b""
    )
    pair.receiver.on_chunk(probe)
    assert pair.receiver.take_dropped() == [old]
    assert pair.receiver.transfer is not None
    assert pair.receiver.transfer.log_position == POSITION + 10


def test_a_follower_whose_next_record_is_corrupt_is_sent_the_snapshot() -> None:
    pair = Pair()
    leader = pair.leader
    progress = leader.progress.get(1)
    assert progress is not None
    progress.maybe_update(60_000)  # caught up to 60,000, above the log start
    assert not leader.needs_snapshot(1)
    assert not leader.fall_back_to_snapshot(1, 60_000, 55_000)  # no snapshot above it
    assert not leader.needs_snapshot(1)
    assert leader.fall_back_to_snapshot(1, 60_000, 80_000)
    assert leader.needs_snapshot(1)
    # the follower installs it: it reports the snapshot's position, above the bad record
    progress.maybe_update(80_000)
    assert not leader.needs_snapshot(1)
    leader.start(100_000, 0)  # a new term forgets it
    assert leader.bad_positions == {}


def test_a_disk_that_fills_during_the_transfer_drops_it_and_refuses() -> None:
    pair = Pair()
    pair.leader_sends()
    pair.deliver_to_follower()
    pair.deliver_to_leader()
    pair.leader_sends()
    receiver = pair.receiver
    for _, message in pair.leader_port.sent:
        receiver.on_chunk(message)
    pair.leader_port.sent.clear()
    (write,) = receiver.take_writes()
    receiver.on_write_failed(write.transfer, no_room=True)
    assert receiver.transfer is None
    assert receiver.take_dropped() == [write.transfer]
    pair.deliver_to_leader()
    assert pair.leader.take_refusal(1)
