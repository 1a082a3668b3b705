"""Queries answered by the service container (``ServiceContainer.answer_queries``) and
read by the client (``client._query``): what reaches the client for each outcome."""

from __future__ import annotations

from typing import Any

import pytest

import client
from client._query import Queries, outcome, query_level
from cluster.core.base import ConsensusConfig
from cluster.core.consensus import ConsensusModule
from cluster.core.reads import Query
from cluster.core.service_container import ServiceContainer
from cluster.protocol.egress import QueryResponse
from cluster.protocol.enums import QueryStatus
from cluster.service import Cluster, ClusteredService, take_service_snapshot


class Egress:
    def __init__(self) -> None:
        self.sent: list[tuple[int, Any]] = []

    def connect(self, egress_id: int, channel: str) -> None:
        pass

    def attach(self, egress_id: int, source: Any) -> None:
        pass

    def send(self, egress_id: int, message: Any) -> bool:
        self.sent.append((egress_id, message))
        return True

    def reply(self, source: Any, message: Any) -> bool:
        return self.send(message.cluster_session_id, message)

    def close(self, egress_id: int) -> None:
        pass


class Store(ClusteredService):
    def __init__(self) -> None:
        self.values = {"a": "1"}

    def on_start(self, cluster: Cluster, snapshot: bytes | None) -> None:
        pass

    def on_take_snapshot(self) -> bytes:
        return repr(sorted(self.values.items())).encode()

    def on_query(self, payload: bytes) -> bytes:
        if payload == b"raise":
            raise KeyError("no such thing")
        if payload == b"text":
            return "not bytes"  # type: ignore[return-value]
        if payload == b"array":
            return bytearray(b"fine")
        return self.values.get(payload.decode(), "").encode()


class Silent(Store):
    on_query = ClusteredService.on_query  # the default: answers no queries


def container(service: ClusteredService) -> tuple[ServiceContainer, Egress]:
    egress = Egress()
    cm = ConsensusModule(ConsensusConfig(), egress)
    return ServiceContainer(service, cm, egress, member_id=0, clock_ns=lambda: 0), egress


def ask(c: ServiceContainer, *payloads: bytes, read_index: int = 0) -> None:
    for i, payload in enumerate(payloads, 1):
        c.cm.reads.ready.append(Query(7, i, payload, read_index))
        c.cm.reads._per_session[7] = c.cm.reads.in_flight(7) + 1


def test_answers_and_errors_reach_the_client_as_query_responses() -> None:
    service = Store()
    c, egress = container(service)
    snapshot = take_service_snapshot(service)
    ask(c, b"a", b"b", b"raise", b"text", b"array")
    assert c.answer_queries(100) == 5
    assert take_service_snapshot(service) == snapshot  # nothing changed
    responses = [m for _, m in egress.sent]
    assert all(isinstance(r, QueryResponse) for r in responses)
    assert [r.correlation_id for r in responses] == [1, 2, 3, 4, 5]
    assert [r.status for r in responses] == [QueryStatus.OK] * 2 + [
        QueryStatus.SERVICE_ERROR
    ] * 2 + [QueryStatus.OK]
    assert [responses[0].payload, responses[1].payload, responses[4].payload] == [
        b"1",
        b"",
        b"fine",
    ]
    assert (responses[2].error_type, responses[2].message) == ("KeyError", "'no such thing'")
    assert responses[3].error_type == "TypeError"
    assert "not bytes" in responses[3].message
    assert all(r.log_position == 100 for r in responses)
    assert (c.cm.counters.queries, c.cm.counters.query_errors) == (3, 2)
    assert c.cm.reads.in_flight(7) == 0


def test_a_service_without_on_query_says_so() -> None:
    c, egress = container(Silent())
    ask(c, b"a")
    c.answer_queries(0)
    [(_, response)] = egress.sent
    assert response.status is QueryStatus.SERVICE_ERROR
    assert response.error_type == "NotImplementedError"
    assert "Silent answers no queries" in response.message
    with pytest.raises(client.ServiceError, match="NotImplementedError on_query") as raised:
        outcome(response, b"a")
    assert raised.value.error_type == "NotImplementedError"
    assert raised.value.request == b"a"


def test_nothing_is_answered_before_the_read_index_is_applied() -> None:
    c, egress = container(Store())
    ask(c, b"a", read_index=500)
    assert c.answer_queries(499) == 0
    assert egress.sent == []
    assert c.answer_queries(500) == 1


def test_the_client_reads_each_outcome() -> None:
    def response(status: QueryStatus, **fields: Any) -> QueryResponse:
        return QueryResponse(1, 2, 3, status, 40, **fields)

    assert outcome(response(QueryStatus.OK, payload=b"x"), b"q") == b"x"
    assert outcome(response(QueryStatus.NOT_LEADER), b"q") is None  # asked again
    assert outcome(response(QueryStatus.BUSY), b"q") is None
    with pytest.raises(client.QueryRefusedError, match="unknown consistency"):
        outcome(response(QueryStatus.REFUSED, message="unknown consistency 9"), b"q")
    with pytest.raises(ValueError, match="'linearizable', 'follower'"):
        query_level("eventual")


def test_the_client_matches_answers_by_correlation_id() -> None:
    queries = Queries()
    woken: list[int] = []
    first = queries.add(1, lambda: woken.append(1))
    queries.add(2, lambda: woken.append(2))
    queries.on_response(QueryResponse(1, 2, 3, QueryStatus.OK, 40, b"two"))
    queries.on_response(QueryResponse(1, 9, 3, QueryStatus.OK, 41, b"stray"))  # nobody's
    assert woken == [2]
    assert first.response is None
    assert queries.seen_position == 41
    queries.wake_all()
    assert sorted(woken) == [1, 2, 2]


def test_the_session_routes_answers_and_wakes_queries_when_it_moves() -> None:
    from client._connect import ConnectResult
    from client._endpoints import parse_endpoints
    from client._session import Reconnect, Session
    from cluster.protocol.egress import NewLeaderEvent

    endpoints = parse_endpoints("0=127.0.0.1:9010,1=127.0.0.1:9011")
    session = Session(
        endpoints,
        max_frame_size=1 << 20,
        max_egress_backlog=100,
        wake_writer=lambda: None,
        wake_receivers=lambda: None,
    )
    session.on_granted(ConnectResult(7, 3, 1, 2, endpoints, b"s" * 16), endpoints[1])
    woken: list[int] = []
    waiter = session.queries.add(5, lambda: woken.append(5))
    assert session.on_egress(QueryResponse(8, 5, 3, QueryStatus.OK, 1, b"x")) is None  # not ours
    assert waiter.response is None
    assert isinstance(session.on_egress(NewLeaderEvent(4, 7, 0, "")), Reconnect)
    assert woken == [5]  # asked again, to go to the new leader
    assert waiter.response is None
    session.on_egress(QueryResponse(7, 5, 4, QueryStatus.OK, 1, b"x"))
    assert waiter.response is not None
    assert waiter.response.payload == b"x"
