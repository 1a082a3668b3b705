"""Durable writes that fail (a full disk, issue #19): the consensus module's storage, the
recording log and the node state never crash the node, are retried, and nothing is
acted upon before it is durable.

The full disk is real: ``/dev/full``, whose writes fail with ENOSPC, stands in for a
file (a symlink for the node state's temporary file, the recording log's descriptor
swapped for it with ``dup2``), so no root is needed."""

from __future__ import annotations

import errno
import logging
import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from core_harness import MS, SECOND, NullEgress, Port

from cluster.archive.disk import DiskHealth
from cluster.archive.node_state import NodeState
from cluster.archive.recording_log import RecordingLog
from cluster.archive.storage import NodeStorage
from cluster.core.base import ConsensusConfig, StorageError
from cluster.core.consensus import ConsensusModule
from cluster.protocol.consensus import AppendRequest, RequestVote, Vote
from cluster.protocol.enums import Role
from cluster.protocol.version import PROTOCOL_VERSION

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")


@contextmanager
def full_disk_under(fd: int) -> Iterator[None]:
    """Every write to ``fd`` fails with ENOSPC until the block ends (then the file
    is back, untouched)."""
    saved = os.dup(fd)
    full = os.open("/dev/full", os.O_RDWR)
    try:
        os.dup2(full, fd)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)
        os.close(full)


def descriptor_of(path: Path) -> int:
    """The descriptor this process holds open on ``path``."""
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == str(path):
                return int(name)
        except OSError:
            continue
    raise AssertionError(f"{path} is not open")


def fill_node_state(directory: Path) -> Path:
    """The node state's reserve (the file its next state is written into) is /dev/full:
    a disk that takes no write at all (a failed save removes it)."""
    reserve = directory / "node-state.reserve"
    reserve.unlink(missing_ok=True)
    reserve.symlink_to("/dev/full")
    return reserve


# ---------------------------------------------------------------------- node state


def test_a_node_state_save_on_a_full_disk_leaves_nothing_and_changes_nothing(
    tmp_path: Path,
) -> None:
    state = NodeState(tmp_path)
    state.save(candidate_term_id=2, commit_position=64)
    fill_node_state(tmp_path)
    with pytest.raises(OSError, match="No space left on device") as failed:
        state.save(candidate_term_id=3)
    assert failed.value.errno == errno.ENOSPC
    assert not (tmp_path / "node-state.tmp").exists(), "the temporary file is removed"
    assert (state.candidate_term_id, state.commit_position) == (2, 64)
    assert NodeState(tmp_path).candidate_term_id == 2
    state.save(candidate_term_id=3)  # space again
    assert NodeState(tmp_path).candidate_term_id == 3


def test_a_candidate_term_that_cannot_be_saved_is_a_storage_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage = NodeStorage(RecordingLog.open(tmp_path), NodeState(tmp_path))
    caplog.set_level(logging.INFO, "cluster.disk")
    fill_node_state(tmp_path)
    with pytest.raises(StorageError, match="disk full: node state"):
        storage.save_candidate_term(5)
    assert storage.node_state.candidate_term_id == -1
    assert storage.disk.full
    assert "node state" in storage.disk.problem
    assert storage.disk.failing == ["node state"]
    storage.save_candidate_term(5)
    assert storage.node_state.candidate_term_id == 5
    assert not storage.disk.full
    assert storage.disk.problem == ""
    messages = [r.getMessage() for r in caplog.records]
    assert sum("disk full" in m for m in messages) == 1
    assert any(m.startswith("disk has space again: writes resumed after") for m in messages)


# ---------------------------------------------------------------------- recording log


def test_a_term_start_that_cannot_be_recorded_is_kept_and_written_first(tmp_path: Path) -> None:
    rlog = RecordingLog.open(tmp_path)
    storage = NodeStorage(rlog, NodeState(tmp_path))
    storage.record_term(0, 0, 1)
    with full_disk_under(descriptor_of(rlog.path)):
        storage.record_term(1, 500, 2)  # never raises: the node goes on
        storage.remove_terms_from(500)  # a truncation: after the term it removes
        storage.record_term(2, 300, 3)
        assert not storage.flush()  # still full: the log bytes after it must wait
        assert len(storage.pending) == 3
        assert storage.disk.failing == ["recording log"]
        assert "disk full: recording log (term 1 at 500) failed" in storage.disk.problem
    assert [e.leadership_term_id for e in rlog.entries if e.is_valid] == [0]
    assert storage.flush()  # space again: written in order
    assert not storage.pending
    assert storage.disk.problem == ""
    again = RecordingLog.open(tmp_path)
    terms = [(e.leadership_term_id, e.term_base_log_position) for e in again.entries if e.is_valid]
    assert terms == [(0, 0), (2, 300)]  # term 1 recorded, then removed by the truncation


