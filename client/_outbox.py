"""The session's messages from offer to confirmation: exactly once in (issue 42).

Sans-IO, like :class:`~client._session.Session`, which holds one.  Each message a
session accepts (``offer``, ``try_offer``, ``offer_many``) gets the session's next
sequence number (1, 2, 3...) and is kept here until the cluster confirms that the
service applied it: a reply carries the session's highest applied sequence, and so does a
:class:`~cluster.protocol.egress.SessionAck` when no reply did.  The leader appends only
a session's next sequence and drops the rest, so whatever is sent again is applied once;
when a leader takes the session (a resume, a new leader) or sees a gap, its
``SessionAck`` asks for what follows its log's last, and the session sends that part of
the kept messages again at once (:meth:`Outbox.after`).

What is kept counts against the client's bound (``MAX_PENDING_BYTES``, 4 MiB: each
message its payload plus :data:`ENTRY_OVERHEAD`): offers wait, and ``try_offer``
refuses, while that much is unconfirmed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

__all__ = ["ENTRY_OVERHEAD", "Outbox"]

ENTRY_OVERHEAD = 64
"""Bytes counted for each kept message beyond its payload (its tuple and deque slot, and
the frame header it is sent again with): a flood of tiny messages is bounded too."""


class Outbox:
    """The sequence numbers a session gave out, and the messages not yet confirmed.

    ``sequence``: the last number given out; ``confirmed``: the highest the cluster
    said it applied; ``kept``: the payloads from sequence ``sequence - len(kept) + 1``
    on, in order (numbered by their place: no tuple per message); ``kept_bytes``: what
    they count against the bound.

    A confirmation only moves ``confirmed`` (one compare per reply: the hot path); what
    it frees is dropped from ``kept`` when room is looked for (:meth:`full`) or the rest
    is sent again (:meth:`after`), so ``kept`` may still hold confirmed messages and
    ``kept_bytes`` count them until then.
    """

    __slots__ = ("confirmed", "kept", "kept_bytes", "sequence")

    def __init__(self) -> None:
        self.sequence = 0
        self.confirmed = 0
        self.kept: deque[bytes] = deque()
        self.kept_bytes = 0

    def add(self, payload: bytes) -> int:
        """Number ``payload`` (bytes the caller will not change) and keep it; returns
        its sequence."""
        self.sequence = sequence = self.sequence + 1
        self.kept.append(payload)
        self.kept_bytes += len(payload) + ENTRY_OVERHEAD
        return sequence

    def unadd(self) -> None:
        """Take back the last :meth:`add` (the message was never offered)."""
        self.kept_bytes -= len(self.kept.pop()) + ENTRY_OVERHEAD
        self.sequence -= 1

    def confirm(self, applied: int) -> bool:
        """The cluster applied everything up to ``applied``; whether that is news."""
        if applied <= self.confirmed:
            return False
        self.confirmed = min(applied, self.sequence)
        return True

    def trim(self) -> None:
        """Forget the kept messages the cluster confirmed."""
        kept = self.kept
        drop = len(kept) - (self.sequence - self.confirmed)
        if drop > 0:
            freed = 0
            popleft = kept.popleft
            for _ in range(drop):
                freed += len(popleft())
            self.kept_bytes -= freed + drop * ENTRY_OVERHEAD

    def full(self, limit: int) -> bool:
        """Whether the unconfirmed messages take ``limit`` bytes or more (offers wait)."""
        if self.kept_bytes < limit:
            return False
        self.trim()
        return self.kept_bytes >= limit

    def after(self, logged: int) -> Iterator[tuple[int, bytes]]:
        """``(sequence, payload)`` of the unconfirmed messages above ``logged`` (what
        the leader asks for again), in order."""
        self.trim()
        first = self.sequence - len(self.kept) + 1
        for offset, payload in enumerate(self.kept):
            if first + offset > logged:
                yield first + offset, payload

    @property
    def unconfirmed(self) -> int:
        """How many messages are kept until the cluster confirms them."""
        return self.sequence - self.confirmed
