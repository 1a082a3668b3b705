"""A member with TLS, used as an operator uses one (issue 41): one real ``python -m
cluster.node`` process with ``--certs-dir`` and a metrics port, certificates from
``cluster-tool certs``.

- ``cluster-tool errors`` lists what the member logged at WARNING after it started (it
  said "0 distinct errors" with certificates: the admin server kept a second, unattached
  log whenever nothing had been logged before it was built);
- a flood of idle connections from five loopback addresses (127.0.0.2-6), each holding
  its share of every port and dialling again whatever is closed, fills the ingress,
  admin and metrics ports; meanwhile a client with a certificate connects and writes,
  ``/health`` answers, and ``cluster-tool describe`` works (before, each was refused at
  accept, and describe said the member "does not speak TLS");
- an admin port full of proven connections (admin principals) resets a newcomer, and
  describe says so: it refuses new connections, never "does not speak TLS".
"""

from __future__ import annotations

import json
import random
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path

import pytest
import trio
from test_tls_mistakes import plaintext_tool  # noqa: F401  (autouse: no certificates left set)

import client
from cluster import tool
from cluster.certs import make_certs
from cluster.config import MemberEndpoints, parse_members
from cluster.examples.kv import KeyValueClient
from cluster.local import LocalCluster, free_ports
from cluster.protocol.admin import AdminCommand
from cluster.protocol.framing import FrameDecoder, encode_frame
from cluster.transport.tls import load_client_identity

HOST = "127.0.0.1"
KV = "cluster.examples.kv:KeyValueService"
MAX_CONNECTIONS = 64  # ingress: a share of 16 per address
MAX_ADMIN = 8  # a share of 4
METRICS_CAP = 32  # the metrics port's own cap (cluster.agents.exporter), a share of 8
FLOOD_ADDRESSES = [f"127.0.0.{i}" for i in range(2, 7)]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tls-operator-pki")
    make_certs(out, [(0, HOST)], ["admin", "app"])
    return out


@pytest.fixture(scope="module")
def metrics_port() -> int:
    return free_ports(1)[0]


@pytest.fixture(scope="module")
def member(
    tmp_path_factory: pytest.TempPathFactory, pki: Path, metrics_port: int
) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("tls-operator")
    args = [
        *("--metrics-port", str(metrics_port)),
        *("--max-connections", str(MAX_CONNECTIONS), "--max-admin-connections", str(MAX_ADMIN)),
        *("--handshake-timeout", "10s"),  # strangers hold their slots a while
    ]
    with LocalCluster(1, KV, directory, certs=pki, extra_args=args) as running:
        running.wait_ready(60)
        yield running


def endpoints(member: LocalCluster) -> MemberEndpoints:
    return parse_members(member.members)[0]


