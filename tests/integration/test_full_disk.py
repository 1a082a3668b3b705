"""A full disk, for real: a node's data directory on a small tmpfs (needs root to mount;
skipped otherwise).  Issue #19: a snapshot on a full disk killed the node, and on
restart it failed again and left its temporary file eating the space freed; a full disk
must be an event the node handles, shows, and recovers from by itself."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

import client
from cluster import tool
from cluster.config import MemberEndpoints, NodeConfig, parse_members
from cluster.examples.kv import KeyValueClient, KeyValueService
from cluster.local import LocalCluster, free_ports
from cluster.node import Node
from cluster.protocol.admin import MemberStatus
from cluster.protocol.enums import AdminResponseCode


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


def fill_up(disk: Path) -> Path:
    """Fill ``disk`` to the last block while nodes write to it; returns the filler."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for size in (1 << 20, 64 << 10, 4 << 10, 512, 1):
            chunk = b"\0" * size
            while True:
                try:
                    os.write(fd, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
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
                    # asked by a client: answered when the write fails, not when appended
                    response = await c.request_snapshot(timeout=10)
                    assert response.response_code is AdminResponseCode.ERROR, response
                    assert response.message.startswith("disk full: snapshot at log position")
                    assert node.snapshots.failed == 1
                    assert list((disk / "node" / "snapshots").glob("*.tmp")) == []
                    # until a write succeeds again, the next one is refused at once
                    reply = await tool.request(member, "snapshot", {"timeout": "10"}, 15)
                    assert not reply.ok
                    assert reply.message.startswith("Unable to SNAPSHOT: disk full: snapshot")
                    assert node.snapshots.failed == 1
                    # the node goes on: it reads and writes, and says what happened
                    await kv.put("after", b"the failed snapshot")  # this write clears it
                    assert await kv.get("k7") == bytes([7]) * 10_000
                    reply = await tool.request(member, "snapshot", {"timeout": "10"}, 15)
                    assert not reply.ok  # written, and failed: the same way on the admin port
                    assert reply.message.startswith("disk full: snapshot at log position")
                    assert node.snapshots.failed == 2
                    assert list((disk / "node" / "snapshots").glob("*.tmp")) == []
                    await kv.put("after 2", b"the second failed snapshot")
                    errors = await tool.request(member, "errors", {}, 5)
                    assert b"disk full" in errors.body
                    # space returns: the next snapshot is taken
                    filler.unlink()
                    reply = await tool.request(member, "snapshot", {"timeout": "10"}, 15)
                    assert reply.ok, reply.message
                    response = await c.request_snapshot(timeout=10)  # OK once written
                    assert response.response_code is AdminResponseCode.OK, response
                    assert node.snapshots.taken == 2
                await node.shutdown()
        assert node.snapshots.failed == 2
        assert node.snapshots.taken == 2


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


# ---------------------------------------------------------------------- real processes


async def describe(members: list[MemberEndpoints]) -> dict[int, MemberStatus]:
    return {
        r.member.member_id: r.status
        for r in await tool.describe_all(members, 2.0)
        if r.status is not None
    }


async def leader_of(members: list[MemberEndpoints]) -> MemberStatus:
    with trio.fail_after(20):
        while True:
            leaders = [s for s in (await describe(members)).values() if s.role == "LEADER"]
            if leaders:
                return leaders[0]
            await trio.sleep(0.2)


async def until(condition: Callable[[], Awaitable[bool] | bool], limit: float) -> None:
    """Wait until ``condition()`` (sync or async) holds; fail after ``limit`` seconds."""
    with trio.fail_after(limit):
        while True:
            result = condition()
            if not isinstance(result, bool):
                result = await result
            if result:
                return
            await trio.sleep(0.02)


def temporary_files(disk: Path) -> list[Path]:
    return list(disk.glob("node-*/snapshots/*.tmp"))


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1])


async def cluster_tool(members: str, *args: str) -> str:
    done = await trio.run_process(
        [sys.executable, "-m", "cluster.tool", "--members", members, *args],
        capture_stdout=True,
        check=False,
    )
    return done.stdout.decode()


@pytest.mark.slow
def test_a_cluster_whose_disk_fills_under_load_stops_acknowledging_shows_it_and_resumes(
    tmp_path: Path,
) -> None:
    """Three node processes on one 48 MiB tmpfs, written to by 16 clients; the disk is
    filled to the last block, then a snapshot is asked for, then the space is freed."""
    logs = tmp_path / "logs"
    figures: dict[str, float] = {}
    with (
        small_disk(tmp_path / "disk", "48m") as disk,
        LocalCluster(3, "cluster.examples.kv:KeyValueService", disk, log_dir=logs) as cluster,
    ):
        trio.run(full_disk_under_load, cluster, disk, figures)
        for member_id in range(3):
            text = (logs / f"node-{member_id}.log").read_text()
            # one ERROR when the disk filled, not one per retry; one line when it emptied
            assert (
                len(re.findall(r"ERROR .*writes are retried; nothing is acknowledged", text)) == 1
            )
            assert re.search(r"disk has space again: writes resumed after [0-9.]+ s", text), text
    print(f"\nfull disk figures: {figures}")


