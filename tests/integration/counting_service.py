"""A non-idempotent service for the exactly-once tests (issue 42): it counts.

Each message is ``<u32 number>``, the sender's own count from 1; the service keeps, per
session, how many it applied, how many came twice (a number not above the last one) and
how many out of order (a number past the next one: some were lost before it), and
echoes each message back (the sender's sign that it was applied).  ``b"report"`` answers
those counts as JSON.  Its state is in its snapshots, so a restarted member counts on.
"""

from __future__ import annotations

import json
import struct

from cluster.service import ClientSession, Cluster, ClusteredService

NUMBER = struct.Struct("<I")


class CountingService(ClusteredService):
    def __init__(self) -> None:
        self.counts: dict[int, list[int]] = {}  # session -> [applied, last, twice, out_of_order]

    def on_start(self, cluster: Cluster, snapshot: bytes | None) -> None:
        if snapshot:
            self.counts = {int(k): v for k, v in json.loads(snapshot).items()}

    def on_take_snapshot(self) -> bytes:
        return json.dumps(self.counts).encode()

    def on_session_message(
        self, session: ClientSession | None, timestamp: int, payload: bytes
    ) -> None:
        if session is None:
            return
        counts = self.counts.setdefault(session.id, [0, 0, 0, 0])
        if payload == b"report":
            applied, last, twice, out_of_order = counts
            session.offer(
                json.dumps(
                    {"applied": applied, "last": last, "twice": twice, "out_of_order": out_of_order}
                ).encode()
            )
            return
        self.count(counts, payload)
        session.offer(payload)

    @staticmethod
    def count(counts: list[int], payload: bytes) -> int:
        """Count one message of a session in ``counts``; returns its number."""
        (number,) = NUMBER.unpack(payload)
        counts[0] += 1
        if number <= counts[1]:
            counts[2] += 1
        else:
            if number != counts[1] + 1:
                counts[3] += 1
            counts[1] = number
        return number


COUNTED = struct.Struct("<II")


FAILING = 100
"""``CountingReplies`` raises on every message whose number is a multiple of this."""


class CountingReplies(CountingService):
    """The same counts, but each message's reply is ``<u32 number><u32 applied>``: the
    message's own number and how many of the session's messages the service has applied
    with it (for the replies tests of exactly once out: a reply lost, doubled or out of
    order shows in the numbers, a message applied twice in the count).  On every
    ``FAILING``-th message it raises once it has counted it: the client's
    ``ServiceError`` is that message's reply, numbered among the others."""

    def on_session_message(
        self, session: ClientSession | None, timestamp: int, payload: bytes
    ) -> None:
        if session is None or payload == b"report":
            super().on_session_message(session, timestamp, payload)
            return
        counts = self.counts.setdefault(session.id, [0, 0, 0, 0])
        number = self.count(counts, payload)
        if number % FAILING == 0:
            raise ValueError(f"message {number} fails, as every {FAILING}th does")
        session.offer(COUNTED.pack(number, counts[0]))
