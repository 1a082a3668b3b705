"""A backup in progress (``cluster/backup/store.py``, what ``cluster-backup`` writes)
under power cuts of the disk model (``tests/sim/disk.py``): after a commit, a cut
leaves the backup committed, whole (``cluster-tool verify``); a cut before the next
commit leaves the one before it, and the store goes on from there."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from cluster.backup.store import BackupStore
from cluster.fileio import make_directory, write_all
from cluster.tool.offline import verify
from tests.unit.test_backup_check import RECORDS, SNAPSHOT_AFTER, T0, ends, record, snapshot_file

from .disk import DiskModel


def _snapshot(store: BackupStore, position: int) -> None:
    temp = store.snapshot_temp()
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)  # the model sees it
    try:
        write_all(fd, snapshot_file(position))
    finally:
        os.close(fd)
    store.add_snapshot([
        {"leadership_term_id": 0, "term_base_log_position": 0, "log_position": position,
         "timestamp": T0 + 1000 * SNAPSHOT_AFTER, "service_id": service}
        for service in (0, -1)
    ], temp)  # fmt: skip


@pytest.mark.parametrize("seed", range(4))
def test_a_power_cut_leaves_the_last_committed_backup(tmp_path: Path, seed: int) -> None:
    disk, root = DiskModel(), tmp_path / "disk"
    disk.add_root(root)
    out = root / "backup"
    rng = random.Random(seed)
    with disk.installed():
        make_directory(root)
        store = BackupStore.open(out, segment_size=512)
        store.start_at(0)
        store.append(b"".join(record(i) for i in range(SNAPSHOT_AFTER + 1)))
        _snapshot(store, ends()[SNAPSHOT_AFTER])
        store.set_terms([{"leadership_term_id": 0, "term_base_log_position": 0, "timestamp": T0}])
        store.commit(cluster_id=7, member_id=0)
        store.append(b"".join(record(i) for i in range(SNAPSHOT_AFTER + 1, RECORDS)))
        store.close()
        disk.power_cut(root, rng)  # before the second commit
        checked = verify(out)
        assert checked["ok"], checked["problems"]
        assert checked["backup"]["covers"] == ends()[SNAPSHOT_AFTER]
        store = BackupStore.open(out, segment_size=512)  # goes on from what it holds
        store.append(b"".join(record(i) for i in range(SNAPSHOT_AFTER + 1, RECORDS)))
        store.commit(cluster_id=7, member_id=0)
        store.close()
        disk.power_cut(root, rng)
        checked = verify(out)
        assert checked["ok"], checked["problems"]
        assert checked["backup"]["covers"] == ends()[-1]