async def full_disk_under_load(
    cluster: LocalCluster, disk: Path, figures: dict[str, float]
) -> None:
    members = parse_members(cluster.members)
    leader = await leader_of(members)
    acked: dict[str, bytes] = {}
    async with client.connect(cluster.ingress_endpoints) as c, KeyValueClient(c) as kv:

        async def writer(w: int) -> None:
            for i in range(1_000_000):
                key, value = f"w{w}-{i}", f"{w}:{i}:".encode() * 20
                await kv.put(key, value)
                acked[key] = value

        async with trio.open_nursery() as nursery:
            for w in range(16):
                nursery.start_soon(writer, w)
            await until(lambda: len(acked) >= 2_000, 20)
            filler = fill_up(disk)
            full_at = trio.current_time()

            async def all_full() -> bool:  # every member's writes fail; each one says so
                return all(s.disk.full for s in (await describe(members)).values())

            await until(all_full, 15)
            figures["seen_full_s"] = round(trio.current_time() - full_at, 2)
            rss_full = rss_kib(leader.pid)
            await trio.sleep(1.0)  # what was durable on a quorum before is committed
            stalled = len(acked)
            await trio.sleep(3.0)
            assert len(acked) == stalled, "nothing is acknowledged while the disk is full"
            figures["acked_before_full"] = stalled
            status = (await describe(members))[leader.member_id]
            assert status.disk.problem.startswith("disk full: ")
            assert "log" in status.disk.failing
            assert status.disk.free_bytes < 1 << 20
            # a snapshot asked for now fails at once, with the reason
            response = await c.request_snapshot(timeout=5)
            assert response.response_code is AdminResponseCode.ERROR, response
            assert "disk full: " in response.message, response.message
            reply = await tool.request(members[leader.member_id], "snapshot", {}, 5)
            assert not reply.ok
            assert "disk full: " in reply.message
            assert temporary_files(disk) == []
            # the operator's view: errors and describe say it, now
            errors = await cluster_tool(cluster.members, "errors")
            assert errors.count("NOW: DISK FULL for") == 3, errors
            assert "writes are retried; nothing is acknowledged meanwhile" in errors
            described = await cluster_tool(cluster.members, "describe")
            assert described.count("up, DISK FULL for") == 3, described
            await trio.sleep(2.0)
            figures["leader_rss_full_kib"] = rss_full
            figures["leader_rss_growth_kib_over_7s_full"] = rss_kib(leader.pid) - rss_full
            # space returns: writes resume by themselves
            filler.unlink()
            freed_at = trio.current_time()
            await until(lambda: len(acked) > stalled, 15)
            figures["first_ack_after_freeing_s"] = round(trio.current_time() - freed_at, 3)

            async def all_clear() -> bool:
                return not any(s.disk.problem for s in (await describe(members)).values())

            await until(all_clear, 15)
            figures["all_clear_after_freeing_s"] = round(trio.current_time() - freed_at, 3)
            resumed = len(acked)
            await until(lambda: len(acked) >= resumed + 1_000, 10)
            nursery.cancel_scope.cancel()
        figures["acked_total"] = len(acked)
        errors = await cluster_tool(cluster.members, "errors")
        assert "NOW:" not in errors, errors
        assert "DISK FULL" not in await cluster_tool(cluster.members, "describe")
        # a snapshot asked for now is answered once it is written
        response = await c.request_snapshot(timeout=10)
        assert response.response_code is AdminResponseCode.OK, response
        assert response.message.startswith("SNAPSHOT taken at log position")
        # every acknowledged write is there
        limiter = trio.CapacityLimiter(64)
        missing: list[str] = []

        async def check(key: str, value: bytes) -> None:
            async with limiter:
                if await kv.get(key) != value:
                    missing.append(key)

        async with trio.open_nursery() as nursery:
            for key, value in acked.items():
                nursery.start_soon(check, key, value)
        assert missing == []


# ---------------------------------------------------------------------- the recording log


@contextmanager
def writes_fail(path: Path) -> Iterator[None]:
    """Every write to the descriptor this process holds on ``path`` fails with ENOSPC
    (``/dev/full`` put under it with ``dup2``) until the block ends: no root needed."""
    fd = next(
        int(name)
        for name in os.listdir("/proc/self/fd")
        if os.path.realpath(f"/proc/self/fd/{name}") == str(path)
    )
    saved = os.dup(fd)
    full = os.open("/dev/full", os.O_RDWR)
    try:
        os.dup2(full, fd)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)
        os.close(full)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
async def test_a_term_start_that_cannot_be_recorded_holds_the_log_until_it_is(
    tmp_path: Path,
) -> None:
    """A member whose recording log cannot take the new term's start writes none of
    that term's log (nor acknowledges it) until it can; then it goes on by itself, and
    its recording log names the term where its log has it."""
    from test_state import cluster, wait_for

    with trio.fail_after(60):
        async with cluster(tmp_path) as c:
            await c.start_all()
            old = await c.wait_for_leader()
            async with client.connect(c.endpoints) as cc, KeyValueClient(cc) as kv:
                for i in range(20):
                    await kv.put(f"k{i}", b"before")
            member = next(i for i, n in c.nodes.items() if n is not old)
            node = c.nodes[member]
            with writes_fail(node.recording_log.path.resolve()):
                c.crash(old.config.member_id)  # a new term, which cannot be recorded here
                await wait_for(lambda: bool(node.storage.pending), 15)
                term = node.cm.leadership_term_id
                await trio.sleep(1.5)  # retried meanwhile, and still failing
                base = node.cm.log.terms.base_of(term)
                assert base is not None
                assert node.archive_agent.written <= base  # none of the term's bytes
                assert node.cm.log.archive_position <= base
                assert node.storage.disk.full
                assert "recording log" in node.storage.disk.failing
            # space again: the term is recorded first, then the log goes on
            async with client.connect(c.endpoints) as cc, KeyValueClient(cc) as kv:
                await kv.put("after", b"recorded")
                assert await kv.get("k3") == b"before"
            await wait_for(lambda: not node.storage.pending and not node.storage.disk.problem)
            entry = node.recording_log.get_term_entry(term)
            assert entry is not None
            assert entry.term_base_log_position == base
            assert node.archive_agent.written > base
