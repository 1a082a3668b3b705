"""Issue 31, point 4: a leader whose disk is full answered ``/health`` 200 ``{"health":
true, "reason": "leader"}``.  An in-process single-member node whose disk health reports a
failing write (as its archive agent would on ENOSPC) answers 503 with the disk's reason,
and 200 again once the write goes through.  (A real full disk is test_full_disk.py's.)"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import trio

from cluster.config import NodeConfig
from cluster.examples.echo import EchoService
from cluster.local import free_ports
from cluster.node import Node
from cluster.tool.client import describe_all
from cluster.tool.render import health_document


async def get_health(port: int) -> tuple[int, dict[str, Any]]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = b""
        while chunk := await stream.receive_some(65536):
            reply += chunk
    head, body = reply.split(b"\r\n\r\n", 1)
    return int(head.split()[1]), json.loads(body)


async def wait_health(port: int, code: int) -> dict[str, Any]:
    while True:
        got, body = await get_health(port)
        if got == code:
            return body
        await trio.sleep(0.1)


async def test_a_full_disk_makes_the_leader_unhealthy(tmp_path: Path) -> None:
    ports = free_ports(4)
    config = NodeConfig(
        members=f"0=127.0.0.1:{ports[0]}:{ports[1]}:{ports[2]}",
        dir=str(tmp_path / "node"),
        metrics_port=ports[3],
    )
    node = Node(config, EchoService())
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: node.run(handle_signals=False, task_status=task_status)
            )
            body = await wait_health(node.metrics_port, 200)
            assert (body["reason"], body["role"]) == ("leader", "LEADER")

            full = OSError(errno.ENOSPC, "No space left on device")
            node.storage.disk.failed("health-test", full, "write")
            body = await wait_health(node.metrics_port, 503)
            assert body["health"] is False
            assert body["reason"].startswith("disk full: health-test write failed"), body
            document = health_document(await describe_all([config.this_member], 10.0))
            assert document["healthy"] is False
            assert document["reason"].startswith("disk full: "), document

            node.storage.disk.succeeded("health-test")
            body = await wait_health(node.metrics_port, 200)
            assert body["reason"] == "leader"
            nursery.cancel_scope.cancel()
