"""A cluster with certificates from `cluster-tool certs`, attacked as issue #18 says:
real nodes in this process, real sockets on loopback, real TLS.

Members 0 and 1 of three run with ``--certs-dir``; clients and tools use the client
folders.  Then: an outsider without a certificate on every port, a client certificate on
the consensus port, a second authenticated client naming another's session, the ``app``
principal asking for admin control; and a node asked to listen beyond loopback in
plaintext."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

import client
from cluster import tool
from cluster.certs import make_certs
from cluster.config import NodeConfig, parse_members
from cluster.examples.kv import KeyValueClient, KeyValueService
from cluster.launch import main
from cluster.local import free_ports
from cluster.node import Node
from cluster.protocol import PROTOCOL_VERSION, encode_frame
from cluster.protocol.consensus import MemberHello
from cluster.protocol.enums import AdminResponseCode
from cluster.protocol.ingress import SessionMessageHeader
from cluster.security import network_for
from cluster.transport.tcp import TcpNetwork
from cluster.transport.tls import load_identity


async def wait_for(predicate: Callable[[], bool], seconds: float = 10) -> None:
    with trio.fail_after(seconds):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.01)


class SecureCluster:
    def __init__(self, tmp_path: Path) -> None:
        ports = free_ports(9)
        self.members = ",".join(
            f"{i}=127.0.0.1:{ports[3 * i]}:{ports[3 * i + 1]}:{ports[3 * i + 2]}" for i in range(3)
        )
        self.ingress = ",".join(f"{i}=127.0.0.1:{ports[3 * i]}" for i in range(3))
        self.certs = tmp_path / "certs"
        make_certs(self.certs, [(i, "127.0.0.1") for i in range(3)], ["eve"])
        self.nodes = []
        for i in range(2):
            config = NodeConfig(
                member_id=i,
                members=self.members,
                dir=str(tmp_path / f"n{i}"),
                certs_dir=str(self.certs / f"member-{i}"),
                admin_principals="admin",
                startup_canvass_timeout=500_000_000,
                initial_cluster_state="new",  # two of three members, brand new
            )
            self.nodes.append(Node(config, KeyValueService(), network=network_for(config)))

    def client_dir(self, name: str) -> Path:
        return self.certs / f"client-{name}"

    @property
    def leader(self) -> Node:
        (leader,) = [n for n in self.nodes if n.cm.is_ready_leader]
        return leader


@asynccontextmanager
async def secure_cluster(tmp_path: Path) -> AsyncIterator[SecureCluster]:
    c = SecureCluster(tmp_path)
    async with trio.open_nursery() as nursery:
        for node in c.nodes:
            await nursery.start(
                lambda task_status, node=node: node.run(
                    handle_signals=False, task_status=task_status
                )
            )
        await wait_for(lambda: any(n.cm.is_ready_leader for n in c.nodes), 30)
        try:
            yield c
        finally:
            for node in c.nodes:
                await node.shutdown()


async def closed_without_answer(stream: trio.abc.Stream) -> bool:
    """True if the peer closed ``stream`` (or broke it) within a second, sending nothing."""
    with trio.move_on_after(1.0):
        try:
            return await stream.receive_some(4096) == b""
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return True
    return False


async def test_a_secured_cluster_serves_its_clients_and_refuses_everyone_else(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with secure_cluster(tmp_path) as c:
            leader = c.leader
            # the client, with its certificate: a session, writes and reads
            async with client.connect(
                c.ingress, certs_dir=c.client_dir("app"), connect_timeout=10
            ) as app:
                async with KeyValueClient(app) as kv:
                    await kv.put("k", b"v")
                    assert await kv.get("k") == b"v"
                session = leader.cm.sessions[app.cluster_session_id]
                assert session.encoded_principal == b"app"  # the certificate's name
                # an admin request on the session: app is no admin, even without an
                # authenticator (the certificate says who it is)
                refused = await app.request_snapshot()
                assert refused.response_code is AdminResponseCode.UNAUTHORISED_ACCESS

                # a second authenticated client names the first one's session: refused
                async with client.connect(
                    c.ingress, certs_dir=c.client_dir("eve"), connect_timeout=10
                ) as eve:
                    before = leader.cm.counters.foreign_session_messages
                    position = leader.cm.log.published_position
                    forged = SessionMessageHeader(
                        app.leadership_term_id, app.cluster_session_id, 0, b"forged"
                    )
                    eve._session.pending += encode_frame(forged)
                    eve._writer.data_ready.notify()
                    await wait_for(lambda: leader.cm.counters.foreign_session_messages > before, 5)
                    assert leader.cm.log.published_position == position  # nothing logged

            # an outsider without a certificate, on every port: no session, no reply
            plain = TcpNetwork()
            for node in c.nodes:
                m = node.member
                for port in (m.ingress_port, m.consensus_port, m.admin_port):
                    async with await plain.open_stream("127.0.0.1", port) as stream:
                        await stream.send_all(encode_frame(MemberHello(1, PROTOCOL_VERSION, 0)))
                        assert await closed_without_answer(stream), (m.member_id, port)
            with pytest.raises(client.ConnectTimeoutError):
                async with client.connect(c.ingress, connect_timeout=1.5):
                    pass

            # a client certificate on the consensus port, claiming to be member 2
            app_net = TcpNetwork(tls=load_identity(c.client_dir("app")))
            port = leader.member.consensus_port
            async with await app_net.open_stream("127.0.0.1", port) as stream:
                await stream.send_all(encode_frame(MemberHello(2, PROTOCOL_VERSION, 0)))
                assert await closed_without_answer(stream)
            assert leader.links.protocol_errors >= 1

            # admin: queries with any client certificate, control only as an admin
            member = parse_members(c.members)[leader.member.member_id]
            tool.use_certs(str(c.client_dir("app")))
            try:
                described = await tool.request(member, "describe", {}, 5.0)
                assert described.ok
                refused = await tool.request(member, "snapshot", {}, 5.0)
                assert not refused.ok
                assert "admin principal" in refused.message
                async with client.connect(
                    c.ingress, certs_dir=c.client_dir("admin"), connect_timeout=10
                ) as admin:
                    allowed_snapshot = await admin.request_snapshot()
                    assert allowed_snapshot.response_code is AdminResponseCode.OK
                tool.use_certs(str(c.client_dir("admin")))
                allowed = await tool.request(member, "suspend", {}, 5.0)
                assert allowed.ok, allowed.message
                assert (await tool.request(member, "resume", {}, 5.0)).ok
            finally:
                tool.use_certs(None)


def test_a_node_refuses_to_listen_beyond_loopback_in_plaintext(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    members = "0=0.0.0.0:19010:19020:19030"
    assert main(["--members", members, "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "not a loopback address" in err
    assert "cluster-tool certs" in err
    assert "--insecure" in err


def test_a_member_folder_must_be_this_members(tmp_path: Path) -> None:
    make_certs(tmp_path / "certs", [(0, "127.0.0.1"), (1, "127.0.0.1")])
    args = ["--members", "0=127.0.0.1:19010:19020:19030", "--dir", str(tmp_path)]
    assert main([*args, "--certs-dir", str(tmp_path / "certs" / "member-1")]) == 2
    assert main([*args, "--certs-dir", str(tmp_path / "certs" / "client-app")]) == 2
    assert main([*args, "--certs-dir", str(tmp_path / "nowhere")]) == 2
