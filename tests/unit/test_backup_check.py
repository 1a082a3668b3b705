"""A backup that cannot deliver what its ``backup.json`` promises (issue 41): ``verify``
fails naming the file and position, ``restore`` refuses before it writes anything and
never claims a position it does not hold; links and special files are refused, never
followed.  The backup is written by the store ``cluster-backup`` uses
(:class:`~cluster.backup.store.BackupStore`), with real log records and a real snapshot;
each case damages a copy of it.  A member's own directory keeps its torn tail a note."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cluster.archive.errors import ArchiveCorruptionError
from cluster.archive.node_state import NodeState
from cluster.archive.reader import list_segments
from cluster.archive.record import encode_record
from cluster.archive.recording_log import RecordingLog
from cluster.archive.segments import Archive
from cluster.archive.snapshots import encode_snapshot, read_snapshot
from cluster.backup.store import BackupStore, NotContinuous
from cluster.core.snapshot import CONSENSUS_MODULE_TYPE_ID, SERVICE_TYPE_ID
from cluster.protocol.codec import encode
from cluster.protocol.enums import ClusterTimeUnit, SnapshotMark
from cluster.protocol.ingress import SessionMessageHeader
from cluster.protocol.snapshot import (
    ConsensusModuleState,
    PendingMessageTracker,
    ServiceState,
    SnapshotMarker,
)
from cluster.tool.backup import backup_from_dir
from cluster.tool.cli import main as tool_main
from cluster.tool.offline import verify
from cluster.tool.restore import RestoreError, restore

T0 = 1_790_000_000_000
"""The first record's cluster time (epoch ms); each next one is a second later."""
RECORDS = 30
SNAPSHOT_AFTER = 10


def record(i: int) -> bytes:
    return encode_record(encode(SessionMessageHeader(0, 1, T0 + 1000 * i, b"put %d" % i)))


def snapshot_file(position: int) -> bytes:
    def marker(type_id: int, mark: SnapshotMark) -> SnapshotMarker:
        return SnapshotMarker(type_id, position, 0, 0, mark, ClusterTimeUnit.MILLIS, 0)

    return encode_snapshot([
        marker(CONSENSUS_MODULE_TYPE_ID, SnapshotMark.BEGIN),
        ConsensusModuleState(2, 1, 0, 0),
        PendingMessageTracker(1, 0, 0, 0),
        marker(CONSENSUS_MODULE_TYPE_ID, SnapshotMark.END),
        marker(SERVICE_TYPE_ID, SnapshotMark.BEGIN),
        ServiceState(b"the service's state"),
        marker(SERVICE_TYPE_ID, SnapshotMark.END),
    ])  # fmt: skip


