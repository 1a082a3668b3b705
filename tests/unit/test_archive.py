"""Tests for cluster.archive.segments: segment files, recovery, reads, truncation."""

from __future__ import annotations

import errno
import itertools
import logging
import os
import random
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.archive import (
    Archive,
    ArchiveCorruptionError,
    ArchiveError,
    ArchiveWriteError,
    FsyncPolicy,
    encode_record,
    read_log,
)
from cluster.archive import reader as reader_module
from cluster.archive.record import RECORD_HEADER_LENGTH

SMALL = 256


def body(i: int, size: int | None = None) -> bytes:
    size = (i * 37) % 90 + 1 if size is None else size
    return bytes((i + k) % 251 for k in range(size))


def records(bodies: list[bytes]) -> bytes:
    return b"".join(encode_record(b) for b in bodies)


def boundaries(bodies: list[bytes]) -> list[int]:
    """Start of every record, plus the end of the last one."""
    out = [0]
    for b in bodies:
        out.append(out[-1] + RECORD_HEADER_LENGTH + len(b))
    return out


def seg_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("log-*.seg"))


def fill(directory: Path, bodies: list[bytes], segment_size: int = SMALL) -> bytes:
    """Append ``bodies`` in batches of three, close; return the log bytes."""
    with Archive.open(directory, segment_size=segment_size) as archive:
        for i in range(0, len(bodies), 3):
            archive.append(records(bodies[i : i + 3]))
        assert archive.position == len(records(bodies))
    return records(bodies)


@pytest.fixture
def bodies() -> list[bytes]:
    return [body(i) for i in range(60)]


# -- append / reopen / read back -----------------------------------------------------------


def test_append_reopen_read_back_across_small_segments(tmp_path: Path, bodies: list[bytes]) -> None:
    log = fill(tmp_path, bodies)
    files = seg_files(tmp_path)
    assert len(files) > 5
    base = 0
    for path in files:
        assert path.name == f"log-{base:020d}.seg"
        base += path.stat().st_size
    assert base == len(log)
    # every closed segment ends at the first record boundary at or past segment_size
    starts = set(boundaries(bodies))
    for path in files[:-1]:
        size = path.stat().st_size
        first = int(path.name[4:24])
        assert size >= SMALL
        assert first + size in starts
        assert not any(first + SMALL <= b < first + size for b in starts)

    with Archive.open(tmp_path, segment_size=SMALL) as archive:
        assert archive.position == len(log)
        assert archive.recovered_truncated_bytes == 0
        assert archive.read(0) == log
        got = [(pos, bytes(b)) for pos, b in archive.records()]
    assert got == list(zip(boundaries(bodies), bodies, strict=False))
    assert [(pos, bytes(b)) for pos, b in read_log(tmp_path)] == got


def test_layout_is_independent_of_batching(tmp_path: Path, bodies: list[bytes]) -> None:
    one_by_one, one_batch = tmp_path / "a", tmp_path / "b"
    with Archive.open(one_by_one, segment_size=SMALL) as archive:
        for b in bodies:
            archive.append(encode_record(b))
    with Archive.open(one_batch, segment_size=SMALL) as archive:
        archive.append(records(bodies))
    files_a, files_b = seg_files(one_by_one), seg_files(one_batch)
    assert [p.name for p in files_a] == [p.name for p in files_b]
    assert [p.read_bytes() for p in files_a] == [p.read_bytes() for p in files_b]


def test_checked_appends_are_cut_between_segments_at_record_ends(
    tmp_path: Path, bodies: list[bytes]
) -> None:
    """``checked=True`` (the node's appends: whole records it encoded or checked) skips
    the walk only where the data fits the segment; across segments it is cut at record
    ends, the same layout as unchecked appends."""
    unchecked, checked = tmp_path / "a", tmp_path / "b"
    fill(unchecked, bodies)
    with Archive.open(checked, segment_size=SMALL) as archive:
        for i in range(0, len(bodies), 3):
            archive.append(records(bodies[i : i + 3]), checked=True)
        archive.append(records(bodies[:1]), checked=True)  # fits: not walked
    files_a, files_b = seg_files(unchecked), seg_files(checked)
    assert [p.name for p in files_a] == [p.name for p in files_b]
    data_b = b"".join(p.read_bytes() for p in files_b)
    assert data_b == b"".join(p.read_bytes() for p in files_a) + records(bodies[:1])
    with Archive.open(checked, segment_size=SMALL) as archive:
        assert archive.recovered_truncated_bytes == 0
        assert [bytes(b) for _, b in archive.records()] == [*bodies, bodies[0]]