def test_disk_health_clears_a_snapshot_failure_on_the_next_write_or_when_there_is_room(
    tmp_path: Path,
) -> None:
    now = [100.0]
    disk = DiskHealth(tmp_path, clock=lambda: now[0])
    heard: list[str] = []
    disk.listeners.append(heard.append)
    full = OSError(errno.ENOSPC, "No space left on device")
    reason = disk.failed("snapshot", full, "at log position 7", retried=False, needed=10)
    assert reason == "disk full: snapshot at log position 7 failed (No space left on device)"
    disk.failed("log", full, "append of 64 bytes at 7")
    now[0] += 2.5
    status = disk.status()
    assert status.full
    assert status.failing == ["log", "snapshot"]
    assert status.failing_for_s == 2.5
    assert status.write_failures == 2
    disk.probe()  # the log still fails: not the probe's to clear
    assert disk.problem
    disk.succeeded("log")  # the log writes again: the snapshot's failure is settled too
    assert disk.problem == ""
    assert disk.failed_seconds == 2.5
    assert heard == [reason, ""]
    disk.failed("snapshot", full, "at log position 9", retried=False, needed=10)
    disk.probe()  # nothing retries a snapshot: room on the disk clears it
    assert disk.problem == ""
    assert disk.status().full_events == 2


# ---------------------------------------------------------------------- the core


class FullDisk:
    """A StoragePort whose candidate-term saves fail while ``full``."""

    def __init__(self) -> None:
        self.full = True
        self.saved: list[int] = []
        self.attempts = 0

    def save_candidate_term(self, candidate_term_id: int) -> None:
        self.attempts += 1
        if self.full:
            raise StorageError("disk full: node state failed (No space left on device)")
        self.saved.append(candidate_term_id)

    def record_term(self, leadership_term_id: int, base_position: int, timestamp: int) -> None:
        pass

    def remove_terms_from(self, position: int) -> None:
        pass


def module(member_ids: tuple[int, ...]) -> tuple[ConsensusModule, Port, FullDisk]:
    port, disk = Port(), FullDisk()
    cm = ConsensusModule(
        ConsensusConfig(
            member_id=0,
            member_ids=member_ids,
            leader_heartbeat_timeout_ns=SECOND,
            election_timeout_ns=300 * MS,
            startup_canvass_timeout_ns=SECOND,
        ),
        NullEgress(),
        consensus=port,
        storage=disk,
        rng=random.Random(7),
    )
    return cm, port, disk


def test_no_vote_on_a_term_that_cannot_be_saved() -> None:
    cm, port, disk = module((0, 1, 2))
    cm.enter_election(SECOND, "test")

    def ask(term: int) -> Vote:
        cm.on_consensus_message(RequestVote(-1, 0, term, 1, PROTOCOL_VERSION), SECOND)
        votes = [m for _, m in port.sent if isinstance(m, Vote)]
        return votes[-1]

    assert ask(5).vote is False  # would have been granted: the log is as up to date
    assert cm.candidate_term_id == -1
    assert disk.saved == []
    disk.full = False
    assert ask(6).vote is True
    assert cm.candidate_term_id == 6
    assert disk.saved == [6]


def test_no_campaign_and_no_leadership_on_a_term_that_cannot_be_saved() -> None:
    cm, _port, disk = module((0,))
    now = SECOND
    cm.enter_election(now, "start-up", is_startup=True)
    for _ in range(50):
        now += 10 * MS
        cm.consensus_work(now)
    assert disk.attempts > 1, "it tries again"
    assert cm.role is not Role.LEADER
    assert cm.candidate_term_id == -1
    disk.full = False
    for _ in range(50):
        now += 10 * MS
        cm.consensus_work(now)
    assert cm.role is Role.LEADER
    assert disk.saved == [cm.leadership_term_id]


def test_no_following_a_leader_whose_term_cannot_be_saved() -> None:
    cm, _port, disk = module((0, 1, 2))
    cm.enter_election(SECOND, "test")
    heartbeat = AppendRequest(3, 1, 0, -1, 3, 0, 0, b"")
    cm.on_consensus_message(heartbeat, SECOND)
    assert cm.leader_member_id == -1
    assert cm.candidate_term_id == -1
    disk.full = False
    cm.on_consensus_message(heartbeat, SECOND + MS)
    assert (cm.leader_member_id, cm.leadership_term_id, cm.candidate_term_id) == (1, 3, 3)