def ends() -> list[int]:
    """Each record's end position."""
    found, position = [], 0
    for i in range(RECORDS):
        position += len(record(i))
        found.append(position)
    return found


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A backup: the log from 0, a snapshot after record 10 (taken at its time)."""
    out = tmp_path_factory.mktemp("made") / "backup"
    store = BackupStore.open(out)
    store.start_at(0)
    store.append(b"".join(record(i) for i in range(SNAPSHOT_AFTER + 1)))
    position = ends()[SNAPSHOT_AFTER]
    temp = store.snapshot_temp()
    temp.write_bytes(snapshot_file(position))
    store.add_snapshot([
        {"leadership_term_id": 0, "term_base_log_position": 0, "log_position": position,
         "timestamp": T0 + 1000 * SNAPSHOT_AFTER, "service_id": service}
        for service in (0, -1)
    ], temp)  # fmt: skip
    store.append(b"".join(record(i) for i in range(SNAPSHOT_AFTER + 1, RECORDS)))
    store.set_terms([{"leadership_term_id": 0, "term_base_log_position": 0, "timestamp": T0}])
    store.commit(cluster_id=7, member_id=0)
    store.close()
    return out


@pytest.fixture
def backup(made: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "backup"
    shutil.copytree(made, copy)
    return copy


def segment(directory: Path) -> Path:
    return list_segments(directory / "archive")[-1].path


def snapshot(directory: Path) -> Path:
    return next((directory / "snapshots").glob("*.snap"))


def manifest(directory: Path) -> dict[str, int]:
    return dict(json.loads((directory / "backup.json").read_text()))


def rewrite(path: Path, change: Callable[[bytearray], None]) -> None:
    data = bytearray(path.read_bytes())
    change(data)
    path.write_bytes(bytes(data))


def delete_segment(backup: Path) -> tuple[str, int]:
    segment(backup).unlink()
    return "archive", 0


def cut_in_half(backup: Path) -> tuple[str, int]:
    path = segment(backup)
    os.truncate(path, path.stat().st_size // 2)
    return path.name, max(e for e in [0, *ends()] if e <= path.stat().st_size)


def break_the_last_crc(backup: Path) -> tuple[str, int]:
    rewrite(segment(backup), lambda data: data.__setitem__(-1, data[-1] ^ 0xFF))
    return segment(backup).name, ends()[-2]


def cut_the_last_10_bytes(backup: Path) -> tuple[str, int]:
    path = segment(backup)
    os.truncate(path, path.stat().st_size - 10)
    return path.name, ends()[-2]


def zero_the_tail(backup: Path) -> tuple[str, int]:
    size = segment(backup).stat().st_size
    rewrite(segment(backup), lambda data: data.__setitem__(slice(size - 100, size), bytes(100)))
    return segment(backup).name, max(e for e in ends() if e <= size - 100)


def raise_covers_by_1000(backup: Path) -> tuple[str, int]:
    changed = manifest(backup)
    changed["covers"] += 1000
    (backup / "backup.json").write_text(json.dumps(changed))
    return "backup.json", changed["covers"]


def raise_covers_and_log_end(backup: Path) -> tuple[str, int]:
    changed = manifest(backup)
    changed["covers"] += 1000
    changed["log_end"] += 1000
    (backup / "backup.json").write_text(json.dumps(changed))
    return segment(backup).name, ends()[-1]


def link_the_segment_elsewhere(backup: Path) -> tuple[str, int]:
    """A segment linked to another file, here a whole copy of itself: valid records."""
    path = segment(backup)
    other = backup.parent / "elsewhere.seg"
    path.rename(other)
    path.symlink_to(other)
    return path.name, 0


def tear_the_recording_log(backup: Path) -> tuple[str, int]:
    path = backup / "recording.log"
    os.truncate(path, path.stat().st_size - 5)
    return "recording.log", (path.stat().st_size // 64) * 64


def link_the_snapshot_to_a_fifo(backup: Path) -> tuple[str, int]:
    """A FIFO never ends a read (the old code sat in it for ever)."""
    path = snapshot(backup)
    path.unlink()
    os.mkfifo(path)
    return path.name, 0


def empty_the_snapshot(backup: Path) -> tuple[str, int]:
    """No records at all: each of them is whole, the snapshot is not."""
    path = snapshot(backup)
    path.write_bytes(b"")
    return path.name, ends()[SNAPSHOT_AFTER]


DAMAGE = [
    delete_segment,
    cut_in_half,
    break_the_last_crc,
    cut_the_last_10_bytes,
    zero_the_tail,
    raise_covers_by_1000,
    raise_covers_and_log_end,
    link_the_segment_elsewhere,
    tear_the_recording_log,
    link_the_snapshot_to_a_fifo,
    empty_the_snapshot,
]


def test_the_backup_as_written_verifies_and_restores(backup: Path, tmp_path: Path) -> None:
    checked = verify(backup)
    assert checked["ok"], checked["problems"]
    assert checked["problems"] == []
    assert checked["backup"]["covers"] == checked["backup"]["log_end"] == ends()[-1]
    assert checked["first_record_time"] == "2026-09-21T14:13:20.000Z"
    assert [s["log_position"] for s in checked["snapshots"]] == [ends()[SNAPSHOT_AFTER]]
    done = restore(backup, tmp_path / "node-0", 0)
    assert done["log_end"] == done["commit_position"] == ends()[-1]
    again = verify(tmp_path / "node-0")
    assert again["ok"]
    assert again["log_end"] == ends()[-1]


@pytest.mark.parametrize("damage", DAMAGE, ids=[d.__name__ for d in DAMAGE])
def test_a_damaged_backup_fails_verify_and_restore_writes_nothing(
    backup: Path, tmp_path: Path, damage: Callable[[Path], tuple[str, int]]
) -> None:
    name, position = damage(backup)
    checked = verify(backup)
    assert not checked["ok"]
    damaged = [p for p in checked["problems"] if not p["note"]]
    assert any(Path(p["file"]).name == name and p["position"] == position for p in damaged), (
        name, position, damaged,
    )  # fmt: skip
    into = tmp_path / "restored" / "node-0"
    with pytest.raises(RestoreError, match=f"nothing restored:\n.*{name}"):
        restore(backup, into, 0)
    assert not into.exists()


def test_a_snapshot_linked_to_dev_zero_is_refused_without_reading_it(
    backup: Path, tmp_path: Path
) -> None:
    """In a process with 512 MiB of address space: the old code read /dev/zero until the
    kernel killed it."""
    path = snapshot(backup)
    path.unlink()
    path.symlink_to("/dev/zero")

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))

    for command in ("verify", "restore"):
        done = subprocess.run(
            [sys.executable, "-m", "cluster.tool", command, "--dir" if command == "verify"
             else "--from", str(backup), *(() if command == "verify" else
                                          ("--dir", str(tmp_path / "r"), "--member-id", "0"))],
            capture_output=True, text=True, timeout=60, preexec_fn=limit, check=False,
        )  # fmt: skip
        assert done.returncode == 1, done.stderr
        assert "a symbolic link (to /dev/zero), not a regular file: refused" in (
            done.stdout + done.stderr
        )
    assert not (tmp_path / "r").exists()


def test_reads_refuse_links_and_special_files(tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    with Archive.open(archive) as log:
        log.append(record(0) + record(1))
    other = tmp_path / "other.seg"
    (archive / "log-00000000000000000000.seg").rename(other)
    (archive / "log-00000000000000000000.seg").symlink_to(other)
    with pytest.raises(ArchiveCorruptionError, match=r"a symbolic link .* refused"):
        list_segments(archive)
    with pytest.raises(ArchiveCorruptionError, match=r"a symbolic link .* refused"):
        Archive.open(archive)  # a member does not silently drop the log it linked
    (tmp_path / "snapshots").mkdir()
    os.mkfifo(tmp_path / "snapshots" / "snapshot.snap")
    with pytest.raises(ArchiveCorruptionError, match="a FIFO"):
        read_snapshot(tmp_path / "snapshots" / "snapshot.snap")
    os.symlink("/dev/zero", tmp_path / "recording.log")
    with pytest.raises(ArchiveCorruptionError, match=r"a character device|a symbolic link"):
        RecordingLog.read(tmp_path)


def test_a_members_torn_tail_is_a_note_a_backups_is_damage(tmp_path: Path, backup: Path) -> None:
    member = tmp_path / "member"
    with Archive.open(member / "archive") as log:
        log.append(b"".join(record(i) for i in range(5)))
    with RecordingLog.open(member) as recording:
        recording.append_term(0, 0, T0)
    path = segment(member)
    os.truncate(path, path.stat().st_size - 10)
    checked = verify(member)
    assert checked["ok"]
    assert [p["note"] and p["torn_tail"] for p in checked["problems"]] == [True]
    cut_the_last_10_bytes(backup)
    assert not verify(backup)["ok"]


def test_a_stopped_members_torn_tails_are_left_out_of_its_backup(tmp_path: Path) -> None:
    """A member that crashed mid-write: its backup (``--from-dir``) holds what a start
    would keep, whole, and says so."""
    member = tmp_path / "member"
    with Archive.open(member / "archive") as log:
        log.append(b"".join(record(i) for i in range(5)))
    with RecordingLog.open(member) as recording:
        recording.append_term(0, 0, T0)
    NodeState(member).save(candidate_term_id=0, commit_position=ends()[4])
    with (member / "recording.log").open("ab") as torn:
        torn.write(b"half an entry")
    with segment(member).open("ab") as torn:
        torn.write(record(5)[:-3])
    made = backup_from_dir(member, tmp_path / "backup")
    assert made["log_end"] == made["covers"] == ends()[4]
    checked = verify(tmp_path / "backup")
    assert checked["ok"], checked["problems"]
    assert checked["problems"] == []


def test_a_restore_to_a_time_ends_at_the_last_record_at_or_before_it(
    backup: Path, tmp_path: Path
) -> None:
    at = restore(backup, tmp_path / "a", 0, to_time=T0 + 15_500)
    assert at["log_end"] == at["commit_position"] == ends()[15]
    assert at["log_end_time"] == "2026-09-21T14:13:35.000Z"
    assert verify(tmp_path / "a")["log_end"] == ends()[15]
    exact = restore(backup, tmp_path / "b", 0, to_time=T0 + 15_000)
    assert exact["log_end"] == ends()[15]
    late = restore(backup, tmp_path / "c", 0, to_time=T0 + 10**9)
    assert late["log_end"] == ends()[-1]
    with pytest.raises(RestoreError, match="nothing the backup holds is at or before"):
        restore(backup, tmp_path / "d", 0, to_time=T0 - 1)
    assert not (tmp_path / "d").exists()
    # between the snapshot (at record 10's time) and record 11: the snapshot's position
    snap = restore(backup, tmp_path / "e", 0, to_time=T0 + 10_500)
    assert snap["log_end"] == ends()[SNAPSHOT_AFTER]
    assert snap["snapshot"]["log_position"] == ends()[SNAPSHOT_AFTER]


def test_cluster_backup_goes_on_only_with_its_own_backups(tmp_path: Path) -> None:
    oneshot = BackupStore.create(tmp_path / "oneshot")
    oneshot.start_at(0)
    oneshot.append(record(0))
    oneshot.commit()
    oneshot.close()
    with pytest.raises(NotContinuous, match=r"one-shot backup .* new --out"):
        BackupStore.open(tmp_path / "oneshot")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(NotContinuous, match="no backup"):
        BackupStore.open(tmp_path / "other")
    # a new one writes nothing until it has a log: no empty folders left behind
    BackupStore.open(tmp_path / "new")
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--cluster-commit", "5"], "--cluster-commit goes with --same-cluster"),
        (["--to-time", "2026-11-28T14:05:00"], "has no time zone: add Z"),
        (["--to-time", "yesterday"], "not an ISO-8601 time"),
        (["--to-time", "2026-11-28T14:05:00Z", "--to-position", "9"], "not both"),
    ],
)
def test_restore_options_that_cannot_go_together_are_usage_errors(
    backup: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], says: str
) -> None:
    """Before, --cluster-commit without --same-cluster was silently ignored."""
    args = ["restore", "--from", str(backup), "--dir", str(tmp_path / "r"), "--member-id", "0"]
    with pytest.raises(SystemExit) as stopped:
        tool_main([*args, *extra])
    assert stopped.value.code == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
