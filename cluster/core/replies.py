"""Exactly once out (issue 42): the replies to a session that every member keeps until
its client confirms them.

A reply is what the service gives a session while it applies an entry of the log
(``ClientSession.offer``, or the :class:`~cluster.protocol.egress.ServiceErrorEvent` of
a callback that raised).  Every member applies the same entries, so every member gives
the same replies in the same order: each gets the session's next number (1, 2, 3...,
in the message's ``reply`` field) on every member alike, and is kept in a
:class:`KeptReplies` on each.  The leader sends them in order and remembers how far it
got on the client's present connection (``sent``); a new leader, or the same one after a
resume, sends again what the client has not confirmed, and the client drops a number it
has already seen: each reply reaches it once, in order.

The client confirms what it received in order in the ``reply`` field of each message it
sends: that field is in the log, so every member forgets the same replies at the same
entry.  What is kept is bounded (``limit`` bytes: each reply's payload plus
:data:`REPLY_OVERHEAD`); past it the oldest go, and a client that never received them
sees the gap in the numbers (a ``RepliesDropped`` event).  A reply given outside the log
(from ``on_start`` or ``on_role_change``, which differ between members) is not numbered,
not kept, and sent only by the leader, at most once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from itertools import islice

from ..protocol.egress import ServiceErrorEvent
from ..protocol.ingress import SessionMessageHeader

__all__ = ["DEFAULT_KEPT_REPLIES", "REPLY_OVERHEAD", "KeptReplies", "Reply"]

Reply = SessionMessageHeader | ServiceErrorEvent
"""A numbered reply: a service's message to the session, or its error on one."""

REPLY_OVERHEAD = 64
"""Bytes counted for each kept reply beyond its payload (its object and deque slot):
a flood of tiny replies is bounded too."""

DEFAULT_KEPT_REPLIES = 256 * 1024
"""Bytes of unconfirmed replies each member keeps for one session by default
(``--max-kept-replies``)."""


def _size(reply: Reply) -> int:
    if type(reply) is SessionMessageHeader:
        return len(reply.payload) + REPLY_OVERHEAD
    return len(reply.request) + len(reply.message) + REPLY_OVERHEAD  # type: ignore[union-attr]


_Header = SessionMessageHeader  # a module global is found faster


class KeptReplies:
    """One session's numbered replies not yet confirmed (see the module).

    ``last``: the number the last reply got; ``confirmed``: the highest the client said
    it received in order (from the log); ``kept``: the replies after it, oldest first,
    at most ``limit`` bytes (``size``); ``sent``: on the leader, the highest number sent
    on the client's present connection (what follows goes next, in order).
    """

    __slots__ = ("confirmed", "kept", "last", "limit", "sent", "size")

    def __init__(self, limit: int, last: int = 0, confirmed: int = 0) -> None:
        self.limit = limit
        self.last = last
        self.confirmed = confirmed
        self.sent = last
        self.kept: deque[Reply] = deque()
        self.size = 0

    def keep(self, reply: Reply) -> int:
        """Keep ``reply``, numbered ``last + 1`` already; returns how many of the replies
        dropped to make room (the oldest, unconfirmed) were never sent on the client's
        present connection (``sent``, the leader's): those its client lacks for good.
        One that was sent most likely arrived: a client that only receives confirms
        nothing, and its oldest replies go past the bound though it has them."""
        self.last = reply.reply
        self.kept.append(reply)
        if type(reply) is _Header:  # the hot path: _size, inline
            self.size += len(reply.payload) + REPLY_OVERHEAD
        else:
            self.size += _size(reply)
        return self._trim() if self.size > self.limit else 0

    def _trim(self) -> int:
        kept, sent, unsent = self.kept, self.sent, 0
        while self.size > self.limit and len(kept) > 1:
            reply = kept.popleft()
            self.size -= _size(reply)
            unsent += reply.reply > sent
        return unsent

    def confirm(self, received: int) -> None:
        """The client received every reply up to ``received`` (a claim: a number it was
        never given confirms only what there is)."""
        if received <= self.confirmed:
            return
        self.confirmed = received = min(received, self.last)
        if self.sent < received:
            self.sent = received  # it has them: none goes again
        kept = self.kept
        while kept and kept[0].reply <= received:
            self.size -= _size(kept.popleft())

    def restart(self, received: int = 0) -> None:
        """The client's connection is new (a resume, a new leader): what it has not
        confirmed goes again, from after ``received`` if it said how far it got."""
        self.sent = max(self.confirmed, min(received, self.last))

    def unsent(self) -> Iterator[Reply]:
        """The kept replies after ``sent``, in order (the caller moves ``sent``)."""
        kept = self.kept
        if kept:  # numbered contiguously: skip what went, in C
            yield from islice(kept, max(0, self.sent + 1 - kept[0].reply), None)

    def records(self) -> list[Reply]:
        """What a snapshot keeps (the kept replies, oldest first)."""
        return list(self.kept)

    def restore(self, replies: list[Reply]) -> None:
        """Keep the replies a snapshot kept (numbered, after ``confirmed``)."""
        for reply in replies:
            if reply.reply > self.confirmed:
                self.kept.append(reply)
                self.size += _size(reply)
        self._trim()
