"""Queries in the simulator (issue 43): the clients' side and invariant (9).

The simulated clients ask the KV service for the value of a key without the log
(:class:`~cluster.protocol.ingress.QueryRequest`, answered by the service's ``on_query``)
at both consistency levels, and ask again as the real client does, with the **same**
correlation id.  Linearizable ones go on their session's connection (``client._query.ask``):
again when no answer came within :data:`~client._query.RESEND_AFTER`, after a NOT_LEADER
or BUSY answer (a back-off doubling from :data:`~client._query.RETRY_MIN` to
:data:`~client._query.RETRY_MAX`), and at once when the session moves to a new leader (or
to a new session).  Follower ones go in turn to every member over query connections
(``client._follower``; :mod:`tests.sim.sim_follower`).

Invariant (9), :class:`QueryChecker`: an OK answer at ``log_position`` P to a query of key K

* is K's value in the committed log applied up to P, and P is at most what any member
  had committed when the answer arrived;
* ``linearizable``: P is at least the highest commit position any member had when the
  client **first** sent the query.  Asked again, a query keeps its correlation id, so an
  answer may be to any of its sends, and the first is the invocation: every send comes
  after it, so every answer (to any send) must reflect it.  Checking the last send would
  blame a correct answer to an earlier send; the first is the strongest check the
  protocol allows;
* both levels: P is at least the ``min_position`` the client sent first, and a client's
  answers never go back: P is at least every position the client had received in an
  answer before it first sent this query (from the answers themselves, not from the
  ``min_position`` the client computed).

Every OK answer is checked, a late second answer to a query already answered included
(the client drops it, but a member that gave it would have misled a client that got it
first).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from client._query import RESEND_AFTER, RETRY_MAX, RETRY_MIN
from cluster.protocol.egress import QueryResponse
from cluster.protocol.enums import QueryStatus
from cluster.protocol.ingress import QUERY_FOLLOWER, QUERY_LINEARIZABLE, SessionMessageHeader
from cluster.protocol.log import SessionCloseEvent, SessionOpenEvent

if TYPE_CHECKING:
    from collections.abc import Callable

LEVEL_NAMES = {QUERY_LINEARIZABLE: "linearizable", QUERY_FOLLOWER: "follower"}


def encode_answer(value: bytes | None) -> bytes:
    """The sim service's answer to a query of a key: ``=`` and its value, or ``-``."""
    return b"-" if value is None else b"=" + value


def decode_answer(answer: bytes) -> bytes | None:
    if answer == b"-":
        return None
    if answer[:1] != b"=":
        raise ValueError(f"not an answer of the sim service: {answer!r:.80}")
    return answer[1:]


@dataclass
class QueryOp:
    """One query of a client and what became of it (virtual times)."""

    client: int
    correlation_id: int
    key: str
    consistency: int
    invoked_at: float
    sends: int = 0
    first_sent_at: float = -1.0
    commit_at_first_send: int = -1
    """The highest commit position any member had just before the first send."""
    min_position: int = -1
    """The ``min_position`` of the first send (the highest position the client had seen)."""
    answers_before: int = -1
    """How many OK answers the client had received before the first send."""
    first_sent_to: int = -1
    """The member whose connection the first send went on."""
    next_send_at: float = 0.0
    retry: float = RETRY_MIN
    refusals: dict[str, int] = field(default_factory=dict)
    answered_at: float | None = None
    position: int = -1
    value: bytes | None = None
    late_answers: int = 0
    """OK answers that came after the first (to an earlier send: dropped by the client)."""
    on_links: bool = False
    """Asked over query connections (a follower query: :mod:`tests.sim.sim_follower`),
    not on the session's connection: its own task sends it, not :meth:`ClientQueries.due`."""

    @property
    def level(self) -> str:
        return LEVEL_NAMES.get(self.consistency, str(self.consistency))

    def __str__(self) -> str:
        return (
            f"c{self.client}'s {self.level} query {self.correlation_id} of {self.key!r} "
            f"(sent {self.sends}x, first at {self.first_sent_at:.4f}s with "
            f"min_position {self.min_position}, commit then {self.commit_at_first_send})"
        )


