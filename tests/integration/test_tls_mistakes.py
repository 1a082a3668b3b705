"""TLS mistakes name TLS (issue 31): `cluster-tool` and the client library against real
member processes that require TLS, used as a new operator would get it wrong.

- without ``--certs-dir`` (``certs_dir=``): "member N requires TLS: pass --certs-dir (a
  client-NAME folder)" for every member, never "down (connection closed before a reply)";
  the client library raises :class:`client.TlsRequiredError` at once;
- with a member's folder: refused when the folder is loaded, naming a client folder;
- with another cluster's client folder: the handshake's own reason, per member;
- with an expired client certificate: refused when the folder is loaded;
- with certificates, against a member without TLS: "does not speak TLS".

Nothing here needs a leader: each mistake is seen on the first exchange with a member.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import anyio
import anyio.abc
import pytest
import trio

import client
import cluster.certs
from cluster import tool
from cluster.certs import make_certs
from cluster.config import parse_members
from cluster.local import LocalCluster, members_string
from cluster.transport.tcp import TcpNetwork
from cluster.transport.tls import TlsError, is_tls_problem, load_client_identity, tls_required

HOST = "127.0.0.1"
MEMBERS = 3


@dataclass
class Pki:
    ours: Path
    other: Path  # another cluster's `cluster-tool certs`: the same names, another CA
    expired: Path  # our CA, certificates that expired a week ago


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("tls-mistakes-pki")
    members = [(i, HOST) for i in range(MEMBERS)]
    make_certs(root / "ours", members)
    make_certs(root / "other", members)
    expired = root / "expired"
    expired.mkdir()
    for name in ("ca.crt", "ca.key"):
        shutil.copy(root / "ours" / name, expired / name)
    past = dt.datetime.now(dt.UTC) - dt.timedelta(days=8)
    with mock.patch.object(cluster.certs, "_now", return_value=past):
        make_certs(expired, members[:1], days=1)
    return Pki(root / "ours", root / "other", expired)


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("tls-mistakes")
    with LocalCluster(
        MEMBERS, "cluster.examples.kv:KeyValueService", directory, certs=pki.ours
    ) as running:
        running.wait_ready(60)
        yield running


@pytest.fixture(autouse=True)
def plaintext_tool() -> Iterator[None]:
    """``cluster-tool``'s certificates are the process's: none before and after each test."""
    tool.use_certs(None)
    yield
    tool.use_certs(None)


def run_tool(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = tool.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------- cluster-tool


def test_the_tool_without_certificates_says_each_member_requires_tls(
    tls_cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    members = ["--members", tls_cluster.members, "--timeout", "20s"]
    started = time.monotonic()
    code, out, _ = run_tool(capsys, *members, "describe")
    assert code == 1
    for i in range(MEMBERS):
        assert f"member {i} requires TLS: pass --certs-dir (a client-NAME folder)" in out, out
    assert "down" not in out, out
    assert "closed before a reply" not in out, out
    assert time.monotonic() - started < 15  # an answer, not the timeout

    code, out, _ = run_tool(capsys, *members, "health")
    assert code == 1
    assert "down" not in out, out
    assert all(tls_required([i]) in out for i in range(MEMBERS)), out

    code, out, _ = run_tool(capsys, *members, "health", "--json")
    assert code == 1
    document = json.loads(out)
    assert not document["healthy"]
    assert document["reason"] == tls_required([0])
    assert [m["error"] for m in document["members"]] == [tls_required([i]) for i in range(3)]
    assert document["problems"][:MEMBERS] == [tls_required([i]) for i in range(MEMBERS)]

    code, out, err = run_tool(capsys, *members, "suspend")
    assert code == 1
    assert "no leader found (member 0 requires TLS" in err, err


def test_the_tool_with_a_member_folder_asks_for_a_client_folder(
    tls_cluster: LocalCluster, pki: Pki, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = pki.ours / "member-0"
    with pytest.raises(SystemExit) as exited:
        tool.main(["--members", tls_cluster.members, "describe", "--certs-dir", str(folder)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert (
        f"--certs-dir: {folder} is member-0's folder (a member's certificate); cluster-tool "
        f"needs a client-NAME folder, e.g. {pki.ours / 'client-admin'}"
    ) in err, err


def test_the_tool_with_another_clusters_folder_gives_the_handshakes_reason(
    tls_cluster: LocalCluster, pki: Pki, capsys: pytest.CaptureFixture[str]
) -> None:
    other = str(pki.other / "client-admin")
    code, out, _ = run_tool(
        capsys, "--members", tls_cluster.members, "--timeout", "20s", "describe", "--json",
        "--certs-dir", other,
    )  # fmt: skip
    assert code == 1
    for i, member in enumerate(json.loads(out)["members"]):
        error = member["error"]
        assert error.startswith(f"TLS handshake with member {i} failed: certificate verify "
                                "failed: "), error  # fmt: skip
        assert "not from our ca.crt" in error, error

    code, out, _ = run_tool(
        capsys, "--members", tls_cluster.members, "--timeout", "20s", "describe",
        "--certs-dir", other,
    )  # fmt: skip
    assert code == 1
    assert "down" not in out, out
    assert out.count("certificate verify failed") == MEMBERS, out


def test_the_tool_with_an_expired_certificate_says_so_before_dialling(
    tls_cluster: LocalCluster, pki: Pki, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = pki.expired / "client-admin"
    with pytest.raises(SystemExit) as exited:
        tool.main(["--members", tls_cluster.members, "--certs-dir", str(folder), "health"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"{folder / 'tls.crt'}: the certificate of 'admin' expired on " in err, err


def test_the_tool_with_the_right_folder_sees_every_member(
    tls_cluster: LocalCluster, pki: Pki, capsys: pytest.CaptureFixture[str]
) -> None:
    """The control case: the same members answer with a client folder of their CA."""
    code, out, _ = run_tool(
        capsys, "--members", tls_cluster.members, "--timeout", "20s", "describe", "--json",
        "--certs-dir", str(pki.ours / "client-admin"),
    )  # fmt: skip
    assert code == 0, out
    assert all(m["reachable"] and m["error"] is None for m in json.loads(out)["members"])


def test_the_tool_reads_its_own_variable_not_the_members(
    tls_cluster: LocalCluster,
    pki: Pki,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``CLUSTER_CLIENT_CERTS_DIR`` is the tool's; ``CLUSTER_CERTS_DIR`` (here a member's
    folder, which the tool would refuse) is the member's and left alone."""
    monkeypatch.setenv("CLUSTER_CLIENT_CERTS_DIR", str(pki.ours / "client-admin"))
    monkeypatch.setenv("CLUSTER_CERTS_DIR", str(pki.ours / "member-0"))
    code, out, _ = run_tool(
        capsys, "--members", tls_cluster.members, "--timeout", "20s", "describe", "--json"
    )
    assert code == 0, out
    assert all(m["reachable"] and m["error"] is None for m in json.loads(out)["members"])