def test_record_larger_than_segment_size_sits_alone(tmp_path: Path) -> None:
    big = body(1, 3 * SMALL)
    with Archive.open(tmp_path, segment_size=SMALL) as archive:
        archive.append(records([big, b"x", b"y"]))
        sizes = [s.length for s in archive.segments]
        assert sizes == [RECORD_HEADER_LENGTH + len(big), 18]
        assert [bytes(b) for _, b in archive.records()] == [big, b"x", b"y"]


def test_append_accepts_bytearray_and_memoryview(tmp_path: Path) -> None:
    with Archive.open(tmp_path) as archive:
        assert archive.append(bytearray(encode_record(b"a"))) == 9
        assert archive.append(memoryview(encode_record(b"bc"))) == 19
        assert archive.append(b"") == 19
        with pytest.raises(ValueError, match="contiguous"):
            archive.append(memoryview(encode_record(b"ab") * 2)[::2])
        assert archive.position == 19
        assert archive.read(0) == encode_record(b"a") + encode_record(b"bc")


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (encode_record(b"abc")[:5], "inside a record header"),
        (encode_record(b"abc")[:-1], "inside the record at offset 0"),
        (encode_record(b"ok") + encode_record(b"abc")[:-1], "inside the record at offset 10"),
        (encode_record(b""), "empty record"),
        (b"\xff\xff\xff\xff" + b"\0" * 8, "longer than"),
    ],
)
def test_append_rejects_partial_or_invalid_records(tmp_path: Path, data: bytes, match: str) -> None:
    with Archive.open(tmp_path) as archive:
        archive.append(encode_record(b"first"))
        with pytest.raises(ValueError, match=match):
            archive.append(data)
        assert archive.position == 13
        assert [s.length for s in archive.segments] == [13]
    assert (tmp_path / "log-00000000000000000000.seg").stat().st_size == 13


def test_open_creates_directory_and_validates_arguments(tmp_path: Path) -> None:
    nested = tmp_path / "a" / "b"
    with Archive.open(nested) as archive:
        assert nested.is_dir()
        assert archive.position == 0
        assert archive.read(0) == b""
        assert list(archive.records()) == []
    with pytest.raises(ValueError, match="segment_size must be positive"):
        Archive.open(tmp_path, segment_size=0)


def test_closed_archive_refuses_operations(tmp_path: Path) -> None:
    archive = Archive.open(tmp_path)
    archive.append(encode_record(b"x"))
    archive.close()
    archive.close()
    with pytest.raises(ArchiveError, match="closed"):
        archive.append(encode_record(b"y"))
    with pytest.raises(ArchiveError, match="closed"):
        archive.read(0)


# -- fsync policy ----------------------------------------------------------------------


def test_fsync_policy_parse() -> None:
    assert FsyncPolicy.parse("batch") is FsyncPolicy.BATCH
    assert FsyncPolicy.parse(" NONE ") is FsyncPolicy.NONE
    for bad in ["", "always", "fsync"]:
        with pytest.raises(ValueError, match=r"invalid fsync policy .*'batch', 'none'"):
            FsyncPolicy.parse(bad)
    with pytest.raises(ValueError, match="invalid fsync policy None"):
        FsyncPolicy.parse(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(("policy", "expected"), [(FsyncPolicy.BATCH, 3), (FsyncPolicy.NONE, 0)])
def test_fsync_policy_controls_fdatasync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: FsyncPolicy, expected: int
) -> None:
    calls: list[int] = []
    real = os.fdatasync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting)
    with Archive.open(tmp_path, fsync=policy) as archive:
        for i in range(3):
            archive.append(records([body(i), body(i + 1)]))
    assert len(calls) == expected


# -- torn tail -------------------------------------------------------------------------


def _last_segment(directory: Path) -> Path:
    return seg_files(directory)[-1]


