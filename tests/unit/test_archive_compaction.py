"""Log compaction and snapshot installs on disk (cluster.archive.compaction, the
archive's purge/reset, the recording log's LOG_START/LOG_RESET entries): real files,
crashes simulated by stopping between the steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.archive import Archive, RecordingLog, encode_record
from cluster.archive.compaction import compact, install_snapshot, reconcile
from cluster.archive.errors import ArchiveCorruptionError
from cluster.archive.layout import reset_directory
from cluster.archive.recording_log import (
    CM_SERVICE_ID,
    ENTRY_TYPE_LOG_RESET,
    ENTRY_TYPE_LOG_START,
    ENTRY_TYPE_TERM,
)
from cluster.archive.snapshots import snapshot_path, write_snapshot

SEGMENT = 256


def record(i: int) -> bytes:
    return encode_record(bytes((i + k) % 251 for k in range(40)))  # 48 bytes each


def fill(archive: Archive, count: int, first: int = 0) -> None:
    for i in range(first, first + count):
        archive.append(record(i))


def snapshot(data_dir: Path, rlog: RecordingLog, position: int, term: int = 0) -> Path:
    path = snapshot_path(data_dir, position, term)
    write_snapshot(path, b"snapshot at %d" % position)
    rlog.append_snapshot(term, 0, position, 0, 0)
    rlog.append_snapshot(term, 0, position, 0, CM_SERVICE_ID)
    return path


def seg_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("log-*.seg"))


def test_compaction_deletes_whole_segments_below_the_retained_snapshots(tmp_path: Path) -> None:
    rlog = RecordingLog.open(tmp_path)
    rlog.append_term(0, 0, 0)
    archive = Archive.open(tmp_path / "archive", segment_size=SEGMENT)
    fill(archive, 60)  # 2880 bytes, segments of 288 (6 records each)
    first = snapshot(tmp_path, rlog, 48 * 20)
    assert compact(archive, rlog, tmp_path, 2, 0) is None  # one snapshot: keep all
    second = snapshot(tmp_path, rlog, 48 * 40)
    done = compact(archive, rlog, tmp_path, 2, 0)
    # the 2nd newest (at 960) is in the segment [864, 1152): everything below it goes
    assert done is not None
    assert done.log_start == 864
    assert done.freed_bytes == 864
    assert archive.start_position == 864
    assert rlog.log_start == 864
    assert not (tmp_path / "archive" / "log-00000000000000000000.seg").exists()
    assert archive.read(864, 960) == b"".join(record(i) for i in range(18, 20))
    with pytest.raises(ValueError, match="outside the log"):
        archive.read(0, 48)
    third = snapshot(tmp_path, rlog, 48 * 55)
    done = compact(archive, rlog, tmp_path, 2, 0)
    assert done is not None
    assert done.log_start == 1728
    assert done.snapshots_removed == 1
    assert not first.exists()
    assert second.exists()
    assert third.exists()
    assert [e.log_position for e in rlog.snapshots()] == [1920, 2640]
    assert compact(archive, rlog, tmp_path, 0, 0) is None  # retention 0: keep everything
    starts = [e for e in rlog.entries if e.type == ENTRY_TYPE_LOG_START]
    assert [e.log_position for e in starts] == [864, 1728]
    archive.close()
    rlog.close()
    # a restart opens the archive at its start, with the same log
    rlog = RecordingLog.open(tmp_path)
    assert reconcile(tmp_path, rlog) == 1728
    with Archive.open(tmp_path / "archive", segment_size=SEGMENT, start_position=1728) as again:
        assert again.start_position == 1728
        assert again.position == 2880
        assert again.read(1920, 1968) == record(40)


def test_a_purge_cut_short_is_finished_at_start_up(tmp_path: Path) -> None:
    rlog = RecordingLog.open(tmp_path)
    archive = Archive.open(tmp_path / "archive", segment_size=SEGMENT)
    fill(archive, 60)
    archive.close()
    # the crash came after the LOG_START entry, before any file was deleted
    rlog.append_log_start(1152, 0, 0, 0)
    with Archive.open(tmp_path / "archive", segment_size=SEGMENT, start_position=1152) as a:
        assert a.start_position == 1152
        assert a.position == 2880
        assert seg_bytes(tmp_path / "archive") == 2880 - 1152
        fill(a, 1, 60)
    # a log start no segment reaches is damage, not a purge
    (tmp_path / "archive" / "log-00000000000000001152.seg").unlink()
    with pytest.raises(ArchiveCorruptionError):
        Archive.open(tmp_path / "archive", segment_size=SEGMENT, start_position=1200)


def test_purge_never_deletes_the_last_segment(tmp_path: Path) -> None:
    with Archive.open(tmp_path / "archive", segment_size=SEGMENT) as archive:
        fill(archive, 10)  # [0, 288), [288, 480)
        assert archive.purge_point(10_000) == 288
        assert archive.purge(288) == 288
        assert archive.start_position == 288
        with pytest.raises(ValueError, match="not a segment base"):
            archive.purge(300)  # not a segment base
        fill(archive, 1, 10)
        assert archive.position == 528


def test_install_replaces_the_whole_log(tmp_path: Path) -> None:
    rlog = RecordingLog.open(tmp_path)
    rlog.append_term(0, 0, 0)
    rlog.append_term(3, 500, 0)
    archive = Archive.open(tmp_path / "archive", segment_size=SEGMENT)
    fill(archive, 30)  # an old log, not the leader's
    old = snapshot(tmp_path, rlog, 480)
    write_snapshot(snapshot_path(tmp_path, 5000, 7), b"the leader's")
    install_snapshot(
        archive,
        rlog,
        tmp_path,
        log_position=5000,
        leadership_term_id=7,
        term_base_log_position=4000,
        timestamp=1,
    )
    assert (archive.start_position, archive.position) == (5000, 5000)
    assert [p.name for p in (tmp_path / "archive").iterdir()] == ["log-00000000000000005000.seg"]
    terms = [
        (e.leadership_term_id, e.term_base_log_position)
        for e in rlog.entries
        if e.is_valid and e.type == ENTRY_TYPE_TERM
    ]
    assert terms == [(7, 4000)]
    assert [(e.log_position, e.leadership_term_id) for e in rlog.snapshots()] == [(5000, 7)]
    assert not old.exists()
    fill(archive, 2, 100)
    assert archive.read(5000, 5096) == record(100) + record(101)
    archive.close()
    assert reconcile(tmp_path, rlog) == 5000


@pytest.mark.parametrize("cut", ["before-reset", "between-renames", "before-record"])
def test_an_install_cut_short_is_finished_at_start_up(tmp_path: Path, cut: str) -> None:
    rlog = RecordingLog.open(tmp_path)
    rlog.append_term(0, 0, 0)
    archive = Archive.open(tmp_path / "archive", segment_size=SEGMENT)
    fill(archive, 30)
    archive.close()
    write_snapshot(snapshot_path(tmp_path, 5000, 7), b"the leader's")
    rlog.append_log_start(5000, 7, 4000, 1, reset=True)  # the commit point
    directory = tmp_path / "archive"
    if cut == "between-renames":
        fresh = tmp_path / "archive.reset"
        fresh.mkdir()
        (fresh / "log-00000000000000005000.seg").touch()
        directory.rename(tmp_path / "archive.old")
    elif cut == "before-record":
        reset_directory(directory, 5000)
    rlog.close()
    rlog = RecordingLog.open(tmp_path)
    assert reconcile(tmp_path, rlog) == 5000
    latest = rlog.latest_log_start()
    assert latest is not None
    assert latest.type == ENTRY_TYPE_LOG_RESET
    assert [(e.log_position, e.leadership_term_id) for e in rlog.snapshots()] == [(5000, 7)]
    with Archive.open(directory, segment_size=SEGMENT, start_position=5000) as a:
        assert (a.start_position, a.position) == (5000, 5000)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("archive")) == ["archive"]
    # once recorded, a second start-up does nothing more
    entries = len(rlog.entries)
    assert reconcile(tmp_path, rlog) == 5000
    assert len(rlog.entries) == entries
