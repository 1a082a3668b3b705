"""The backup directory (:mod:`cluster.backup.store`): its own segments, the manifest
and recording log written last, what lies past the manifest cut when it is opened
again, retention; and the admin server refusing the backup commands to a peer that may
not read the whole state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.agents.admin import AdminServer
from cluster.archive.reader import list_segments
from cluster.archive.record import encode_record
from cluster.archive.recording_log import RecordingLog
from cluster.backup.store import BackupStore, StoreError
from cluster.config import NodeConfig
from cluster.protocol.admin import AdminCommand

RECORD = encode_record(b"x" * 92)  # 100 bytes


def snapshot_entries(position: int) -> list[dict[str, int]]:
    return [
        {"leadership_term_id": 0, "term_base_log_position": 0, "log_position": position,
         "timestamp": 1, "service_id": service}
        for service in (0, -1)
    ]  # fmt: skip


def add_snapshot(store: BackupStore, position: int) -> None:
    temp = store.snapshot_temp()
    temp.write_bytes(b"snapshot")
    store.add_snapshot(snapshot_entries(position), temp)


def test_a_backup_goes_to_a_new_directory(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("x")
    with pytest.raises(StoreError, match="not empty"):
        BackupStore.create(tmp_path)


def test_segments_roll_at_record_starts_and_the_manifest_comes_last(tmp_path: Path) -> None:
    store = BackupStore.open(tmp_path / "b", segment_size=250)
    store.start_at(0)
    store.append(RECORD * 7)  # 700 bytes: whole records, at most 250 bytes a segment
    store.set_terms([{"leadership_term_id": 0, "term_base_log_position": 0, "timestamp": 1}])
    manifest = store.commit(cluster_id=5)
    segments = list_segments(tmp_path / "b" / "archive")
    assert [(s.base, s.length) for s in segments] == [(0, 200), (200, 200), (400, 200), (600, 100)]
    assert manifest["covers"] == manifest["log_end"] == 700
    assert json.loads((tmp_path / "b" / "backup.json").read_text())["cluster_id"] == 5
    log = RecordingLog.read(tmp_path / "b")
    assert log.find_last_term() is not None
    store.append(RECORD)  # not in the manifest: cut when opened again
    store.close()
    again = BackupStore.open(tmp_path / "b", segment_size=250)
    assert again.log_end == 700
    assert list_segments(tmp_path / "b" / "archive")[-1].end == 700


def test_retention_keeps_the_newest_snapshots_and_the_log_after_them(tmp_path: Path) -> None:
    store = BackupStore.create(tmp_path / "b", segment_size=200)
    store.start_at(0)
    for position in (200, 400, 600):
        store.append(RECORD * 2)
        add_snapshot(store, position)
    store.append(RECORD)
    store.retain(2)
    manifest = store.commit()
    assert [e["log_position"] for e in store.snapshots] == [400, 600]
    assert manifest["log_start"] == 400
    assert manifest["snapshot"] == {"log_position": 600, "leadership_term_id": 0}
    assert sorted(p.name for p in (tmp_path / "b" / "snapshots").iterdir()) == [
        "snapshot-00000000000000000400-0.snap",
        "snapshot-00000000000000000600-0.snap",
    ]
    assert RecordingLog.read(tmp_path / "b").log_start == 400


class _Target:
    def __init__(self) -> None:
        self.config = NodeConfig()


@pytest.mark.parametrize("command", ["backup-query", "backup-read"])
async def test_the_backup_commands_need_a_loopback_peer_or_an_admin(command: str) -> None:
    server = AdminServer(_Target())  # type: ignore[arg-type]
    reply = await server.execute(AdminCommand(1, command, {}), local=False)
    assert not reply.ok
    assert "refused" in reply.message


def test_a_log_begun_afresh_replaces_the_old_one_only_when_committed(tmp_path: Path) -> None:
    out = tmp_path / "b"
    store = BackupStore.create(out, segment_size=250)
    store.start_at(0)
    store.append(RECORD * 3)
    add_snapshot(store, 200)
    store.commit()
    # fallen behind the member's log: a new snapshot and the log from it
    add_snapshot(store, 1000)
    store.start_at(1000)
    store.append(RECORD)
    old = json.loads((out / "backup.json").read_text())
    assert old["log_start"] == 0  # meanwhile the directory is the old backup, whole
    assert [s.base for s in list_segments(out / "archive")] == [0, 200]
    assert (out / "snapshots" / "snapshot-00000000000000000200-0.snap").exists()
    manifest = store.commit()
    assert (manifest["log_start"], manifest["log_end"]) == (1000, 1100)
    assert [s.base for s in list_segments(out / "archive")] == [1000]
    assert not (out / "archive.new").exists()
    assert not (out / "archive.old").exists()
    assert [p.name for p in (out / "snapshots").iterdir()] == [
        "snapshot-00000000000000001000-0.snap"
    ]


@pytest.mark.parametrize("stopped", ["before the swap", "between the renames", "after them"])
def test_a_stop_in_the_middle_of_a_new_log_leaves_one_whole_backup(
    tmp_path: Path, stopped: str
) -> None:
    out = tmp_path / "b"
    store = BackupStore.open(out, segment_size=250)
    store.start_at(0)
    store.append(RECORD * 3)
    store.commit()
    store.start_at(1000)
    store.append(RECORD)
    store.close()
    if stopped != "before the swap":
        (out / "archive").rename(out / "archive.old")
    if stopped == "after them":
        (out / "archive.new").rename(out / "archive")
    again = BackupStore.open(out, segment_size=250)
    assert (again.log_start, again.log_end) == (0, 300)
    assert [s.end for s in list_segments(out / "archive")] == [200, 300]
    assert not (out / "archive.new").exists()
    assert not (out / "archive.old").exists()
