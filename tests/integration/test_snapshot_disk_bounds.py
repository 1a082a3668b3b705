"""Issue 33, points 6 and 7: a snapshot install bounded by the disk, node state writable
on a full disk, and a follower stranded by corruption below the snapshot.  The full-disk
cases use a small tmpfs (root; skipped otherwise)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from test_full_disk import fill_up, small_disk

from cluster.archive.node_state import RESERVE_NAME, SLOT_SIZE, NodeState
from cluster.archive.recording_log import RecordingLog
from cluster.archive.storage import NodeStorage


def test_the_candidate_term_is_saved_on_a_full_disk(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "1m") as disk:
        data = disk / "member"
        data.mkdir()
        state = NodeState(data)
        assert (data / RESERVE_NAME).stat().st_size == SLOT_SIZE
        state.save(candidate_term_id=1, commit_position=100)
        fill_up(disk)
        storage = NodeStorage(RecordingLog.open(data), state)
        for term in range(2, 30):
            storage.save_candidate_term(term)
            state.save(commit_position=100 + term)
        again = NodeState(data)
        assert (again.candidate_term_id, again.commit_position) == (29, 129)
        assert json.loads((data / "node-state.json").read_text())["candidate_term_id"] == 29
        assert (data / RESERVE_NAME).exists()
        assert not storage.disk.problem


def test_a_save_cut_between_its_renames_is_finished_at_load(tmp_path: Path) -> None:
    state = NodeState(tmp_path)
    state.save(candidate_term_id=3)
    reserve = tmp_path / RESERVE_NAME
    os.replace(reserve, reserve.with_suffix(".old"))  # as a crash would leave it
    again = NodeState(tmp_path)
    assert again.candidate_term_id == 3
    assert reserve.exists()
    assert not reserve.with_suffix(".old").exists()
