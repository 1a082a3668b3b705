"""``node-state.json``: saved atomically, changed in memory only once durable, thread-safe."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest

from cluster.archive.errors import ArchiveCorruptionError
from cluster.archive.node_state import FILE_NAME, NodeState


def test_save_and_reload(tmp_path: Path) -> None:
    state = NodeState(tmp_path)
    assert (state.candidate_term_id, state.commit_position) == (-1, 0)
    state.save(candidate_term_id=3)
    state.save(commit_position=4096)
    again = NodeState(tmp_path)
    assert (again.candidate_term_id, again.commit_position) == (3, 4096)
    assert not (tmp_path / "node-state.tmp").exists()


def test_failed_save_changes_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "member"
    directory.mkdir()
    state = NodeState(directory)
    state.save(candidate_term_id=1, commit_position=100)
    shutil.rmtree(directory)  # the next write cannot even create its temporary file
    with pytest.raises(FileNotFoundError):
        state.save(commit_position=200)
    with pytest.raises(FileNotFoundError):
        state.save(candidate_term_id=2)
    # a failed save is not remembered as done: the node retries the commit position, and
    # never acts on a vote that is not durable
    assert (state.candidate_term_id, state.commit_position) == (1, 100)


def test_concurrent_saves_keep_both_fields(tmp_path: Path) -> None:
    """The node saves the commit position from a worker thread while its event loop may
    save a candidate term: neither save may lose the other's field."""
    state = NodeState(tmp_path)
    errors: list[BaseException] = []

    def commits() -> None:
        try:
            for position in range(1, 201):
                state.save(commit_position=position)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=commits)
    thread.start()
    for term in range(1, 201):
        state.save(candidate_term_id=term)
    thread.join()
    assert not errors
    on_disk = json.loads((tmp_path / FILE_NAME).read_text())
    assert on_disk == {"candidate_term_id": 200, "commit_position": 200}


def test_unreadable_state_is_reported(tmp_path: Path) -> None:
    (tmp_path / FILE_NAME).write_text('{"candidate_term_id": "x"}')
    with pytest.raises(ArchiveCorruptionError, match="unreadable node state"):
        NodeState(tmp_path)
