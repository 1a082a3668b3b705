"""A key-value register for the query tests (issue 43): written through the log,
read with queries.

Messages: ``set KEY VALUE`` (answered ``ok``).  Queries: ``get KEY`` (the value, empty
when unset), ``at KEY`` (the log position the state reflects, a space, the value: for the
monotonic-reads check of ``test_linearizable_history.py``), ``count`` (how many sets were
applied), ``raise`` (a ValueError: the client gets ``ServiceError``).  ``on_query``
checks it is read-only as the guide asks: the state's snapshot is the same after each
query as before it (else it raises ``AssertionError``, which the test sees as a
ServiceError).
"""

from __future__ import annotations

import json

from cluster.service import ClientSession, Cluster, ClusteredService


class RegisterService(ClusteredService):
    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.sets = 0
        self.cluster: Cluster | None = None

    def on_start(self, cluster: Cluster, snapshot: bytes | None) -> None:
        self.cluster = cluster
        if snapshot:
            state = json.loads(snapshot)
            self.values, self.sets = state["values"], state["sets"]

    def on_take_snapshot(self) -> bytes:
        return json.dumps({"values": self.values, "sets": self.sets}, sort_keys=True).encode()

    def on_session_message(
        self, session: ClientSession | None, timestamp: int, payload: bytes
    ) -> None:
        verb, _, rest = payload.decode().partition(" ")
        if verb == "set":
            key, _, value = rest.partition(" ")
            self.values[key] = value
            self.sets += 1
            if session is not None:
                session.offer(b"ok")

    def on_query(self, payload: bytes) -> bytes:
        before = self.on_take_snapshot()
        verb, _, rest = payload.decode().partition(" ")
        if verb == "get":
            answer = self.values.get(rest, "").encode()
        elif verb == "at":
            assert self.cluster is not None
            answer = f"{self.cluster.log_position} {self.values.get(rest, '')}".encode()
        elif verb == "count":
            answer = str(self.sets).encode()
        elif verb == "raise":
            raise ValueError(f"asked to raise: {rest}")
        else:
            raise ValueError(f"unknown query {verb!r}")
        assert self.on_take_snapshot() == before, "a query changed the state"
        return answer


class NoQueriesService(RegisterService):
    """The same, answering no queries (the default ``on_query``)."""

    on_query = ClusteredService.on_query
