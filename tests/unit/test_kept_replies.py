"""What a leader counts as replies dropped past ``--max-kept-replies`` (issue 42): only
those its client never had.  A client that only receives confirms nothing, so its
replies pass the bound however promptly they arrived; counting those made
``triarch_replies_dropped_total`` climb for a session that lost nothing."""

from __future__ import annotations

from cluster.core.replies import REPLY_OVERHEAD, KeptReplies
from cluster.protocol.ingress import SessionMessageHeader


def reply(number: int) -> SessionMessageHeader:
    return SessionMessageHeader(1, 7, 0, b"x", 0, number)


def test_replies_sent_on_the_present_connection_are_not_counted_lost() -> None:
    kept = KeptReplies(3 * (1 + REPLY_OVERHEAD))
    lost = 0
    for number in range(1, 11):  # each sent as it is given, none confirmed
        lost += kept.keep(reply(number))
        kept.sent = number
    assert lost == 0
    assert [r.reply for r in kept.kept] == [8, 9, 10]


def test_replies_never_sent_are_counted_lost() -> None:
    kept = KeptReplies(3 * (1 + REPLY_OVERHEAD))
    kept.keep(reply(1))
    kept.sent = 1  # the client's connection broke after the first
    lost = sum(kept.keep(reply(number)) for number in range(2, 8))
    assert lost == 3  # 2, 3, 4: dropped unsent (1 was sent)
    assert [r.reply for r in kept.kept] == [5, 6, 7]
    kept.restart(received=1)  # the client resumes, having received 1
    assert [r.reply for r in kept.unsent()] == [5, 6, 7]  # the gap it sees: 2..4