@dataclass
class Answer:
    """An OK answer as it arrived at its client."""

    query: QueryOp
    position: int
    value: bytes | None
    arrived_at: float
    commit_at_arrival: int
    number: int
    """Its place among its client's OK answers (0, 1, 2...), in arrival order."""


class ClientQueries:
    """A client's queries in flight, by correlation id, and what it has seen (sans-IO)."""

    def __init__(self, client: int) -> None:
        self.client = client
        self.waiting: dict[int, QueryOp] = {}
        self.answered: dict[int, QueryOp] = {}
        self.seen_position = 0
        """The highest log position an OK answer reflected (sent as ``min_position``)."""
        self.answers = 0
        """OK answers received (late ones included)."""

    def __len__(self) -> int:
        return len(self.waiting)

    def add(self, query: QueryOp) -> None:
        self.waiting[query.correlation_id] = query

    def due(self, now: float) -> list[QueryOp]:
        """The queries to send (again) on the session's connection now."""
        return [q for q in self.waiting.values() if q.next_send_at <= now and not q.on_links]

    def next_due(self) -> float | None:
        return min((q.next_send_at for q in self.waiting.values() if not q.on_links), default=None)

    def sent(self, query: QueryOp, now: float, commit: int, min_position: int, member: int) -> None:
        if query.sends == 0:
            query.first_sent_to = member
            query.first_sent_at = now
            query.commit_at_first_send = commit
            query.min_position = min_position
            query.answers_before = self.answers
        query.sends += 1
        query.next_send_at = now + RESEND_AFTER

    def ask_again_now(self, now: float) -> None:
        """The session moved (a new leader, a new session): ask every query again."""
        for query in self.waiting.values():
            query.next_send_at = now

    def on_response(
        self, response: QueryResponse, now: float, commit: int
    ) -> tuple[Answer | None, str | None]:
        """A QueryResponse: the OK answer to check (None for a refusal or an unknown
        correlation id), and what is wrong with it if the client cannot take it."""
        cid = response.correlation_id
        query = self.waiting.get(cid) or self.answered.get(cid)
        if query is None:
            return None, None  # not this client's (a query of an earlier incarnation)
        status = response.status
        if status is not QueryStatus.OK:
            name = status.name
            query.refusals[name] = query.refusals.get(name, 0) + 1
            if status in (QueryStatus.NOT_LEADER, QueryStatus.BUSY):
                if cid in self.waiting:
                    query.next_send_at = now + query.retry
                    query.retry = min(2 * query.retry, RETRY_MAX)
                return None, None
            return None, f"{query}: answered {name}: {response.message!r:.200}"
        try:
            value = decode_answer(response.payload)
        except ValueError as exc:
            return None, f"{query}: {exc}"
        answer = Answer(query, response.log_position, value, now, commit, self.answers)
        self.answers += 1
        if response.log_position > self.seen_position:
            self.seen_position = response.log_position
        if cid in self.waiting:
            del self.waiting[cid]
            self.answered[cid] = query
            query.answered_at = now
            query.position = response.log_position
            query.value = value
        else:
            query.late_answers += 1
        return answer, None


