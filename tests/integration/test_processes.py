"""Real ``python -m cluster.node`` processes: restart, SIGKILL, damaged files, CLI.

Slow-marked: skip locally with ``-m "not slow"``; CI runs them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

import client
from cluster.archive import encode_record
from cluster.examples.kv import KeyValueClient
from cluster.local import LocalCluster

pytestmark = pytest.mark.slow

KV = "cluster.examples.kv:KeyValueService"


async def put_keys(endpoints: str, start: int, stop: int) -> None:
    async with client.connect(endpoints) as c, KeyValueClient(c) as kv:
        limiter = trio.CapacityLimiter(200)

        async def put(i: int) -> None:
            async with limiter:
                await kv.put(f"key-{i}", f"value-{i}".encode())

        async with trio.open_nursery() as n:
            for i in range(start, stop):
                n.start_soon(put, i)


async def missing_keys(endpoints: str, count: int) -> list[int]:
    missing: list[int] = []
    async with client.connect(endpoints) as c, KeyValueClient(c) as kv:
        limiter = trio.CapacityLimiter(200)

        async def get(i: int) -> None:
            async with limiter:
                if await kv.get(f"key-{i}") != f"value-{i}".encode():
                    missing.append(i)

        async with trio.open_nursery() as n:
            for i in range(count):
                n.start_soon(get, i)
    return missing


def segments(cluster: LocalCluster) -> list[Path]:
    return sorted((cluster.directory / "node-0" / "archive").glob("*.seg"))


def node_log(cluster: LocalCluster) -> str:
    return (cluster.log_dir / "node-0.log").read_text()


def test_graceful_restart_keeps_every_write(tmp_path: Path) -> None:
    with LocalCluster(1, KV, tmp_path) as cluster:
        trio.run(put_keys, cluster.ingress_endpoints, 0, 3000)
        assert cluster.stop(0) == 0  # SIGTERM: graceful, exit code 0
        assert "shutting down" in node_log(cluster)
        cluster.start(0)
        cluster.wait_ready()
        assert trio.run(missing_keys, cluster.ingress_endpoints, 3000) == []


def test_sigkill_loses_no_acknowledged_write(tmp_path: Path) -> None:
    with LocalCluster(1, KV, tmp_path) as cluster:
        trio.run(put_keys, cluster.ingress_endpoints, 0, 2000)
        cluster.kill(0)  # SIGKILL right after the last acknowledgement
        cluster.start(0)
        cluster.wait_ready()
        assert trio.run(missing_keys, cluster.ingress_endpoints, 2000) == []


def test_torn_tail_is_truncated_with_a_warning(tmp_path: Path) -> None:
    with LocalCluster(1, KV, tmp_path) as cluster:
        trio.run(put_keys, cluster.ingress_endpoints, 0, 500)
        cluster.kill(0)
        last = segments(cluster)[-1]
        with last.open("ab") as f:  # a record header promising more than was written
            f.write(b"\x40\x00\x00\x00\x12\x34\x56\x78partial")
        size_before = last.stat().st_size
        cluster.start(0)
        cluster.wait_ready()
        assert trio.run(missing_keys, cluster.ingress_endpoints, 500) == []
        text = node_log(cluster)
        assert "WARNING" in text
        assert last.name in text
        assert last.stat().st_size >= size_before - 15  # only the torn bytes went


def test_an_unsynced_write_whose_first_sector_was_lost_is_truncated(tmp_path: Path) -> None:
    """What a power cut can leave of an append in flight (issue 44): the sector holding
    its start lost (zeros to the sector's end), a later one kept (valid records after
    the hole).  Nothing of it was acknowledged: the member truncates it and starts."""
    with LocalCluster(1, KV, tmp_path) as cluster:
        trio.run(put_keys, cluster.ingress_endpoints, 0, 500)
        cluster.kill(0)
        last = segments(cluster)[-1]
        size = last.stat().st_size
        kept = b"".join(encode_record(bytes([i]) * 90) for i in range(1, 9))
        with last.open("ab") as f:
            f.write(bytes(512 - size % 512) + kept)
        cluster.start(0)
        cluster.wait_ready()
        assert trio.run(missing_keys, cluster.ingress_endpoints, 500) == []
        text = node_log(cluster)
        assert f"truncated torn tail at log position {size}" in text
        assert last.name in text


def test_corruption_before_the_tail_stops_the_node_naming_file_and_position(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(1, KV, tmp_path)
    cluster.start_all()
    try:
        trio.run(put_keys, cluster.ingress_endpoints, 0, 500)
        assert cluster.stop(0) == 0
        seg = segments(cluster)[0]
        data = bytearray(seg.read_bytes())
        data[len(data) // 2] ^= 0xFF
        seg.write_bytes(bytes(data))
        proc = cluster.start(0)
        assert proc.wait(20) == 1
        text = node_log(cluster)
        assert seg.name in text
        assert "position" in text
        assert "Traceback" not in text
    finally:
        cluster.stop_all()


def test_asyncio_client_against_a_real_node(tmp_path: Path) -> None:
    async def main(endpoints: str) -> bytes | None:
        async with client.connect(endpoints) as c, KeyValueClient(c) as kv:
            await kv.put("asyncio", b"works")
            return await kv.get("asyncio")

    with LocalCluster(1, KV, tmp_path) as cluster:
        assert asyncio.run(main(cluster.ingress_endpoints)) == b"works"


def run_node(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cluster.node", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
    )


def test_help_lists_settings_with_aeron_defaults() -> None:
    out = run_node("--help").stdout
    for text in (
        "--session-timeout",
        "default: 10s",
        "--slow-tick-interval",
        "default: 10ms",
        "--max-concurrent-sessions",
        "--max-frame-size",
        "--fsync",
        "CLUSTER_SESSION_TIMEOUT",
        "--config",
    ):
        assert text in out


def test_bad_settings_exit_with_a_clear_error(tmp_path: Path) -> None:
    result = run_node("--session-timeout", "soon", "--dir", str(tmp_path))
    assert result.returncode == 2
    assert "session-timeout" in result.stderr
    assert "Traceback" not in result.stderr
    result = run_node("--dir", str(tmp_path), env={"CLUSTER_FSYNC": "sometimes"})
    assert result.returncode == 2
    assert "fsync" in result.stderr
    result = run_node("--service", "no.such.module:Service", "--dir", str(tmp_path))
    assert result.returncode == 2
    assert "no.such.module" in result.stderr


def test_sigint_is_graceful(tmp_path: Path) -> None:
    with LocalCluster(1, KV, tmp_path) as cluster:
        trio.run(put_keys, cluster.ingress_endpoints, 0, 100)
        proc = cluster.processes[0]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 0
        assert "SIGINT" in node_log(cluster)