async def test_the_tool_with_certificates_against_a_member_without_tls(pki: Pki) -> None:
    """A member without ``--certs-dir`` closes our TLS hello as a bad frame; it is said to
    speak no TLS, not to be down."""

    async def member_without_tls(stream: trio.abc.Stream) -> None:
        async with stream:
            await stream.receive_some(4096)  # a hello is no frame: closed

    async with trio.open_nursery() as nursery:
        port = await nursery.start(TcpNetwork().serve, HOST, 0, member_without_tls)
        (member,) = parse_members(f"0={HOST}:1:2:{port}")
        tool.use_certs(str(pki.ours / "client-admin"))
        with pytest.raises(tool.Unreachable) as failed:
            await tool.request(member, "describe", {}, 20)
        assert str(failed.value).startswith("member 0 does not speak TLS"), failed.value
        assert is_tls_problem(str(failed.value))
        nursery.cancel_scope.cancel()


# ---------------------------------------------------------------------- the client library


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.anyio
async def test_the_client_without_certs_dir_is_told_the_members_require_tls(
    tls_cluster: LocalCluster,
) -> None:
    started = time.monotonic()
    with anyio.fail_after(60), pytest.raises(client.TlsRequiredError) as failed:
        async with client.connect(tls_cluster.ingress_endpoints, connect_timeout=30):
            pass
    assert time.monotonic() - started < 25  # as soon as each member said so
    error = failed.value
    assert str(error) == (
        "members 0, 1 and 2 require TLS: pass certs_dir (a client-NAME folder)"
    ), error
    assert error.member_ids == [0, 1, 2]
    # what connect() raised before it named TLS (after the timeout): still caught so
    assert isinstance(error, client.ConnectTimeoutError)
    assert isinstance(error, client.ClusterClientError)