class QueryChecker:
    """Invariant (9) over every OK answer, against the committed log (its values by key,
    built as the checker extends the committed log seen, by the rule of
    ``Checker.expected_store``: a message counts while its session is open)."""

    def __init__(self, fail: Callable[[str], Any], committed_length: Callable[[], int]) -> None:
        self.fail = fail
        self.committed_length = committed_length
        self._open: set[int] = set()
        self.history: dict[str, tuple[list[int], list[bytes]]] = {}
        """key -> (log positions where it was put, in order; the values put there)."""
        self.pending: list[Answer] = []
        """Answers whose position the committed log seen has not reached yet."""
        self._positions: dict[int, list[int]] = {}
        """client -> its OK answers' positions, in arrival order, as a running maximum."""
        self.checked = 0
        self.by_level: dict[str, int] = {}

    # -- the committed log ---------------------------------------------------------

    def on_record(self, end: int, record: Any, put: Callable[[bytes], Any]) -> None:
        """A record of the committed log ending at ``end`` (in log order, each once)."""
        if isinstance(record, SessionOpenEvent):
            self._open.add(record.cluster_session_id)
        elif isinstance(record, SessionCloseEvent):
            self._open.discard(record.cluster_session_id)
        elif type(record) is SessionMessageHeader and record.cluster_session_id in self._open:
            message = put(record.payload)
            positions, values = self.history.setdefault(message.key, ([], []))
            positions.append(end)
            values.append(message.value)

    def value_at(self, key: str, position: int) -> bytes | None:
        """``key``'s value in the committed log applied up to ``position``."""
        entry = self.history.get(key)
        if entry is None:
            return None
        index = bisect.bisect_right(entry[0], position)
        return entry[1][index - 1] if index else None

    # -- answers -------------------------------------------------------------------

    def answered(self, answer: Answer) -> None:
        """(9) at once: the positions; the value once the committed log seen reaches it."""
        query, position = answer.query, answer.position
        if position > answer.commit_at_arrival:
            self.fail(
                f"{query}: answered at log position {position}, past the highest commit "
                f"position of any member when the answer arrived ({answer.commit_at_arrival})"
            )
        if query.consistency == QUERY_LINEARIZABLE and position < query.commit_at_first_send:
            self.fail(
                f"{query}: answered from log position {position}, before the commit "
                f"position {query.commit_at_first_send} some member had when it was sent "
                "(a stale read: not linearizable)"
            )
        if position < query.min_position:
            self.fail(
                f"{query}: answered from log position {position}, before the "
                f"min_position {query.min_position} it asked for"
            )
        seen = self._positions.setdefault(query.client, [])
        if query.answers_before > 0:
            before = seen[query.answers_before - 1]
            if position < before:
                self.fail(
                    f"{query}: answered from log position {position}, before the position "
                    f"{before} its client had received in an answer before it asked "
                    "(went back in time)"
                )
        seen.append(max(position, seen[-1]) if seen else position)
        if len(seen) != answer.number + 1:
            self.fail(f"{query}: answer numbered {answer.number}, after {len(seen) - 1}")
        self.pending.append(answer)
        self.check_values()

    def check_values(self, final: bool = False) -> None:
        """The value of every answer whose position the committed log seen reaches."""
        if not self.pending:
            return
        length = self.committed_length()
        still = []
        for answer in self.pending:
            query = answer.query
            if answer.position > length:
                if final:
                    self.fail(
                        f"{query}: answered from log position {answer.position}, never "
                        f"committed (the committed log seen ends at {length})"
                    )
                still.append(answer)
                continue
            expected = self.value_at(query.key, answer.position)
            if answer.value != expected:
                self.fail(
                    f"{query}: answered {answer.value!r:.60} at log position "
                    f"{answer.position}, but the committed log applied to there holds "
                    f"{expected!r:.60}"
                )
            self.checked += 1
            self.by_level[query.level] = self.by_level.get(query.level, 0) + 1
        self.pending = still

    def final(self, store: dict[str, bytes]) -> None:
        """At the end: every answer checked, and the index agrees with the store the
        whole committed log gives (``expected_store``)."""
        self.check_values(final=True)
        length = self.committed_length()
        index = {k: v for k in self.history if (v := self.value_at(k, length)) is not None}
        if index != store:
            wrong = [k for k in store.keys() | index.keys() if index.get(k) != store.get(k)]
            self.fail(f"(9) the query checker's index differs from the store at {wrong[:5]}")
