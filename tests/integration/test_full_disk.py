"""A full disk, for real: a node's data directory on a small tmpfs (needs root to mount;
skipped otherwise).  Issue #19: a snapshot on a full disk killed the node, and on
restart it failed again and left its temporary file eating the space freed."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

import client
from cluster import tool
from cluster.config import NodeConfig
from cluster.examples.kv import KeyValueClient, KeyValueService
from cluster.local import free_ports
from cluster.node import Node


@contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path, leave: int) -> Path:
    """Fill ``disk`` but ``leave`` bytes; returns the filler file."""
    filler = disk / "filler"
    stat = os.statvfs(disk)
    free = stat.f_bavail * stat.f_frsize
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, free - leave))
    return filler


async def test_a_snapshot_on_a_full_disk_fails_cleanly_and_the_node_goes_on(
    tmp_path: Path,
) -> None:
    with small_disk(tmp_path / "disk", "8m") as disk:
        ports = free_ports(3)
        config = NodeConfig(
            members=f"0=127.0.0.1:{ports[0]}:{ports[1]}:{ports[2]}",
            dir=str(disk / "node"),
            fsync="none",
        )
        node = Node(config, KeyValueService())
        member = config.this_member
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                await nursery.start(
                    lambda task_status: node.run(handle_signals=False, task_status=task_status)
                )
                endpoints = f"0=127.0.0.1:{node.ingress_port}"
                async with client.connect(endpoints) as c, KeyValueClient(c) as kv:
                    for i in range(40):  # about 400 KB of state: a snapshot that big
                        await kv.put(f"k{i}", bytes([i]) * 10_000)
                    filler = fill(disk, leave=150_000)  # room for the log, not the snapshot
                    reply = await tool.request(member, "snapshot", {"timeout": "10"}, 15)
                    assert not reply.ok
                    assert "disk full" in reply.message, reply.message
                    assert list((disk / "node" / "snapshots").glob("*.tmp")) == []
                    # the node goes on: it reads and writes, and says what happened
                    await kv.put("after", b"the failed snapshot")
                    assert await kv.get("k7") == bytes([7]) * 10_000
                    errors = await tool.request(member, "errors", {}, 5)
                    assert b"disk full" in errors.body
                    # space returns: the next snapshot is taken
                    filler.unlink()
                    reply = await tool.request(member, "snapshot", {"timeout": "10"}, 15)
                    assert reply.ok, reply.message
                await node.shutdown()
        assert node.snapshots.failed == 1
        assert node.snapshots.taken == 1


async def test_start_up_removes_a_snapshot_cut_short(tmp_path: Path) -> None:
    ports = free_ports(3)
    config = NodeConfig(
        members=f"0=127.0.0.1:{ports[0]}:{ports[1]}:{ports[2]}", dir=str(tmp_path / "node")
    )
    stale = tmp_path / "node" / "snapshots" / "snapshot-00000000000000001234-0.tmp"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"x" * 100_000)
    node = Node(config, KeyValueService())
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: node.run(handle_signals=False, task_status=task_status)
            )
            assert not stale.exists()
            await node.shutdown()