@pytest.mark.anyio
async def test_the_client_with_a_member_folder_asks_for_a_client_folder(
    tls_cluster: LocalCluster, pki: Pki
) -> None:
    folder = pki.ours / "member-1"
    with pytest.raises(client.CertsDirError) as failed:
        async with client.connect(tls_cluster.ingress_endpoints, certs_dir=folder):
            pass
    assert str(failed.value) == (
        f"certs_dir: {folder} is member-1's folder (a member's certificate); the client "
        f"needs a client-NAME folder, e.g. {pki.ours / 'client-app'}"
    )
    assert isinstance(failed.value, client.ClusterClientError)
    assert isinstance(failed.value, TlsError)  # what connect() raised before


@pytest.mark.anyio
async def test_the_client_with_another_clusters_folder_gives_the_handshakes_reason(
    tls_cluster: LocalCluster, pki: Pki
) -> None:
    with anyio.fail_after(60), pytest.raises(client.ConnectTimeoutError) as failed:
        async with client.connect(
            tls_cluster.ingress_endpoints,
            certs_dir=pki.other / "client-app",
            connect_timeout=2,
        ):
            pass
    text = str(failed.value)
    assert "TLS handshake failed: certificate verify failed: " in text, text
    assert "not from our ca.crt" in text, text


@pytest.mark.anyio
async def test_the_client_with_an_expired_certificate_says_so(pki: Pki) -> None:
    folder = pki.expired / "client-app"
    with pytest.raises(client.CertsDirError, match="the certificate of 'app' expired on "):
        async with client.connect(f"0={HOST}:1", certs_dir=folder):
            pass


@pytest.mark.anyio
async def test_the_client_with_certificates_against_a_member_without_tls(pki: Pki) -> None:
    """A member without ``--certs-dir`` closes our TLS hello as a bad frame: the client
    says it speaks no TLS (it let anyio's EndOfStream escape before)."""

    async def member_without_tls(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                await stream.receive()  # a hello is no frame: closed

    listener = await anyio.create_tcp_listener(local_host=HOST)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, member_without_tls)
        with anyio.fail_after(60), pytest.raises(client.ConnectTimeoutError) as failed:
            async with client.connect(
                f"0={HOST}:{port}", certs_dir=pki.ours / "client-app", connect_timeout=2
            ):
                pass
        assert "does not speak TLS" in str(failed.value), failed.value
        tg.cancel_scope.cancel()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # 15 s of reconnects: one loop
async def test_a_session_whose_member_comes_back_with_tls_is_lost_naming_tls(
    tmp_path: Path, pki: Pki
) -> None:
    """A plaintext session, then its only member restarts with ``--certs-dir``: after
    the connect timeout of failed reconnects the session is lost for good, and
    SessionLostError says the member requires TLS (it only closed the connection)."""
    members = members_string(1)
    plain = LocalCluster(1, "cluster.examples.echo:EchoService", tmp_path, members=members)
    secure = LocalCluster(
        1, "cluster.examples.echo:EchoService", tmp_path, members=members, certs=pki.ours
    )
    with plain:
        async with client.connect(plain.ingress_endpoints, connect_timeout=15) as c:
            await c.offer(b"one")
            assert await c.receive() == b"one"
            plain.kill(0)
            secure.start(0)
            try:
                with anyio.fail_after(90), pytest.raises(client.SessionLostError) as lost:
                    await c.receive()
            finally:
                secure.stop_all()
    assert f"0={HOST}:" in str(lost.value)
    assert "requires TLS: pass certs_dir (a client-NAME folder)" in str(lost.value), lost.value


def test_a_client_folder_is_loaded_and_a_member_folder_names_one_next_to_it(pki: Pki) -> None:
    assert load_client_identity(pki.ours / "client-app").name == "app"
    with pytest.raises(TlsError, match=r"e\.g\. .*client-admin$"):
        load_client_identity(pki.ours / "member-2", user="x", preferred="admin")
