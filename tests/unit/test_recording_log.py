"""Tests for cluster.archive.recording_log: terms, snapshots, invalidation, torn entries."""

from __future__ import annotations

import logging
import struct
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.archive import ArchiveCorruptionError, Entry, RecordingLog
from cluster.archive.recording_log import (
    ENTRY_LENGTH,
    ENTRY_TYPE_SNAPSHOT,
    ENTRY_TYPE_TERM,
    FILE_NAME,
)


def summary(entries: list[Entry]) -> list[tuple[int, int, int, int, int, bool]]:
    """(type, term, base, log position, service, valid) of each entry."""
    return [
        (
            e.type,
            e.leadership_term_id,
            e.term_base_log_position,
            e.log_position,
            e.service_id,
            e.is_valid,
        )
        for e in entries
    ]


def test_open_creates_empty_log(tmp_path: Path) -> None:
    with RecordingLog.open(tmp_path / "cluster") as log:
        assert log.entries == []
        assert log.find_last_term() is None
        assert log.get_latest_snapshot(-1) is None
        assert not log.invalidate_latest_snapshot()
    assert (tmp_path / "cluster" / FILE_NAME).stat().st_size == 0


def test_on_disk_layout(tmp_path: Path) -> None:
    with RecordingLog.open(tmp_path) as log:
        log.append_term(3, 1000, timestamp=77, recording_id=5)
        log.append_snapshot(3, 1000, 1500, timestamp=78, service_id=-1)
        log.invalidate_latest_snapshot()
    raw = (tmp_path / FILE_NAME).read_bytes()
    assert len(raw) == 2 * ENTRY_LENGTH == 128
    term = struct.unpack_from("<qqqqqii", raw, 0)
    assert term == (5, 3, 1000, -1, 77, -1, 0)
    assert raw[48:60] == bytes(12)
    assert struct.unpack_from("<I", raw, 60)[0] == zlib.crc32(raw[:60])
    snap = struct.unpack_from("<qqqqqiI", raw, 64)
    assert snap == (0, 3, 1000, 1500, 78, -1, 0x80000001)
    assert struct.unpack_from("<I", raw, 124)[0] == zlib.crc32(raw[64:124])


def test_append_term_commits_previous_term(tmp_path: Path) -> None:
    with RecordingLog.open(tmp_path) as log:
        first = log.append_term(0, 0, timestamp=1)
        assert first.log_position == -1
        log.append_term(1, 400, timestamp=2)
        log.append_term(4, 900, timestamp=3)
        assert summary(log.entries) == [
            (ENTRY_TYPE_TERM, 0, 0, 400, -1, True),
            (ENTRY_TYPE_TERM, 1, 400, 900, -1, True),
            (ENTRY_TYPE_TERM, 4, 900, -1, -1, True),
        ]
        last = log.find_last_term()
        assert last is not None
        assert last.leadership_term_id == 4
    with RecordingLog.open(tmp_path) as log:
        assert summary(log.entries)[0] == (ENTRY_TYPE_TERM, 0, 0, 400, -1, True)
        assert [e.timestamp for e in log.entries] == [1, 2, 3]


def test_append_term_rejects_duplicates_and_backwards_base(tmp_path: Path) -> None:
    with RecordingLog.open(tmp_path) as log:
        log.append_term(2, 100, timestamp=0)
        with pytest.raises(ValueError, match="leadership term 2 is already in the log"):
            log.append_term(2, 100, timestamp=1)
        with pytest.raises(ValueError, match="precedes term 2 base 100"):
            log.append_term(3, 99, timestamp=1)
        assert len(log.entries) == 1
    assert (tmp_path / FILE_NAME).stat().st_size == ENTRY_LENGTH


def test_out_of_order_term_is_backfilled(tmp_path: Path) -> None:
    with RecordingLog.open(tmp_path) as log:
        log.append_term(0, 0, timestamp=0)
        log.append_term(2, 500, timestamp=0)
        log.append_term(1, 200, timestamp=0)
        assert [(e.leadership_term_id, e.log_position) for e in log.entries] == [
            (0, 200),
            (1, 500),
            (2, -1),
        ]
        assert [e.index for e in log.entries] == [0, 2, 1]


def test_commit_log_position(tmp_path: Path) -> None:
    with RecordingLog.open(tmp_path) as log:
        log.append_term(7, 64, timestamp=0)
        log.commit_log_position(7, 640)
        with pytest.raises(ValueError, match="unknown leadership term 8"):
            log.commit_log_position(8, 700)
    with RecordingLog.open(tmp_path) as log:
        entry = log.get_term_entry(7)
        assert entry is not None
        assert entry.log_position == 640


def _snapshot_set(log: RecordingLog, term: int, position: int, services: int = 2) -> None:
    for service in reversed(range(services)):
        log.append_snapshot(term, 0, position, timestamp=position, service_id=service)
    log.append_snapshot(term, 0, position, timestamp=position, service_id=-1)


def test_snapshots_and_invalidation(tmp_path: Path) -> None:
    with RecordingLog.open(tmp_path) as log:
        log.append_term(0, 0, timestamp=0)
        _snapshot_set(log, 0, 100)
        _snapshot_set(log, 0, 300)
        assert [e.service_id for e in log.entries[1:4]] == [1, 0, -1]
        for service in (-1, 0, 1):
            latest = log.get_latest_snapshot(service)
            assert latest is not None
            assert latest.log_position == 300
            assert latest.type == ENTRY_TYPE_SNAPSHOT
        assert log.get_latest_snapshot(2) is None

        assert log.invalidate_latest_snapshot()
        assert [(e.log_position, e.is_valid) for e in log.entries[4:]] == [
            (300, False),
            (300, False),
            (300, False),
        ]
        assert all(e.is_valid for e in log.entries[:4])
    with RecordingLog.open(tmp_path) as log:
        for service in (-1, 0, 1):
            latest = log.get_latest_snapshot(service)
            assert latest is not None
            assert latest.log_position == 100
        assert log.invalidate_latest_snapshot()
        assert log.get_latest_snapshot(-1) is None
        assert not log.invalidate_latest_snapshot()
        term = log.find_last_term()
        assert term is not None
        assert term.is_valid


