"""Invariant (9), the simulator's check of query answers, on hand-made histories: each
rule fails on an answer that breaks it (the sweeps and the stale-leader scenario in
``test_sim.py`` run it on whole clusters)."""

from __future__ import annotations

import msgspec
import pytest

from cluster.examples.kv import Put
from cluster.protocol.egress import QueryResponse
from cluster.protocol.enums import CloseReason, QueryStatus
from cluster.protocol.ingress import QUERY_FOLLOWER, QUERY_LINEARIZABLE, SessionMessageHeader
from cluster.protocol.log import SessionCloseEvent, SessionOpenEvent

from .queries import ClientQueries, QueryChecker, QueryOp, encode_answer

_encode = msgspec.msgpack.Encoder().encode
_decode_put = msgspec.msgpack.Decoder(Put).decode


class Broken(AssertionError):
    pass


def _fail(reason: str) -> None:
    raise Broken(reason)


class Log:
    """A committed log of KV puts fed to a :class:`QueryChecker` record by record."""

    def __init__(self) -> None:
        self.length = 0
        self.checker = QueryChecker(_fail, lambda: self.length)

    def append(self, record: object) -> int:
        self.length += 40
        self.checker.on_record(self.length, record, _decode_put)
        return self.length

    def put(self, session: int, key: str, value: bytes) -> int:
        payload = _encode(Put(self.length, key, value))
        return self.append(SessionMessageHeader(0, session, 0, payload, 1))


@pytest.fixture
def log() -> Log:
    log = Log()
    log.append(SessionOpenEvent(0, 1, 7, 0, 0, ""))
    log.put(7, "k", b"one")  # at 80
    log.put(7, "k", b"two")  # at 120
    log.put(7, "j", b"three")  # at 160
    return log


def _answer(
    log: Log,
    queries: ClientQueries,
    query: QueryOp,
    position: int,
    value: bytes | None,
    *,
    commit: int | None = None,
) -> None:
    response = QueryResponse(
        7, query.correlation_id, 0, QueryStatus.OK, position, encode_answer(value)
    )
    answer, wrong = queries.on_response(response, 1.0, log.length if commit is None else commit)
    assert wrong is None
    assert answer is not None
    log.checker.answered(answer)


def _ask(queries: ClientQueries, key: str, level: int, commit: int, *, cid: int = 1) -> QueryOp:
    query = QueryOp(0, cid, key, level, 0.0)
    queries.add(query)
    queries.sent(query, 0.5, commit, queries.seen_position, 0)
    return query


def test_answers_that_hold_pass(log: Log) -> None:
    queries = ClientQueries(0)
    _answer(log, queries, _ask(queries, "k", QUERY_LINEARIZABLE, 120), 120, b"two")
    _answer(log, queries, _ask(queries, "k", QUERY_FOLLOWER, 80, cid=2), 120, b"two")
    _answer(log, queries, _ask(queries, "j", QUERY_LINEARIZABLE, 160, cid=3), 160, b"three")
    _answer(log, queries, _ask(queries, "never", QUERY_FOLLOWER, 160, cid=4), 160, None)
    assert log.checker.checked == 4
    log.checker.final({"k": b"two", "j": b"three"})


def test_a_value_that_is_not_the_log_applied_to_its_position_fails(log: Log) -> None:
    queries = ClientQueries(0)
    with pytest.raises(Broken, match="committed log applied to there holds b'one'"):
        _answer(log, queries, _ask(queries, "k", QUERY_FOLLOWER, 80), 80, b"two")


def test_a_linearizable_answer_older_than_a_commit_before_its_first_send_fails(
    log: Log,
) -> None:
    queries = ClientQueries(0)
    query = _ask(queries, "k", QUERY_LINEARIZABLE, 120)
    queries.sent(query, 0.9, 160, 0, 1)  # asked again: the first send is the invocation
    assert query.commit_at_first_send == 120
    with pytest.raises(Broken, match="stale read"):
        _answer(log, queries, query, 80, b"one")


def test_a_follower_answer_may_be_older_than_the_commit_but_not_its_min_position(
    log: Log,
) -> None:
    queries = ClientQueries(0)
    _answer(log, queries, _ask(queries, "k", QUERY_FOLLOWER, 160), 80, b"one")
    _answer(log, queries, _ask(queries, "k", QUERY_FOLLOWER, 160, cid=2), 120, b"two")
    query = _ask(queries, "k", QUERY_FOLLOWER, 160, cid=3)
    assert query.min_position == 120
    with pytest.raises(Broken, match="before the min_position 120"):
        _answer(log, queries, query, 80, b"one")


def test_an_answer_older_than_one_its_client_had_fails(log: Log) -> None:
    """Monotonic from the answers themselves, even where the client sent too low a
    min_position."""
    queries = ClientQueries(0)
    _answer(log, queries, _ask(queries, "k", QUERY_FOLLOWER, 160), 120, b"two")
    queries.seen_position = 0  # a client that forgot what it saw
    with pytest.raises(Broken, match="went back in time"):
        _answer(log, queries, _ask(queries, "k", QUERY_FOLLOWER, 160, cid=2), 80, b"one")


def test_concurrent_answers_may_arrive_in_either_order(log: Log) -> None:
    queries = ClientQueries(0)
    first = _ask(queries, "k", QUERY_FOLLOWER, 80)
    second = _ask(queries, "k", QUERY_FOLLOWER, 80, cid=2)
    _answer(log, queries, first, 120, b"two")
    _answer(log, queries, second, 80, b"one")  # asked before the first was answered


def test_an_answer_past_the_commit_when_it_arrived_fails(log: Log) -> None:
    queries = ClientQueries(0)
    with pytest.raises(Broken, match="past the highest commit position"):
        _answer(log, queries, _ask(queries, "j", QUERY_FOLLOWER, 80), 160, b"three", commit=120)


def test_an_answer_never_committed_fails_at_the_end(log: Log) -> None:
    queries = ClientQueries(0)
    _answer(log, queries, _ask(queries, "k", QUERY_FOLLOWER, 80), 200, b"two", commit=200)
    assert log.checker.pending  # the committed log seen has not reached it yet
    with pytest.raises(Broken, match="never committed"):
        log.checker.final({"k": b"two", "j": b"three"})


def test_a_message_of_a_closed_session_changes_no_value(log: Log) -> None:
    log.append(SessionCloseEvent(0, 7, 0, CloseReason.CLIENT_ACTION))
    log.put(7, "k", b"after")
    queries = ClientQueries(0)
    _answer(log, queries, _ask(queries, "k", QUERY_FOLLOWER, 80), log.length, b"two")
    log.checker.final({"k": b"two", "j": b"three"})