@pytest.mark.parametrize(
    "tail",
    [
        pytest.param(encode_record(b"partial record")[:-3], id="incomplete-body"),
        pytest.param(encode_record(b"partial")[:5], id="incomplete-header"),
        pytest.param(b"\0" * 100, id="zeros"),
        pytest.param(b"\x10\x27\0\0" + b"\1" * 30, id="length-past-eof"),
        pytest.param(encode_record(b"bad crc")[:-1] + b"!", id="bad-crc-last"),
        pytest.param(b"\xff\xff\xff\x7f" + b"\0" * 20, id="huge-length"),
    ],
)
def test_torn_tail_is_truncated_with_warning(
    tmp_path: Path, bodies: list[bytes], caplog: pytest.LogCaptureFixture, tail: bytes
) -> None:
    log = fill(tmp_path, bodies)
    last = _last_segment(tmp_path)
    size = last.stat().st_size
    with last.open("ab") as f:
        f.write(tail)
    with caplog.at_level(logging.WARNING, logger="cluster.archive"):
        archive = Archive.open(tmp_path, segment_size=SMALL)
    with archive:
        assert archive.position == len(log)
        assert archive.recovered_truncated_bytes == len(tail)
        assert last.stat().st_size == size
        assert archive.read(0) == log
        archive.append(encode_record(b"after"))
    [message] = [r.getMessage() for r in caplog.records if r.name == "cluster.archive"]
    assert last.name in message
    assert f"position {len(log)}" in message
    assert f"dropped {len(tail)} bytes" in message
    caplog.clear()
    with Archive.open(tmp_path, segment_size=SMALL) as archive:
        assert archive.recovered_truncated_bytes == 0
        assert archive.read(0) == log + encode_record(b"after")
    assert not caplog.records


def test_torn_tail_can_empty_the_last_segment(tmp_path: Path, bodies: list[bytes]) -> None:
    log = fill(tmp_path, bodies)
    last = _last_segment(tmp_path)
    base = int(last.name[4:24])
    with last.open("r+b") as f:  # the only record of the segment loses its end
        f.truncate(5)
    with Archive.open(tmp_path, segment_size=SMALL) as archive:
        assert archive.position == base
        assert archive.read(0) == log[:base]
        assert archive.segments[-1].length == 0
        archive.append(encode_record(b"again"))
    assert [bytes(b) for _, b in read_log(tmp_path)][-1] == b"again"


def test_empty_last_segment_after_crash_on_roll(tmp_path: Path, bodies: list[bytes]) -> None:
    log = fill(tmp_path, bodies)
    (tmp_path / f"log-{len(log):020d}.seg").touch()
    with Archive.open(tmp_path, segment_size=SMALL) as archive:
        assert archive.position == len(log)
        archive.append(encode_record(b"next"))
        assert archive.segments[-1].base == len(log)
        assert archive.read(len(log)) == encode_record(b"next")


def test_read_log_stops_at_torn_tail_without_repairing(tmp_path: Path, bodies: list[bytes]) -> None:
    fill(tmp_path, bodies)
    last = _last_segment(tmp_path)
    with last.open("ab") as f:
        f.write(b"\x05\0\0\0torn")
    size = last.stat().st_size
    assert [bytes(b) for _, b in read_log(tmp_path)] == bodies
    assert last.stat().st_size == size


# -- corruption ------------------------------------------------------------------------


def _flip(path: Path, offset: int, mask: int = 0x01) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ mask]))


def test_corruption_followed_by_valid_records_in_last_segment(tmp_path: Path) -> None:
    bodies = [body(i, 10) for i in range(5)]
    fill(tmp_path, bodies, segment_size=1 << 20)
    [path] = seg_files(tmp_path)
    _flip(path, 18 + RECORD_HEADER_LENGTH + 3)  # body of the second record (at 18)
    with pytest.raises(ArchiveCorruptionError) as info:
        Archive.open(tmp_path)
    assert info.value.path == str(path)
    assert info.value.position == 18
    assert path.name in str(info.value)
    assert "position 18" in str(info.value)
    assert "crc mismatch" in str(info.value)
    assert path.stat().st_size == 5 * 18  # nothing was truncated
    with pytest.raises(ArchiveCorruptionError, match="position 18"):
        list(read_log(tmp_path))


