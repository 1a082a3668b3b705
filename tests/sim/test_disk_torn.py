"""Every power cut the disk model can make of a member's log appends (issue 44, items 3
and 7): the archive opens again by itself, keeps everything an append returned for, and
holds a prefix of what was written.  Before ``synced-position`` and the lost-sector rule
(:mod:`cluster.archive.synced`), an unsynced write whose first sector was lost and a later
one kept was refused as rot."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from cluster.archive import synced as synced_module
from cluster.archive.errors import ArchiveWriteError
from cluster.archive.record import encode_record
from cluster.archive.segments import Archive
from cluster.fileio import make_directory

from .disk import DiskModel

SEEDS = 300


def _batch(rng: random.Random) -> bytes:
    return b"".join(
        encode_record(rng.randbytes(rng.choice([1, 20, 54, 300, 700])))
        for _ in range(rng.randrange(1, 6))
    )


@pytest.mark.slow  # 3-11 s (2 busy cores); the old rule refused 8 of these 300 seeds
def test_any_power_cut_of_appends_restarts_with_what_was_acknowledged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(synced_module, "MARK_EVERY", 1500)  # marks within a few appends
    torn = 0
    for seed in range(SEEDS):
        rng = random.Random(seed)
        model = DiskModel()
        root = tmp_path / str(seed)
        model.add_root(root)
        segment_size = rng.choice([1024, 4096, 1 << 20])
        written = b""
        acknowledged = 0
        with model.installed():
            make_directory(root)
            archive = Archive.open(root / "archive", segment_size=segment_size)
            for _ in range(rng.randrange(8)):
                batch = _batch(rng)
                acknowledged = archive.append(batch)
                written += batch
            model.arm(root, rng.randrange(1, 8))  # the power goes at a later change
            try:
                for _ in range(3):
                    batch = _batch(rng)
                    written += batch
                    acknowledged = archive.append(batch)
            except ArchiveWriteError:
                pass
            archive.close()
            report = model.power_cut(root, rng)
            torn += report.torn
            with Archive.open(root / "archive", segment_size=segment_size) as reopened:
                end = reopened.position
                assert end >= acknowledged, f"seed {seed}: {end} < {acknowledged}"
                assert reopened.read(reopened.start_position) == written[:end], f"seed {seed}"
    assert torn > SEEDS // 15  # the cuts did tear
