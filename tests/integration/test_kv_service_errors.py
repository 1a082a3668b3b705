"""The KeyValueClient and a service that raises (issue 32): with a real node run here
under Trio, the request the service raised on fails with ``client.ServiceError``, and
only that one: requests in flight beside it are answered, and the session goes on."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from test_node import endpoints, make_config, running_node

import client
from cluster.examples.kv import KeyValueClient, KeyValueService, Put, Request, Response


class BuggyKeyValueService(KeyValueService):
    """The KV service with a bug: a put of the key ``"boom"`` raises."""

    def apply(self, request: Request, timestamp: int = 0) -> Response:
        if isinstance(request, Put) and request.key == "boom":
            raise KeyError(f"no room for {request.key!r}")
        return super().apply(request, timestamp)


async def test_only_the_request_the_service_raised_on_fails(tmp_path: Path) -> None:
    service = BuggyKeyValueService()
    with trio.fail_after(30):
        async with running_node(make_config(tmp_path), service) as node:
            async with client.connect(endpoints(node)) as c, KeyValueClient(c) as kv:
                failures: list[client.ServiceError] = []

                async def boom() -> None:
                    with pytest.raises(client.ServiceError) as caught:
                        await kv.put("boom", b"x")
                    failures.append(caught.value)

                async with trio.open_nursery() as nursery:
                    for i in range(100):
                        nursery.start_soon(kv.put, f"k{i}", b"v")
                        if i == 50:
                            nursery.start_soon(boom)
                (error,) = failures
                assert error.error_type == "KeyError"
                assert "no room for 'boom'" in error.message
                assert not c.is_closed
                assert await kv.get("k99") == b"v"
                assert await kv.get("boom") is None
                assert node.cm.counters.service_errors == 1
            assert len(service.store) == 100