@pytest.mark.parametrize(
    ("offset", "mask"),
    [
        pytest.param(18 + 2, 0x10, id="length-runs-past-eof"),
        pytest.param(18 + 0, 0x02, id="length-shorter"),
        pytest.param(18 + 0, 0x0A, id="length-zero"),
        pytest.param(18 + 3, 0xFF, id="length-exceeds-max"),
    ],
)
def test_damaged_length_field_followed_by_records_is_corruption(
    tmp_path: Path, offset: int, mask: int
) -> None:
    """A length flip in the last segment is not mistaken for a torn write."""
    fill(tmp_path, [body(i, 10) for i in range(5)], segment_size=1 << 20)
    [path] = seg_files(tmp_path)
    _flip(path, offset, mask)
    with pytest.raises(ArchiveCorruptionError) as info:
        Archive.open(tmp_path)
    assert info.value.position == 18
    assert path.stat().st_size == 5 * 18


def test_chain_finds_records_beyond_the_resync_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader_module, "RESYNC_WINDOW", 16)
    fill(tmp_path, [body(i, 40) for i in range(4)], segment_size=1 << 20)
    [path] = seg_files(tmp_path)
    _flip(path, 48 + 20)  # body of the second record; the next one is 48 bytes long
    with pytest.raises(ArchiveCorruptionError, match="valid records follow") as info:
        Archive.open(tmp_path)
    assert info.value.position == 48


def test_damaged_length_of_the_final_record_is_corruption(tmp_path: Path) -> None:
    """The record is complete under a damaged length: acknowledged data, not a torn write."""
    fill(tmp_path, [body(i, 10) for i in range(5)], segment_size=1 << 20)
    [path] = seg_files(tmp_path)
    _flip(path, 4 * 18, 0x03)
    with pytest.raises(ArchiveCorruptionError, match="record is intact with length 10") as info:
        Archive.open(tmp_path)
    assert info.value.position == 4 * 18


def test_zeroed_block_inside_the_last_segment_is_corruption(tmp_path: Path) -> None:
    """Damage to more than one header is found by resynchronising on later records."""
    fill(tmp_path, [body(i, 10) for i in range(8)], segment_size=1 << 20)
    [path] = seg_files(tmp_path)
    with path.open("r+b") as f:
        f.seek(18 + 5)
        f.write(bytes(30))  # from inside record 1's header into record 2's body
    with pytest.raises(ArchiveCorruptionError, match="valid records follow") as info:
        Archive.open(tmp_path)
    assert info.value.position == 18


def test_inconclusive_scan_truncates_only_an_interrupted_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader_module, "RESYNC_CRC_BUDGET", 0)
    plausible = b"\x05\x00\x00\x00" * 50  # a plausible length at every fourth byte
    log = fill(tmp_path, [body(i, 10) for i in range(3)], segment_size=1 << 20)
    [path] = seg_files(tmp_path)
    with path.open("ab") as f:  # an interrupted write: header promises more than follows
        f.write(b"\x00\x10\x00\x00\x01\x02\x03\x04" + plausible)
    with Archive.open(tmp_path) as archive:
        assert archive.position == len(log)
    with path.open("ab") as f:  # a complete record with a bad CRC: cannot be sure
        f.write(b"\x04\x00\x00\x00\x01\x02\x03\x04abcd" + plausible)
    with pytest.raises(ArchiveCorruptionError, match="cannot rule out") as info:
        Archive.open(tmp_path)
    assert info.value.position == len(log)


def test_corruption_in_earlier_segment_names_that_file(tmp_path: Path, bodies: list[bytes]) -> None:
    fill(tmp_path, bodies)
    files = seg_files(tmp_path)
    victim = files[2]
    size = victim.stat().st_size
    _flip(victim, size - 1)  # last byte of its last record: still not a torn tail
    base = int(victim.name[4:24])
    starts = [b for b in boundaries(bodies) if base <= b < base + size]
    with pytest.raises(ArchiveCorruptionError) as info:
        Archive.open(tmp_path, segment_size=SMALL)
    assert info.value.path == str(victim)
    assert info.value.position == starts[-1]
    assert victim.name in str(info.value)
    assert f"position {starts[-1]}" in str(info.value)
    assert "not in the last segment" in str(info.value)


def test_truncated_earlier_segment_is_corruption(tmp_path: Path, bodies: list[bytes]) -> None:
    fill(tmp_path, bodies)
    files = seg_files(tmp_path)
    files[1].write_bytes(files[1].read_bytes()[:-4])
    with pytest.raises(ArchiveCorruptionError, match="must be contiguous") as info:
        Archive.open(tmp_path, segment_size=SMALL)
    assert info.value.path == str(files[2])


