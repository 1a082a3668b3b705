"""The data directory opened and closed (``cluster/datadir.py``)."""

from __future__ import annotations

import os
from pathlib import Path

from cluster.config import NodeConfig
from cluster.datadir import DataDir


def _open_under(directory: Path) -> list[str]:
    """What this process holds open under ``directory``."""
    held = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith(f"{directory}{os.sep}"):
            held.append(target)
    return held


def test_close_releases_every_descriptor_of_the_directory(tmp_path: Path) -> None:
    """A member stopped and started again in one process (the simulator, tests) must
    not keep the last one's files open: the recording log's descriptor included."""
    directory = tmp_path / "node-0"
    config = NodeConfig(member_id=0, members="0=localhost:9010:9020:9030", dir=str(directory))
    for _ in range(3):
        datadir = DataDir(config)
        assert _open_under(directory)
        datadir.close()
        assert _open_under(directory) == []
