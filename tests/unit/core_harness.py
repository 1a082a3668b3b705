"""Pieces for running pure consensus modules together without Trio: an in-memory
network, storage that checks candidate terms only grow, and the driver's shell for a
member whose archive is a bytearray.

Used by ``test_replication.py`` (seeded random runs) and ``test_transcripts.py``
(scripted scenarios in ``testdata/*.txt``).  Members are driven by
:func:`cluster.core.driver.drive`, the loop the node uses.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from cluster.core.base import Event
from cluster.core.consensus import ConsensusModule

MS = 1_000_000
SECOND = 1_000 * MS


class NullEgress:
    def connect(self, egress_id: int, channel: str) -> None:
        pass

    def send(self, egress_id: int, message: Any) -> bool:
        return True

    def close(self, egress_id: int) -> None:
        pass


class Net:
    """Messages queue up as ``(sender, receiver, message)`` until the test delivers
    them; ``cut`` links drop what is sent on them."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.queue: list[tuple[int, int, Any]] = []
        self.cut: set[tuple[int, int]] = set()

    def port(self, sender: int) -> Any:
        net = self

        class Port:
            def send(self, member_id: int, message: Any) -> bool:
                if (sender, member_id) not in net.cut:
                    net.queue.append((sender, member_id, message))
                return True

        return Port()


class Storage:
    def __init__(self) -> None:
        self.candidate = -1

    def save_candidate_term(self, candidate_term_id: int) -> None:
        assert candidate_term_id > self.candidate
        self.candidate = candidate_term_id

    def record_term(self, leadership_term_id: int, base_position: int, timestamp: int) -> None:
        pass

    def remove_terms_from(self, position: int) -> None:
        pass


class MemoryShell:
    """The driver's shell for one member: its "archive" is a bytearray that takes each
    log batch at once; applying only moves the applied position."""

    def __init__(
        self,
        cm: ConsensusModule,
        disk: bytearray,
        applied: dict[int, int],
        now: int,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        self.cm = cm
        self.disk = disk
        self.applied = applied
        self.member = cm.config.member_id
        self.now = now
        self.events = on_event

    @property
    def applied_position(self) -> int:
        return self.applied[self.member]

    def on_event(self, event: Event) -> None:
        if self.events is not None:
            self.events(event)

    def persist(self) -> None:
        cm = self.cm
        truncate = cm.log.pending_truncate
        if truncate is not None:
            del self.disk[truncate:]
            cm.on_truncated(truncate)
        batch = cm.take_log_batch()
        if batch is not None:
            start, data = batch
            assert start == len(self.disk)
            self.disk += data
            cm.on_archive_position(len(self.disk), self.now)

    def apply(self, commit_position: int) -> bool:
        if commit_position <= self.applied[self.member]:
            return False
        self.applied[self.member] = commit_position
        return True

    def flush(self) -> None:
        pass


def ship_log(
    cm: ConsensusModule, disk: bytearray, heartbeat: Callable[[], bool] = lambda: False
) -> None:
    """What a leader's replicators do: send each follower the log it lacks (one request
    per follower, within one term), or an empty request if ``heartbeat()`` says so."""
    replication = cm.replication
    for member in [p.member_id for p in cm.followers]:
        start = replication.next_append(member)
        assert start is not None
        end = len(disk)
        if start < end:
            stop = replication.replication_stop(start, end)
            data = bytes(disk[start:stop])
            cm.consensus.send(member, replication.append_request(member, start, data))
        elif heartbeat():
            cm.consensus.send(member, replication.append_request(member, start, b""))