def test_non_contiguous_segments(tmp_path: Path, bodies: list[bytes]) -> None:
    fill(tmp_path, bodies)
    files = seg_files(tmp_path)
    files[3].unlink()
    with pytest.raises(ArchiveCorruptionError) as info:
        Archive.open(tmp_path, segment_size=SMALL)
    assert info.value.path == str(files[4])
    assert files[4].name in str(info.value)
    assert files[2].name in str(info.value)
    with pytest.raises(ArchiveCorruptionError, match="contiguous"):
        read_log(tmp_path)


def test_records_reports_corruption_found_after_open(tmp_path: Path, bodies: list[bytes]) -> None:
    fill(tmp_path, bodies)
    with Archive.open(tmp_path, segment_size=SMALL) as archive:
        victim = seg_files(tmp_path)[1]
        base = int(victim.name[4:24])
        _flip(victim, RECORD_HEADER_LENGTH)
        with pytest.raises(ArchiveCorruptionError) as info:
            list(archive.records())
        assert info.value.path == str(victim)
        assert info.value.position == base


# -- read / records ranges --------------------------------------------------------------


def test_read_across_segment_boundaries(tmp_path: Path, bodies: list[bytes]) -> None:
    log = fill(tmp_path, bodies)
    with Archive.open(tmp_path, segment_size=SMALL) as archive:
        bases = [s.base for s in archive.segments]
        for b in bases[1:]:
            assert archive.read(b - 7, b + 5) == log[b - 7 : b + 5]
        assert archive.read(bases[1] - 1, bases[4] + 1) == log[bases[1] - 1 : bases[4] + 1]
        assert archive.read(5, 5) == b""
        assert archive.read(len(log)) == b""
        rng = random.Random(7)
        for _ in range(50):
            a, b = sorted(rng.randrange(len(log) + 1) for _ in range(2))
            assert archive.read(a, b) == log[a:b]
        for start, stop in [(-1, 3), (0, len(log) + 1), (10, 9), (len(log) + 1, None)]:
            with pytest.raises(ValueError, match="outside the log"):
                archive.read(start, stop)


def test_records_subrange_and_boundary_checks(tmp_path: Path, bodies: list[bytes]) -> None:
    fill(tmp_path, bodies)
    starts = boundaries(bodies)
    with Archive.open(tmp_path, segment_size=SMALL) as archive:
        got = [(p, bytes(b)) for p, b in archive.records(starts[10], starts[40])]
        assert got == list(zip(starts[10:40], bodies[10:40], strict=True))
        with pytest.raises(ValueError, match="inside the record"):
            list(archive.records(starts[10], starts[40] - 1))
        with pytest.raises(ArchiveCorruptionError, match="record boundary"):
            list(archive.records(starts[10] + 1))
        with pytest.raises(ValueError, match="outside the log"):
            archive.records(0, archive.position + 1)


def test_records_reads_in_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bodies: list[bytes]
) -> None:
    big = [*bodies[:5], body(99, 300), *bodies[5:]]
    fill(tmp_path, big, segment_size=4096)
    reads: list[int] = []
    real = os.pread

    def spy(fd: int, size: int, offset: int) -> bytes:
        reads.append(size)
        return real(fd, size, offset)

    monkeypatch.setattr(reader_module, "READ_CHUNK", 16)
    monkeypatch.setattr(os, "pread", spy)
    with Archive.open(tmp_path, segment_size=4096) as archive:
        reads.clear()
        assert [bytes(b) for _, b in archive.records()] == big
    assert 16 < max(reads) <= RECORD_HEADER_LENGTH + 300  # the big record is read whole
    assert len(reads) > 20


# -- truncate ----------------------------------------------------------------------------


