"""A torn write or bit rot (issue 44, items 3 and 7): what a power cut leaves of the last,
unsynced write is truncated at start-up; damage to what this member had synced is
refused, naming the file, the position and the remedy (:mod:`cluster.archive.synced`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.archive import Archive, ArchiveCorruptionError, encode_record, read_log
from cluster.archive import synced as synced_module
from cluster.archive.synced import FILE_NAME, read_floor
from cluster.tool.offline import verify

SEGMENT = "log-00000000000000000000.seg"
MARK_EVERY = 2048


@pytest.fixture(autouse=True)
def _small_marks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(synced_module, "MARK_EVERY", MARK_EVERY)


def _record(i: int, size: int = 92) -> bytes:
    return encode_record(bytes((i * 7 + k) % 251 + 1 for k in range(size)))  # 100 bytes


def _append(directory: Path, first: int, count: int) -> int:
    """Append ``count`` 100-byte records, one per batch; return the position."""
    with Archive.open(directory, segment_size=1 << 20) as archive:
        for i in range(first, first + count):
            archive.append(_record(i))
        return archive.position


def _zero(path: Path, start: int, stop: int) -> None:
    with path.open("r+b") as f:
        f.seek(start)
        f.write(bytes(stop - start))


def test_the_mark_follows_the_synced_log_and_truncation_lowers_it_first(tmp_path: Path) -> None:
    assert _append(tmp_path, 0, 20) == 2000
    assert read_floor(tmp_path) == 0  # under MARK_EVERY bytes synced: not written yet
    assert _append(tmp_path, 20, 30) == 5000
    assert read_floor(tmp_path) == 4200  # each append that took it MARK_EVERY further
    with Archive.open(tmp_path, segment_size=1 << 20) as archive:
        archive.truncate(1500)
    assert read_floor(tmp_path) == 1500
    with Archive.open(tmp_path, segment_size=1 << 20) as archive:
        archive.reset(9000)  # a snapshot install: a new directory, no mark
    assert read_floor(tmp_path) == 0


def test_rot_below_the_synced_position_is_refused_naming_file_offset_and_remedy(
    tmp_path: Path,
) -> None:
    """A whole sector of synced records zeroed (a lost or misdirected write): it reads as a
    power cut leaves an unsynced sector, but it lies below ``synced-position``, so it is
    rot, and the member stops instead of dropping what it acknowledged."""
    _append(tmp_path, 0, 50)
    assert read_floor(tmp_path) == 4200
    path = tmp_path / SEGMENT
    _zero(path, 1024, 1536)  # inside records 10..15, valid records after it
    with pytest.raises(ArchiveCorruptionError) as info:
        Archive.open(tmp_path, segment_size=1 << 20)
    error = info.value
    assert error.path == str(path)
    assert error.position == 1000  # the record holding byte 1024
    text = str(error)
    assert SEGMENT in text
    assert "file offset 1000" in text
    assert f"below log position 4200, which this member had synced ({FILE_NAME})" in text
    assert "start the member on an empty --dir" in text  # the remedy
    assert path.stat().st_size == 5000  # nothing truncated
    with pytest.raises(ArchiveCorruptionError, match="below log position 4200"):
        list(read_log(tmp_path))


def test_rot_in_the_last_synced_record_is_refused_though_nothing_follows(tmp_path: Path) -> None:
    """Before the mark, damage with nothing valid after it was always taken for a torn
    write; below the mark it is known to have been synced."""
    _append(tmp_path, 0, 21)  # 2100 bytes: the mark is written at 2100
    assert read_floor(tmp_path) == 2100
    path = tmp_path / SEGMENT
    with path.open("r+b") as f:
        f.seek(2050)
        f.write(b"\xff")
    with pytest.raises(ArchiveCorruptionError, match="below log position 2100") as info:
        Archive.open(tmp_path, segment_size=1 << 20)
    assert info.value.position == 2000


def test_the_same_zeroed_sector_past_the_synced_position_is_a_torn_tail(tmp_path: Path) -> None:
    """The unsynced write (everything past the mark here): a lost sector with valid
    records after it is what a power cut leaves; it is truncated where the damage starts."""
    _append(tmp_path, 0, 60)
    assert read_floor(tmp_path) == 4200
    path = tmp_path / SEGMENT
    _zero(path, 4608, 5120)  # records 46..51; records 52.. valid after it
    with Archive.open(tmp_path, segment_size=1 << 20) as archive:
        assert archive.position == 4600
        assert archive.recovered_truncated_bytes == 1400
    assert path.stat().st_size == 4600


def test_a_lost_middle_sector_of_an_unsynced_write_is_a_torn_tail(tmp_path: Path) -> None:
    """The first sector of the write kept, the second lost, the third kept: the record
    across the lost sector fails its CRC and valid records follow it."""
    _append(tmp_path, 0, 10)  # 1000 bytes synced, no mark (under MARK_EVERY)
    path = tmp_path / SEGMENT
    with path.open("ab") as f:  # the unsynced write of 20 records: 1000..3000
        f.write(b"".join(_record(i) for i in range(10, 30)))
    _zero(path, 1536, 2048)
    with Archive.open(tmp_path, segment_size=1 << 20) as archive:
        assert archive.position == 1500  # the record holding byte 1536
        assert list(archive.records())[-1][1] == _record(14)[8:]


def test_a_partly_zeroed_sector_is_not_a_lost_sector(tmp_path: Path) -> None:
    """A lost sector reads as zeros to its end: zeros that stop short of it, with valid
    records after them, are rot."""
    _append(tmp_path, 0, 20)  # no mark
    path = tmp_path / SEGMENT
    _zero(path, 1024, 1535)
    with pytest.raises(ArchiveCorruptionError, match="no sector of it reads as a power cut"):
        Archive.open(tmp_path, segment_size=1 << 20)


def test_a_log_shorter_than_its_synced_position_is_refused(tmp_path: Path) -> None:
    _append(tmp_path, 0, 30)
    path = tmp_path / SEGMENT
    with path.open("r+b") as f:
        f.truncate(2000)
    with pytest.raises(ArchiveCorruptionError, match="synced log is missing") as info:
        Archive.open(tmp_path, segment_size=1 << 20)
    assert info.value.position == 2000


def test_a_mark_made_but_never_written_is_none_and_a_damaged_one_is_refused(
    tmp_path: Path,
) -> None:
    _append(tmp_path, 0, 30)
    mark = tmp_path / FILE_NAME
    mark.write_bytes(bytes(16))  # its size durable, its bytes not: nothing recorded
    assert read_floor(tmp_path) == 0
    mark.write_bytes(b"")
    with Archive.open(tmp_path, segment_size=1 << 20) as archive:
        assert archive.position == 3000
    mark.write_bytes(b"TSYN" + bytes(11) + b"\x01")
    with pytest.raises(ArchiveCorruptionError, match="not a synced position") as info:
        Archive.open(tmp_path, segment_size=1 << 20)
    assert info.value.path == str(mark)


def test_verify_judges_a_members_directory_as_its_start_would(tmp_path: Path) -> None:
    """``cluster-tool verify``: a lost sector past ``synced-position`` is a note (a start
    truncates it); the last record damaged below it is damage."""
    archive = tmp_path / "archive"
    _append(archive, 0, 60)
    path = archive / SEGMENT
    _zero(path, 4608, 5120)
    report = verify(tmp_path)
    assert report["ok"], report["problems"]
    [note] = report["problems"]
    assert note["note"]
    assert note["position"] == 4600
    with path.open("r+b") as f:
        f.seek(4150)
        f.write(b"\xff")  # record 41, below the mark (4200)
    report = verify(tmp_path)
    assert not report["ok"]
    [damage] = report["problems"]
    assert damage["position"] == 4100
    assert "below log position 4200" in damage["problem"]
