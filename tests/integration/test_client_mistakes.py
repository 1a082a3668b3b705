"""Ordinary mistakes, made as a new user would, against a real node, under asyncio and
Trio (issue #20): each has a time limit; nothing may hang and nothing may be lost
without an exception that says what happened."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import anyio
import msgspec
import pytest

import client
from cluster.examples.kv import KeyValueClient
from cluster.local import LocalCluster

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        1, "cluster.examples.echo:EchoService", tmp_path_factory.mktemp("mistakes")
    ) as running:
        yield running


def dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_offering_text_raises_type_error_and_the_session_goes_on(
    cluster: LocalCluster,
) -> None:
    with anyio.fail_after(20):
        async with client.connect(cluster.ingress_endpoints) as c:
            with pytest.raises(TypeError, match=r"not str .*encode"):
                await c.offer("text")  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="not int"):
                await c.offer_many([b"ok", 42])  # type: ignore[list-item]
            await c.offer(b"after")
            assert await c.receive() == b"ok"  # queued before the bad one
            assert await c.receive() == b"after"


async def test_the_members_string_is_named_as_such(cluster: LocalCluster) -> None:
    with pytest.raises(ValueError, match="looks like a --members entry"):
        async with client.connect(cluster.members):
            pass


async def test_nobody_listening_names_each_member_and_what_it_did() -> None:
    a, b = dead_port(), dead_port()
    with anyio.fail_after(10), pytest.raises(client.ConnectTimeoutError) as caught:
        async with client.connect(f"0=127.0.0.1:{a},1=127.0.0.1:{b}", connect_timeout=1):
            pass
    message = str(caught.value)
    assert "no member accepted a connection" in message
    assert f"0=127.0.0.1:{a} refused" in message
    assert f"1=127.0.0.1:{b} refused" in message


async def test_the_admin_port_by_mistake_is_backed_off_and_explained(
    cluster: LocalCluster,
) -> None:
    admin = cluster.members.partition("=")[2].split(":")
    endpoint = f"0={admin[0]}:{admin[3]}"
    with anyio.fail_after(10), pytest.raises(client.ConnectTimeoutError) as caught:
        async with client.connect(endpoint, connect_timeout=2):
            pass
    assert "closed the connection without answering" in str(caught.value)
    assert "admin" in str(caught.value)


@pytest.mark.parametrize("egress_host", [None, "127.0.0.1"])
async def test_a_session_lost_for_good_fails_a_waiting_receive_and_every_offer(
    tmp_path: Path, egress_host: str | None
) -> None:
    """The only member is killed: no member answers, so after the connect timeout (four
    times it when the leader dials back) the session is lost, and says so."""
    with LocalCluster(1, "cluster.examples.echo:EchoService", tmp_path) as lone:
        async with client.connect(
            lone.ingress_endpoints, connect_timeout=2, egress_host=egress_host
        ) as c:
            await c.offer(b"one")
            assert await c.receive() == b"one"
            failed: list[BaseException] = []

            async def waiting() -> None:
                with pytest.raises(client.SessionLostError, match="no member answered") as e:
                    await c.receive()
                failed.append(e.value)

            with anyio.fail_after(20):  # the task group waits for the receive to fail
                async with anyio.create_task_group() as tg:
                    tg.start_soon(waiting)
                    await anyio.sleep(0.2)
                    lone.kill(0)
            assert failed
            with pytest.raises(client.SessionLostError, match=r"0=127\.0\.0\.1:\d+ refused"):
                await c.offer(b"two")
            assert isinstance(client.SessionLostError("x"), client.SessionClosedError)


async def test_snapshot_timeouts_say_what_timed_out(cluster: LocalCluster) -> None:
    with anyio.fail_after(20):
        async with client.connect(cluster.ingress_endpoints) as c:
            with pytest.raises(TimeoutError, match="snapshot request"):
                await c.request_snapshot(timeout=0.000_001)


@pytest.fixture(scope="module")
def kv_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        1, "cluster.examples.kv:KeyValueService", tmp_path_factory.mktemp("kv-mistakes")
    ) as running:
        yield running


async def test_key_value_client_mistakes(kv_cluster: LocalCluster) -> None:
    with anyio.fail_after(30):
        async with client.connect(kv_cluster.ingress_endpoints) as c:
            kv = KeyValueClient(c)
            with pytest.raises(RuntimeError, match="async with KeyValueClient"):
                await kv.put("k", b"v")  # not entered: would hang reading nothing
            async with KeyValueClient(c, timeout=10) as kv:
                with pytest.raises(TypeError, match=r"bad Put request: Expected `bytes`"):
                    await kv.put("k", "text")  # type: ignore[arg-type]
                await kv.put("k", b"v")
                assert await kv.get("k") == b"v"
            with pytest.raises(RuntimeError, match="is closed"):
                await kv.get("k")
            with pytest.raises(ValueError, match="mine"):  # not an ExceptionGroup
                async with KeyValueClient(c):
                    raise ValueError("mine")
        with pytest.raises(KeyError):
            async with client.connect(kv_cluster.ingress_endpoints) as c, KeyValueClient(c):
                raise KeyError("nested")


async def test_the_service_answers_an_undecodable_request_with_its_request_id(
    kv_cluster: LocalCluster,
) -> None:
    """A request the service cannot decode (another client's version, say) is answered
    with an error carrying its request id, so its sender is told why."""
    with anyio.fail_after(20):
        async with client.connect(kv_cluster.ingress_endpoints) as c:
            await c.offer(msgspec.msgpack.encode(["put", 7, "k", "not bytes", 0]))
            response = msgspec.msgpack.decode(await c.receive())
            assert response[0] == 7
            assert response[1] is False
            assert "bad request" in response[3]
            await c.offer(b"\xc1")  # not even MessagePack
            assert msgspec.msgpack.decode(await c.receive())[0] == -1


async def test_try_offer_reports_back_pressure_instead_of_waiting(
    cluster: LocalCluster,
) -> None:
    with anyio.fail_after(30):
        async with client.connect(cluster.ingress_endpoints) as c:
            assert c.try_offer(b"first")
            assert await c.receive() == b"first"
            big = b"b" * 60_000
            queued = 0
            while c.try_offer(big):  # nothing awaited: the writer cannot send meanwhile
                queued += 1
            assert queued * len(big) >= client.MAX_PENDING_BYTES - len(big)
            with pytest.raises(TypeError):
                c.try_offer("text")  # type: ignore[arg-type]
            for _ in range(queued):
                assert await c.receive() == big
            assert c.try_offer(b"again")
            assert await c.receive() == b"again"