def test_invalidation_stops_at_an_earlier_set(tmp_path: Path) -> None:
    """Only the services taken at the CM snapshot's position are invalidated."""
    with RecordingLog.open(tmp_path) as log:
        log.append_term(0, 0, timestamp=0)
        log.append_snapshot(0, 0, 100, timestamp=0, service_id=0)  # orphan: no CM entry
        log.append_snapshot(0, 0, 200, timestamp=0, service_id=-1)
        assert log.invalidate_latest_snapshot()
        assert summary(log.entries)[1:] == [
            (ENTRY_TYPE_SNAPSHOT, 0, 0, 100, 0, True),
            (ENTRY_TYPE_SNAPSHOT, 0, 0, 200, -1, False),
        ]


def test_reappending_invalidated_snapshot_restores_it(tmp_path: Path) -> None:
    with RecordingLog.open(tmp_path) as log:
        log.append_term(0, 0, timestamp=0)
        _snapshot_set(log, 0, 100, services=1)
        log.invalidate_latest_snapshot()
        restored = log.append_snapshot(0, 0, 100, timestamp=100, service_id=-1)
        assert restored.is_valid
        assert restored.index == 2
        assert len(log.entries) == 3
        cm = log.get_latest_snapshot(-1)
        assert cm == restored
        assert log.get_latest_snapshot(0) is None  # only the re-appended entry is restored


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda raw: raw + b"\x01" * 10, id="partial-entry"),
        pytest.param(lambda raw: raw[:-1] + bytes([raw[-1] ^ 0x40]), id="bad-crc-last"),
        pytest.param(lambda raw: raw[:-64] + bytes(64), id="zeroed-last"),
    ],
)
def test_torn_last_entry_is_truncated_with_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[bytes], bytes]
) -> None:
    with RecordingLog.open(tmp_path) as log:
        log.append_term(0, 0, timestamp=0)
        log.append_term(1, 100, timestamp=0)
        log.append_term(2, 200, timestamp=0)
    path = tmp_path / FILE_NAME
    raw = path.read_bytes()
    damaged = damage(raw)
    path.write_bytes(damaged)
    keep = 3 if len(damaged) > len(raw) else 2
    with caplog.at_level(logging.WARNING, logger="cluster.archive"):
        log = RecordingLog.open(tmp_path)
    with log:
        assert [e.leadership_term_id for e in log.entries] == list(range(keep))
        log.append_term(5, 900, timestamp=0)
    assert path.stat().st_size == (keep + 1) * ENTRY_LENGTH
    [message] = [r.getMessage() for r in caplog.records if r.name == "cluster.archive"]
    assert FILE_NAME in message
    assert f"offset {keep * ENTRY_LENGTH}" in message


def test_bad_entry_before_the_end_is_corruption(tmp_path: Path) -> None:
    with RecordingLog.open(tmp_path) as log:
        for term in range(3):
            log.append_term(term, term * 10, timestamp=0)
    path = tmp_path / FILE_NAME
    raw = bytearray(path.read_bytes())
    raw[64 + 9] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(ArchiveCorruptionError) as info:
        RecordingLog.open(tmp_path)
    assert info.value.path == str(path)
    assert info.value.position == 64
    assert FILE_NAME in str(info.value)
    assert "position 64" in str(info.value)
    assert path.stat().st_size == 3 * ENTRY_LENGTH


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("term"), st.integers(0, 20), st.integers(0, 10)),
            st.tuples(st.just("snap"), st.integers(0, 20), st.integers(-1, 2)),
            st.tuples(st.just("invalidate"), st.just(0), st.just(0)),
        ),
        max_size=25,
    )
)
def test_reopen_reads_back_identical_entries(ops: list[tuple[str, int, int]]) -> None:
    with tempfile.TemporaryDirectory() as name:
        with RecordingLog.open(name) as log:
            for op, a, b in ops:
                if op == "term":
                    last = log.find_last_term()
                    base = 0 if last is None else last.term_base_log_position + b
                    if log.get_term_entry(a) is None and (
                        last is None or a > last.leadership_term_id
                    ):
                        log.append_term(a, base, timestamp=a)
                elif op == "snap":
                    log.append_snapshot(0, 0, a * 10, timestamp=a, service_id=b)
                else:
                    log.invalidate_latest_snapshot()
            before = log.entries
        with RecordingLog.open(name) as log:
            assert log.entries == before
        assert Path(name, FILE_NAME).stat().st_size == ENTRY_LENGTH * len(before)


def test_remove_terms_from_truncation_point(tmp_path: Path) -> None:
    log = RecordingLog.open(tmp_path)
    log.append_term(0, 0, 1)
    log.append_term(1, 100, 2)
    log.append_term(2, 250, 3)
    assert log.remove_terms_from(100) == [1, 2]
    last = log.find_last_term()
    assert last is not None
    assert last.leadership_term_id == 0
    assert last.log_position == -1
    log.append_term(2, 120, 4)  # a new leader's term may reuse the id after removal
    log.close()
    reopened = RecordingLog.open(tmp_path)
    assert [
        (e.leadership_term_id, e.term_base_log_position) for e in reopened.entries if e.is_valid
    ] == [(0, 0), (2, 120)]
