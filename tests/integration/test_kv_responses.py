"""A ``KeyValueClient``'s responses come through the session's contract (issue 42): a
real node in this process, the real client behind a real TCP forwarder that can swallow
what the node sends and then break the connection, so that the client misses
responses exactly when the test says.

The client resends nothing and the service remembers nothing: the members keep each
response until the client confirms it and send the missing ones after the client
resumes, so every request is answered once.  Past ``--max-kept-replies`` the oldest
responses go; the requests they answered fail with ``ResponseLostError`` (they were
applied), the others get their own responses, none is handed to the wrong request.
"""

from __future__ import annotations

from contextlib import suppress
from pathlib import Path

import pytest
import trio
from test_node import make_config, running_node

import client
from cluster.examples.kv import KeyValueClient, KeyValueService, ResponseLostError

HOST = "127.0.0.1"
REQUESTS = 10


class Gate:
    """A TCP forwarder to ``HOST:target``; while ``swallowing``, what the node sends is
    dropped (the node counts it sent); ``cut()`` closes every connection."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = 0
        self.swallowing = False
        self.swallowed = 0
        self._scopes: list[trio.CancelScope] = []

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host=HOST)
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._join, listeners)

    def cut(self) -> None:
        for scope in self._scopes:
            scope.cancel()

    async def _join(self, downstream: trio.SocketStream) -> None:
        upstream = await trio.open_tcp_stream(HOST, self.target)
        async with downstream, upstream, trio.open_nursery() as nursery:
            self._scopes.append(nursery.cancel_scope)
            nursery.start_soon(self._pump, downstream, upstream, nursery.cancel_scope, False)
            nursery.start_soon(self._pump, upstream, downstream, nursery.cancel_scope, True)

    async def _pump(
        self,
        source: trio.SocketStream,
        sink: trio.SocketStream,
        done: trio.CancelScope,
        egress: bool,
    ) -> None:
        with suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            while data := await source.receive_some(65536):
                if egress and self.swallowing:
                    self.swallowed += len(data)
                    continue
                await sink.send_all(data)
        done.cancel()


async def missed_responses(tmp_path: Path, max_kept_replies: int) -> dict[str, object]:
    """``REQUESTS`` puts whose responses the client misses, then a resume: what each
    put came to, and the client's counts."""
    service = KeyValueService()
    config = make_config(tmp_path, max_kept_replies=max_kept_replies)
    outcome: dict[str, object] = {}
    with trio.fail_after(60):
        async with running_node(config, service) as node, trio.open_nursery() as nursery:
            gate = Gate(node.ingress_port)
            await nursery.start(gate.run)
            async with (
                client.connect(f"0={HOST}:{gate.port}", connect_timeout=10) as c,
                KeyValueClient(c) as kv,
            ):
                await kv.put("warm-up", b"1")
                applied = service.requests
                gate.swallowing = True
                results: dict[int, object] = {}

                async def put(i: int, *, task_status: trio.TaskStatus[None]) -> None:
                    task_status.started()
                    try:
                        await kv.put(f"k{i}", b"%d" % i)
                        results[i] = "ok"
                    except ResponseLostError as exc:
                        results[i] = exc

                async with trio.open_nursery() as puts:
                    for i in range(REQUESTS):
                        await puts.start(put, i)  # offered in this order
                    while service.requests < applied + REQUESTS:  # noqa: ASYNC110
                        await trio.sleep(0.01)
                    await trio.sleep(0.1)  # the node sent the responses: swallowed
                    assert results == {}
                    gate.swallowing = False
                    gate.cut()  # the client resumes on a new connection
                outcome = {
                    "results": [results[i] for i in range(REQUESTS)],
                    "dropped": c.replies_dropped,
                    "unmatched": kv.unmatched,
                    "swallowed": gate.swallowed,
                    "store": dict(service.store),
                }
                assert await kv.get("k0") == b"0"  # the session goes on
            nursery.cancel_scope.cancel()
    return outcome


async def test_responses_missed_are_sent_again_after_a_resume(tmp_path: Path) -> None:
    outcome = await missed_responses(tmp_path, 256 << 10)
    assert outcome["swallowed"]
    assert outcome["results"] == ["ok"] * REQUESTS
    assert (outcome["dropped"], outcome["unmatched"]) == (0, 0)


@pytest.mark.parametrize("kept", [2, 1])
async def test_past_the_bound_the_requests_whose_responses_went_fail_as_lost(
    tmp_path: Path, kept: int
) -> None:
    response = 5 + 64  # a put's response (msgpack: [id, true, nil, ""]) and its overhead
    outcome = await missed_responses(tmp_path, kept * response + response // 2)
    results = outcome["results"]
    assert isinstance(results, list)
    lost = REQUESTS - kept
    assert all(isinstance(r, ResponseLostError) for r in results[:lost]), results
    assert "was applied" in str(results[0])
    assert results[lost:] == ["ok"] * kept
    assert (outcome["dropped"], outcome["unmatched"]) == (lost, 0)
    store = outcome["store"]
    assert isinstance(store, dict)
    assert all(store[f"k{i}"] == b"%d" % i for i in range(REQUESTS))  # every one applied
