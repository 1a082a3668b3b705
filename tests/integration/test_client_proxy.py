"""A client behind TCP proxies stays behind them (issue 41): three real member processes,
a real TCP forwarder on loopback (``faultproxy.Forwarder``) in front of each member's
ingress port, and a client given only the forwarders' addresses.

The members advertise their own ingress addresses (a REDIRECT's detail, a
NewLeaderEvent's endpoints).  A client behind a proxy, a NAT, a port-forward or a load
balancer may not reach those at all; it moved there at its first NewLeaderEvent.  Here
every forwarder dials its member from 127.0.0.2, so a connection from 127.0.0.1 to a
member's ingress port in the kernel's table (``/proc/net/tcp``) is the client gone
around its proxy.  After a leader change the client must still write, through the new
leader's forwarder.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path

import trio
from faultproxy import Forwarder

import client
from cluster.config import parse_members
from cluster.examples.kv import KeyValueClient
from cluster.local import LocalCluster

HOST = "127.0.0.1"
PROXY_SOURCE = "127.0.0.2"
KV = "cluster.examples.kv:KeyValueService"
NODE_ARGS = ["--election-timeout", "500ms"]


def established_from_client(ports: set[int]) -> list[str]:
    """Established TCP connections from 127.0.0.1 (not a forwarder's 127.0.0.2) to one of
    ``ports``, from the kernel's table."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with suppress(FileNotFoundError), open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                local, remote, state = fields[1], fields[2], fields[3]
                local_ip = local.rsplit(":", 1)[0]
                remote_port = int(remote.rsplit(":", 1)[1], 16)
                from_client = local_ip in ("0100007F", "0000000000000000FFFF00000100007F")
                if state == "01" and remote_port in ports and from_client:
                    found.append(f"{table}: {line.strip()}")
    return found


@contextmanager
def three_members(directory: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(3, KV, directory, extra_args=NODE_ARGS)
    try:
        cluster.start_all(timeout=30)
        yield cluster
    finally:
        cluster.stop_all()


@asynccontextmanager
async def forwarders(cluster: LocalCluster) -> AsyncIterator[dict[int, Forwarder]]:
    proxies = {
        m.member_id: Forwarder(m.ingress_port, source=PROXY_SOURCE)
        for m in parse_members(cluster.members)
    }
    async with trio.open_nursery() as nursery:
        for proxy in proxies.values():
            await nursery.start(proxy.run)
        yield proxies
        nursery.cancel_scope.cancel()


def transfer_leadership(cluster: LocalCluster, to: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cluster.tool", "--members", cluster.members,
         "transfer-leadership", "--to", str(to)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


async def wait_until(predicate: Callable[[], bool], what: str, limit: float = 30) -> None:
    with trio.move_on_after(limit):
        while not predicate():  # noqa: ASYNC110 - the client's state: nothing to wait on
            await trio.sleep(0.05)
        return
    raise AssertionError(f"timed out after {limit}s waiting for {what}")


def test_a_client_behind_proxies_keeps_to_them_across_a_leader_change(tmp_path: Path) -> None:
    async def main(cluster: LocalCluster) -> None:
        member_ports = {m.ingress_port for m in parse_members(cluster.members)}
        with trio.fail_after(120):
            await proxied(cluster, member_ports)

    async def proxied(cluster: LocalCluster, member_ports: set[int]) -> None:
        async with forwarders(cluster) as proxies:
            given = ",".join(f"{i}={HOST}:{p.port}" for i, p in proxies.items())
            async with (
                client.connect(given, connect_timeout=30) as c,
                KeyValueClient(c) as kv,
            ):
                await kv.put("before", b"1")
                await trio.sleep(0.5)  # the leader's NewLeaderEvent, heartbeats
                assert c.ingress_endpoints == given
                assert established_from_client(member_ports) == []

                old = c.leader_member_id
                to = next(i for i in proxies if i != old)
                accepted = proxies[to].accepted
                done = await trio.to_thread.run_sync(transfer_leadership, cluster, to)
                assert done.returncode == 0, done.stdout + done.stderr
                await wait_until(lambda: c.leader_member_id == to, "the client to follow")
                sent = proxies[to].bytes_in
                for i in range(20):
                    await kv.put(f"after-{i}", b"2")
                assert await kv.get("before") == b"1"
                assert proxies[to].accepted > accepted  # it reached the new leader...
                assert proxies[to].bytes_in > sent  # ...and writes through its proxy
                assert c.ingress_endpoints == given
                assert established_from_client(member_ports) == []

    with three_members(tmp_path) as cluster:
        trio.run(main, cluster)
