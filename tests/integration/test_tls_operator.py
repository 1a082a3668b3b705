"""A member with TLS, used as an operator uses one (issue 41): one real ``python -m
cluster.node`` process with ``--certs-dir`` and a metrics port, certificates from
``cluster-tool certs``.

- ``cluster-tool errors`` lists what the member logged at WARNING after it started (it
  said "0 distinct errors" with certificates: the admin server kept a second, unattached
  log whenever nothing had been logged before it was built);
"""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster import tool
from cluster.certs import make_certs
from cluster.config import MemberEndpoints, parse_members
from cluster.local import LocalCluster, free_ports

HOST = "127.0.0.1"
KV = "cluster.examples.kv:KeyValueService"


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
    args = ["--metrics-port", str(metrics_port)]
    with LocalCluster(1, KV, directory, certs=pki, extra_args=args) as running:
        running.wait_ready(60)
        yield running


@pytest.fixture(autouse=True)
def plaintext_tool() -> Iterator[None]:
    """``cluster-tool``'s certificates are the process's: none before and after each test."""
    tool.use_certs(None)
    yield
    tool.use_certs(None)


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
