"""The session's events, watched as an application would (issue #20): a leader killed
under a watching client, an admin response, the close; under asyncio and Trio."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

import client
from cluster.local import LocalCluster

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_a_watching_client_sees_failover_admin_responses_and_its_close(
    tmp_path: Path,
) -> None:
    with LocalCluster(
        3,
        "cluster.examples.echo:EchoService",
        tmp_path,
        extra_args=["--leader-heartbeat-timeout", "1s", "--leader-heartbeat-interval", "100ms"],
    ) as cluster:
        seen: list[client.ClientEvent] = []
        with anyio.fail_after(60):
            async with client.connect(cluster.ingress_endpoints, connect_timeout=10) as c:
                new_leader = anyio.Event()

                async def watch() -> None:
                    async for event in c.events():
                        seen.append(event)
                        if isinstance(event, client.NewLeader):
                            new_leader.set()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(watch)
                    await anyio.sleep(0.1)
                    response = await c.request_snapshot(timeout=10)
                    old = c.leader_member_id
                    cluster.kill(old)
                    await new_leader.wait()
                    await c.offer(b"after")  # goes to the new leader once connected
                    assert await c.receive() == b"after"
                    await c.close()
        kinds = [type(event).__name__ for event in seen]
        assert client.AdminResponseReceived(response) in seen
        assert "Disconnected" in kinds
        assert kinds.index("Disconnected") < kinds.index("NewLeader")
        leader = next(e for e in seen if isinstance(e, client.NewLeader))
        assert leader.member_id != old
        assert "Connected" in kinds[kinds.index("Disconnected") :]  # connected again
        assert seen[-1] == client.SessionClosed("CLIENT_ACTION", lost=False)


async def test_events_after_the_close_end_at_once(tmp_path: Path) -> None:
    with LocalCluster(1, "cluster.examples.echo:EchoService", tmp_path) as cluster:
        with anyio.fail_after(20):
            async with client.connect(cluster.ingress_endpoints) as c:
                pass
            events = [event async for event in c.events()]
        assert events == [client.SessionClosed("CLIENT_ACTION", lost=False)]