def tls_connect(pki: Path, folder: str, port: int) -> ssl.SSLSocket:
    """A finished TLS handshake with ``port``, with the certificate in ``folder``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(pki / "ca.crt")
    context.load_cert_chain(pki / folder / "tls.crt", pki / folder / "tls.key")
    context.check_hostname = False
    deadline = time.monotonic() + 30
    while True:
        try:
            sock = socket.create_connection((HOST, port), timeout=10)
            break
        except OSError:  # the admin port opens a moment after the ingress port
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    return context.wrap_socket(sock)


def run_tool(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = tool.main(list(argv))
    out, _ = capsys.readouterr()
    return code, out


def test_errors_lists_the_warnings_a_member_with_tls_logged(
    member: LocalCluster, pki: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a warning logged after start-up: a member's certificate on the admin port
    with tls_connect(pki, "member-0", endpoints(member).admin_port) as sock:
        sock.settimeout(10)
        assert sock.recv(1) == b""  # closed by the member, once it has logged why
    certs = ["--certs-dir", str(pki / "client-admin")]
    deadline = time.monotonic() + 30
    while True:
        code, out = run_tool(capsys, "--members", member.members, *certs, "errors", "--json")
        assert code == 0, out
        (found,) = json.loads(out)["members"]
        messages = [e["message"] for e in found["errors"]]
        if any("is not a client certificate" in m for m in messages):
            break
        assert time.monotonic() < deadline, found
        time.sleep(0.2)
    assert found["distinct"] >= 1
    code, out = run_tool(capsys, "--members", member.members, *certs, "errors")
    assert code == 0
    assert "0 distinct errors" not in out, out
    assert "closing admin connection: PeerCert(name='member-0', role='member')" in out, out


# ---------------------------------------------------------------------- a flood


class Flood:
    """Idle strangers' connections from :data:`FLOOD_ADDRESSES`, one more per address
    than its share of each port: each one the member closes (a handshake deadline, room
    made for a newcomer) or refuses is dialled again."""

    def __init__(self, ports: dict[str, tuple[int, int]]) -> None:
        self.ports = ports  # name: (port, share)
        self.open = dict.fromkeys(ports, 0)
        self.dials = 0

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for name, (port, share) in self.ports.items():
                for address in FLOOD_ADDRESSES:
                    for _ in range(share + 1):
                        nursery.start_soon(self._keep, name, port, address)

    async def _keep(self, name: str, port: int, address: str) -> None:
        while True:
            self.dials += 1
            sock = trio.socket.socket()
            try:
                await sock.bind((address, 0))
                await sock.connect((HOST, port))
            except OSError:  # reset at accept
                sock.close()
                await trio.sleep(0.2 + random.random() * 0.3)
                continue
            except BaseException:  # the flood stops (cancelled) in the middle of a dial
                sock.close()
                raise
            stream = trio.SocketStream(sock)
            self.open[name] += 1
            try:
                with suppress(trio.BrokenResourceError, OSError):
                    while await stream.receive_some(4096):
                        pass
            finally:
                self.open[name] -= 1
                with trio.CancelScope(shield=True):
                    await trio.aclose_forcefully(stream)
            await trio.sleep(0.1 + random.random() * 0.2)


async def wait_until(predicate: Callable[[], bool], what: str, limit: float = 60) -> None:
    with trio.move_on_after(limit):
        while not predicate():  # noqa: ASYNC110 - counters, nothing to wait on
            await trio.sleep(0.05)
        return
    raise AssertionError(f"timed out after {limit}s waiting for {what}")


async def health(port: int) -> tuple[int, dict[str, object]]:
    """``GET /health`` on the metrics port: the status and the JSON body."""
    stream = await trio.open_tcp_stream(HOST, port)
    async with stream:
        await stream.send_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        with trio.fail_after(10):
            while chunk := await stream.receive_some(65536):
                data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def describe(member: LocalCluster, pki: Path) -> subprocess.CompletedProcess[str]:
    """``cluster-tool describe`` as an operator runs it, with the admin's folder."""
    return subprocess.run(
        [sys.executable, "-m", "cluster.tool", "--members", member.members,
         "--certs-dir", str(pki / "client-admin"), "--timeout", "20s", "describe"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


async def admin_principal(pki: Path, port: int) -> trio.SSLStream[trio.SocketStream]:
    """An admin principal's connection to the admin port, its first command answered
    (so the member has proven it)."""
    context = load_client_identity(pki / "client-admin").client_context
    stream = trio.SSLStream(await trio.open_tcp_stream(HOST, port), context,
                            server_side=False, https_compatible=False)  # fmt: skip
    await stream.send_all(encode_frame(AdminCommand(1, "describe", {})))
    decoder = FrameDecoder(1 << 20)
    with trio.fail_after(20):
        while not decoder.feed(await stream.receive_some(65536)):
            pass
    return stream


async def test_a_flood_from_many_addresses_keeps_no_one_out(
    member: LocalCluster, pki: Path, metrics_port: int
) -> None:
    ports = endpoints(member)
    flood = Flood(
        {
            "ingress": (ports.ingress_port, MAX_CONNECTIONS // 4),
            "admin": (ports.admin_port, MAX_ADMIN // 2),
            "metrics": (metrics_port, METRICS_CAP // 4),
        }
    )
    with trio.fail_after(240):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(flood.run)
            await wait_until(
                lambda: (
                    flood.open["ingress"] >= MAX_CONNECTIONS
                    and flood.open["admin"] >= MAX_ADMIN
                    and flood.open["metrics"] >= METRICS_CAP
                ),
                "the flood to fill every port",
            )
            # a client with a certificate connects and writes
            async with (
                client.connect(
                    member.ingress_endpoints, certs_dir=pki / "client-app", connect_timeout=20
                ) as c,
                KeyValueClient(c) as kv,
            ):
                for i in range(20):
                    await kv.put(f"flood-{i}", b"x")
                assert await kv.get("flood-0") == b"x"
            # an orchestrator's health check answers
            for _ in range(5):
                status, body = await health(metrics_port)
                assert status == 200, body
                assert body["health"] is True, body
            # and the operator's tool sees the member as it is
            done = await trio.to_thread.run_sync(describe, member, pki)
            assert done.returncode == 0, done.stdout + done.stderr
            assert "LEADER" in done.stdout, done.stdout
            assert flood.open["ingress"] >= MAX_CONNECTIONS - 8  # the flood still on
            nursery.cancel_scope.cancel()
    log = (member.log_dir / "node-0.log").read_text()
    assert "closing its oldest for each newcomer from another address" in log


async def test_a_port_full_of_proven_connections_is_said_to_refuse_not_to_lack_tls(
    member: LocalCluster, pki: Path
) -> None:
    port = endpoints(member).admin_port
    with trio.fail_after(120):
        held = [await admin_principal(pki, port) for _ in range(MAX_ADMIN)]
        try:
            done = await trio.to_thread.run_sync(describe, member, pki)
            assert done.returncode == 1, done.stdout + done.stderr
            assert "does not speak TLS" not in done.stdout, done.stdout
            assert (
                "member 0 reset the connection before the TLS handshake: it refuses new "
                "connections (at its connection cap" in done.stdout
            ), done.stdout
        finally:
            for stream in held:
                await trio.aclose_forcefully(stream)
        while (await trio.to_thread.run_sync(describe, member, pki)).returncode != 0:  # noqa: ASYNC110
            await trio.sleep(0.2)  # the held connections' slots given back
