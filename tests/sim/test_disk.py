"""The simulator's disk model (``tests/sim/disk.py``): what a power cut keeps and loses."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from cluster.archive.errors import ArchiveWriteError
from cluster.archive.record import encode_record
from cluster.archive.segments import Archive
from cluster.fileio import fsync_directory, make_directory, replace_file, write_all

from .disk import PAGE, DiskModel, DiskModelError


@pytest.fixture
def disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    model = DiskModel()
    model.add_root(tmp_path / "root")
    with model.installed():
        yield model, tmp_path / "root"


def _write(path: Path, data: bytes, *, sync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        write_all(fd, data, os.fstat(fd).st_size)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def test_synced_bytes_and_entries_survive_and_unsynced_ones_are_lost(disk) -> None:  # type: ignore[no-untyped-def]
    model, root = disk
    make_directory(root)  # the root itself durable
    _write(root / "a", b"kept", sync=True)
    fsync_directory(root)
    _write(root / "a", b" lost", sync=False)
    _write(root / "b", b"never synced entry", sync=True)
    report = model.power_cut(root, None)
    assert sorted(os.listdir(root)) == ["a"]
    assert (root / "a").read_bytes() == b"kept"
    assert report.files_reverted == 1
    assert report.entries_forgotten == 1


def test_a_file_whose_entry_is_durable_but_never_synced_is_empty(disk) -> None:  # type: ignore[no-untyped-def]
    model, root = disk
    make_directory(root)  # the root itself durable
    _write(root / "a", b"data", sync=False)
    fsync_directory(root)
    model.power_cut(root, None)
    assert (root / "a").read_bytes() == b""


def test_a_replace_not_followed_by_a_directory_sync_reverts(disk) -> None:  # type: ignore[no-untyped-def]
    model, root = disk
    make_directory(root)  # the root itself durable
    replace_file(root / "state", b"old")  # fsyncs the file and the directory
    tmp = root / "state.tmp"
    _write(tmp, b"new", sync=True)
    os.replace(tmp, root / "state")
    assert (root / "state").read_bytes() == b"new"
    model.power_cut(root, None)
    assert sorted(os.listdir(root)) == ["state"]
    assert (root / "state").read_bytes() == b"old"
    replace_file(root / "state", b"new")
    model.power_cut(root, None)
    assert (root / "state").read_bytes() == b"new"


def test_an_unlink_or_rmtree_not_synced_comes_back(disk) -> None:  # type: ignore[no-untyped-def]
    model, root = disk
    make_directory(root / "d")
    _write(root / "d" / "x", b"x", sync=True)
    fsync_directory(root / "d")
    fsync_directory(root)
    shutil.rmtree(root / "d")  # through os with dir_fd: the model sees it
    assert not (root / "d").exists()
    model.power_cut(root, None)
    assert (root / "d" / "x").read_bytes() == b"x"
    (root / "d" / "x").unlink()
    fsync_directory(root / "d")
    model.power_cut(root, None)
    assert os.listdir(root / "d") == []


def test_hard_links_stay_one_file(disk) -> None:  # type: ignore[no-untyped-def]
    model, root = disk
    make_directory(root)  # the root itself durable
    _write(root / "a", b"same", sync=True)
    os.link(root / "a", root / "b")
    fsync_directory(root)
    model.power_cut(root, None)
    assert os.stat(root / "a").st_ino == os.stat(root / "b").st_ino


def test_the_first_unsynced_page_may_tear_and_nothing_synced_changes(disk) -> None:  # type: ignore[no-untyped-def]
    model, root = disk
    make_directory(root)  # the root itself durable
    synced = bytes(range(256)) * 20  # 5120 bytes: into the second page
    _write(root / "seg", synced, sync=True)
    fsync_directory(root)
    outcomes = set()
    for seed in range(40):
        _write(root / "seg", b"\xff" * 6000, sync=False)
        model.power_cut(root, random.Random(seed))
        data = (root / "seg").read_bytes()
        assert data[: len(synced)] == synced
        assert len(data) <= 2 * PAGE  # only the first unsynced page may keep new bytes
        assert set(data[len(synced) :]) <= {0, 0xFF}
        outcomes.add(len(data) > len(synced))
        if len(data) > len(synced):
            os.truncate(root / "seg", len(synced))
            fd = os.open(root / "seg", os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
    assert outcomes == {True, False}


def test_writes_around_the_model_are_caught(disk) -> None:  # type: ignore[no-untyped-def]
    model, root = disk
    make_directory(root)  # the root itself durable
    with pytest.raises(DiskModelError, match="built-in open"):
        open(root / "x", "wb")  # noqa: SIM115
    with model._suspended():
        (root / "y").write_bytes(b"behind its back")
    with pytest.raises(DiskModelError, match="around the model"):
        model.power_cut(root, None)


def test_a_root_made_but_never_named_durably_vanishes_whole(disk) -> None:  # type: ignore[no-untyped-def]
    model, root = disk
    root.mkdir()
    replace_file(root / "state", b"synced, in a directory never synced in its parent")
    model.power_cut(root, None)
    assert not root.exists()
    make_directory(root)  # mkdir, then its parent fsynced
    replace_file(root / "state", b"kept")
    model.power_cut(root, None)
    assert (root / "state").read_bytes() == b"kept"


def test_writes_the_model_does_not_know_are_refused_on_its_files(disk) -> None:  # type: ignore[no-untyped-def]
    _, root = disk
    make_directory(root)
    fd = os.open(root / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with pytest.raises(DiskModelError, match="not modelled"):
            os.writev(fd, [b"a", b"b"])
    finally:
        os.close(fd)


class _Draws:
    """An RNG whose ``random()`` gives the draws it was made with, in order."""

    def __init__(self, *draws: float) -> None:
        self.draws = list(draws)

    def random(self) -> float:
        return self.draws.pop(0)


def test_an_unsynced_last_record_torn_across_a_sector_is_a_torn_tail(disk) -> None:  # type: ignore[no-untyped-def]
    """The sequence the simulator found (test_sim_power.py, seed 37): the log synced to
    file offset 2047; a 54-byte record appended there (``pwrite``); the power goes
    before its ``fdatasync``.  The disk kept the sector from 2048 (the record but its
    first byte) and not the one before it (byte 2047, the length field's low byte, reads
    0).  Nothing of that record was synced, so nothing of it was acknowledged."""
    model, root = disk
    make_directory(root)
    archive = Archive.open(root / "archive")
    archive.append(encode_record(b"x" * (2047 - 8)))
    assert archive.position == 2047
    model.arm(root, 2)  # the pwrite happens, the power goes at the fdatasync
    with pytest.raises(ArchiveWriteError):
        archive.append(encode_record(b"y" * 46))
    archive.close()
    # the first unsynced page torn: sectors 0-1535 are the same old or new; 1536-2047
    # old (2047 is past the old end: 0), 2048-2100 new
    model.power_cut(root, _Draws(0.9, 0.9, 0.9, 0.9, 0.9, 0.1))
    data = (root / "archive" / "log-00000000000000000000.seg").read_bytes()
    assert len(data) == 2047 + 54
    assert data[2047] == 0
    reopened = Archive.open(root / "archive")
    assert reopened.position == 2047


def test_an_unsynced_write_to_a_new_segment_with_a_lost_first_sector_is_a_torn_tail(disk) -> None:  # type: ignore[no-untyped-def]
    model, root = disk
    make_directory(root)
    archive = Archive.open(root / "archive")
    model.arm(root, 5)  # segment created, its directory synced, written; power goes at the sync
    with pytest.raises(ArchiveWriteError):
        archive.append(encode_record(b"a" * 600) + encode_record(b"b" * 100))
    archive.close()
    model.power_cut(root, _Draws(0.9, 0.9, 0.1))  # sector 0 lost, sector 512 kept
    data = (root / "archive" / "log-00000000000000000000.seg").read_bytes()
    assert data[:512] == bytes(512)
    assert len(data) == 716
    reopened = Archive.open(root / "archive")
    assert reopened.position == 0


def test_a_slow_disk_tells_each_sync_and_a_rot_survives_a_power_cut(disk) -> None:  # type: ignore[no-untyped-def]
    """Issue 44, item 4: a slow root's syncs are told with their drawn time (and still
    tracked); a rot changes durable bytes on disk and in the model alike (a power cut
    keeps it, and verify() sees nothing written around the model), never bytes that are
    not durable."""
    model, root = disk
    told: list[tuple[str, float]] = []
    model.on_slow_sync = lambda path, delay: told.append((path, delay))
    make_directory(root)
    model.set_slow(root, lambda: 0.25)
    _write(root / "a", b"0123456789", sync=True)
    assert told == [(str(root), 0.25)]
    model.set_slow(root, None)
    _write(root / "a", b"tail", sync=False)
    fsync_directory(root)
    assert len(told) == 1
    assert model.durable_extent(root / "a") == 10
    with pytest.raises(DiskModelError, match="not durable"):
        model.rot(root / "a", 9, b"xy")
    assert model.rot(root / "a", 2, b"!") == b"2"
    model.verify(root)
    model.power_cut(root, None)
    assert (root / "a").read_bytes() == b"01!3456789"