def test_truncate(tmp_path: Path, bodies: list[bytes]) -> None:
    log = fill(tmp_path, bodies)
    starts = boundaries(bodies)
    with Archive.open(tmp_path, segment_size=SMALL) as archive:
        bases = [s.base for s in archive.segments]
        archive.truncate(starts[50])  # inside a segment
        assert archive.position == starts[50]
        assert archive.read(0) == log[: starts[50]]
        archive.truncate(bases[3])  # exactly at a segment base: that segment is deleted
        assert archive.position == bases[3]
        assert [s.base for s in archive.segments] == bases[:3]
        assert [p.name for p in seg_files(tmp_path)] == [f"log-{b:020d}.seg" for b in bases[:3]]
        with pytest.raises(ValueError, match="inside the record"):
            archive.truncate(starts[3] + 1)
        with pytest.raises(ValueError, match="cannot truncate"):
            archive.truncate(bases[3] + 1)
        archive.append(records(bodies[40:43]))
        expected = log[: bases[3]] + records(bodies[40:43])
    with Archive.open(tmp_path, segment_size=SMALL) as archive:
        assert archive.read(0) == expected
        archive.truncate(0)
        assert archive.position == 0
        assert [s.length for s in archive.segments] == [0]
        archive.append(encode_record(b"fresh"))
    assert [bytes(b) for _, b in read_log(tmp_path)] == [b"fresh"]


# -- write failures ----------------------------------------------------------------------


def _fail_once(real: Callable[..., int], exc: OSError, partial: bool = False) -> Callable[..., int]:
    state = {"failed": False}

    def write(fd: int, data: memoryview, *offset: int) -> int:
        if not state["failed"]:
            state["failed"] = True
            if partial:
                real(fd, data[: len(data) // 2], *offset)
            raise exc
        return real(fd, data, *offset)

    return write


@pytest.mark.parametrize("partial", [False, True])
def test_enospc_rolls_back_and_retry_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, partial: bool
) -> None:
    with Archive.open(tmp_path, segment_size=1 << 20) as archive:
        archive.append(encode_record(b"one"))
        monkeypatch.setattr(
            os, "pwrite", _fail_once(os.pwrite, OSError(errno.ENOSPC, "No space"), partial)
        )
        batch = records([b"two", b"three"])
        with pytest.raises(ArchiveWriteError) as info:
            archive.append(batch)
        assert isinstance(info.value, OSError)
        assert info.value.errno == errno.ENOSPC
        assert "rolled back" in str(info.value)
        assert archive.position == 11
        assert seg_files(tmp_path)[0].stat().st_size == 11
        assert archive.append(batch) == 11 + len(batch)
    with Archive.open(tmp_path) as archive:
        assert archive.recovered_truncated_bytes == 0
        assert [bytes(b) for _, b in archive.records()] == [b"one", b"two", b"three"]


def test_enospc_on_new_segment_removes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Archive.open(tmp_path, segment_size=16) as archive:
        archive.append(encode_record(b"0123456789"))  # 18 bytes: segment full
        monkeypatch.setattr(os, "pwrite", _fail_once(os.pwrite, OSError(errno.ENOSPC, "full")))
        with pytest.raises(ArchiveWriteError):
            archive.append(encode_record(b"next"))
        assert [p.name for p in seg_files(tmp_path)] == ["log-00000000000000000000.seg"]
        assert archive.position == 18
        archive.append(encode_record(b"next"))
        assert [s.base for s in archive.segments] == [0, 18]


def test_a_write_that_makes_no_progress_is_an_error_and_rolls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device that takes nothing (``pwrite`` returns 0) is an EIO, not a busy loop."""
    with Archive.open(tmp_path) as archive:
        archive.append(encode_record(b"one"))
        monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: 0)
        with pytest.raises(ArchiveWriteError) as info:
            archive.append(encode_record(b"two"))
        assert info.value.errno == errno.EIO
        assert "no progress" in str(info.value)
        assert archive.position == 11
        monkeypatch.undo()
        archive.append(encode_record(b"two"))
        assert archive.read(0) == records([b"one", b"two"])


def test_fdatasync_failure_rolls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Archive.open(tmp_path) as archive:
        archive.append(encode_record(b"one"))

        def broken(fd: int) -> None:
            raise OSError(errno.EIO, "I/O error")

        monkeypatch.setattr(os, "fdatasync", broken)
        with pytest.raises(ArchiveWriteError) as info:
            archive.append(encode_record(b"two"))
        assert info.value.errno == errno.EIO
        assert archive.position == 11
        monkeypatch.undo()
        archive.append(encode_record(b"two"))
        assert archive.read(0) == records([b"one", b"two"])


# -- properties ----------------------------------------------------------------------------

batches_strategy = st.lists(
    st.lists(st.binary(min_size=1, max_size=60), min_size=0, max_size=6), min_size=1, max_size=15
)


@contextmanager
def temp_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as name:
        yield Path(name)


@settings(max_examples=60, deadline=None)
@given(batches=batches_strategy, segment_size=st.integers(1, 300))
def test_random_batches_read_back_identical(batches: list[list[bytes]], segment_size: int) -> None:
    flat = [b for batch in batches for b in batch]
    with temp_dir() as directory:
        with Archive.open(directory, segment_size=segment_size, fsync=FsyncPolicy.NONE) as archive:
            for batch in batches:
                before = archive.position
                assert archive.append(records(batch)) == before + len(records(batch))
        with Archive.open(directory, segment_size=segment_size) as archive:
            assert archive.position == len(records(flat))
            assert archive.recovered_truncated_bytes == 0
            assert archive.read(0) == records(flat)
            assert [bytes(b) for _, b in archive.records()] == flat
            for segment in archive.segments[:-1]:
                assert segment.length >= segment_size
        assert [bytes(b) for _, b in read_log(directory)] == flat


@settings(max_examples=80, deadline=None)
@given(
    bodies=st.lists(st.binary(min_size=1, max_size=50), min_size=1, max_size=30),
    segment_size=st.integers(16, 200),
    data=st.data(),
)
def test_random_truncation_recovers_to_a_record_boundary(
    bodies: list[bytes], segment_size: int, data: st.DataObject
) -> None:
    log = records(bodies)
    starts = boundaries(bodies)
    with temp_dir() as directory:
        fill(directory, bodies, segment_size)
        files = seg_files(directory)
        keep = data.draw(st.integers(0, len(files) - 1), label="last kept segment")
        for path in files[keep + 1 :]:
            path.unlink()
        victim = files[keep]
        base = int(victim.name[4:24])
        cut = data.draw(st.integers(0, victim.stat().st_size), label="cut")
        os.truncate(victim, cut)
        expected = max(b for b in starts if b <= base + cut)
        with Archive.open(directory, segment_size=segment_size) as archive:
            assert archive.position == expected
            assert archive.recovered_truncated_bytes == base + cut - expected
            assert archive.read(0) == log[:expected]
            assert [bytes(b) for _, b in archive.records()] == bodies[: starts.index(expected)]


@settings(max_examples=80, deadline=None)
@given(
    bodies=st.lists(st.binary(min_size=1, max_size=50), min_size=2, max_size=30),
    segment_size=st.integers(16, 200),
    mask=st.integers(1, 255),
    data=st.data(),
)
def test_random_byte_flip_before_the_tail_is_corruption(
    bodies: list[bytes], segment_size: int, mask: int, data: st.DataObject
) -> None:
    starts = boundaries(bodies)
    with temp_dir() as directory:
        fill(directory, bodies, segment_size)
        files = seg_files(directory)
        last_base = int(files[-1].name[4:24])
        # any byte of an earlier segment, any byte of a record followed by another record
        # in the last segment, and the length field of the final record
        candidates = list(range(last_base))
        for start, end in itertools.pairwise(starts[:-1]):
            if start >= last_base:
                candidates.extend(range(start, end))
        candidates.extend(range(max(last_base, starts[-2]), starts[-2] + 4))
        target = data.draw(st.sampled_from(candidates), label="flipped byte")
        record_start = max(b for b in starts if b <= target)
        victim = next(p for p in reversed(files) if int(p.name[4:24]) <= target)
        _flip(victim, target - int(victim.name[4:24]), mask)
        with pytest.raises(ArchiveCorruptionError) as info:
            Archive.open(directory, segment_size=segment_size)
        assert info.value.path == str(victim)
        assert info.value.position == record_start
        assert victim.name in str(info.value)
        assert f"position {record_start}" in str(info.value)


@settings(max_examples=60, deadline=None)
@given(
    bodies=st.lists(st.binary(min_size=1, max_size=50), min_size=1, max_size=10),
    garbage=st.binary(min_size=1, max_size=200),
)
def test_random_garbage_tail_is_dropped(bodies: list[bytes], garbage: bytes) -> None:
    log = records(bodies)
    with temp_dir() as directory:
        fill(directory, bodies, 1 << 20)
        with seg_files(directory)[-1].open("ab") as f:
            f.write(garbage)
        with Archive.open(directory) as archive:
            assert archive.position == len(log)
            assert archive.read(0) == log
