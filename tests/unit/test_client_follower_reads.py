"""The client's choice of member for each follower read (:mod:`client._follower`): the
members in turn, the leader included; a member that failed is passed over for a
back-off that doubles while it keeps failing, unless every member is."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import trio
import trio.testing

from client._endpoints import Endpoint
from client._follower import DOWN_MAX, DOWN_MIN, FollowerReads


def reads(members: int = 3) -> FollowerReads:
    endpoints = {m: Endpoint("127.0.0.1", 9000 + m) for m in range(members)}
    session: Any = SimpleNamespace(endpoints=endpoints)
    return FollowerReads(session, None, lambda *args: None, itertools.count(1).__next__)


def test_members_in_turn_and_a_failed_one_passed_over_a_while() -> None:
    clock = trio.testing.MockClock()

    async def main() -> None:
        r = reads()
        assert [r._pick() for _ in range(6)] == [0, 1, 2, 0, 1, 2]
        r._down(1)
        assert [r._pick() for _ in range(4)] == [0, 2, 0, 2]
        clock.jump(DOWN_MIN + 0.01)
        assert sorted(r._pick() for _ in range(3)) == [0, 1, 2]  # back in turn
        r._down(1)  # failing again: passed over twice as long
        clock.jump(DOWN_MIN + 0.01)
        assert 1 not in [r._pick() for _ in range(4)]
        clock.jump(DOWN_MIN)
        assert 1 in [r._pick() for _ in range(3)]
        for _ in range(20):
            r._down(2)
        assert r._down_until[2] - trio.current_time() <= DOWN_MAX  # the back-off's ceiling
        # every member passed over: the one passed over the shortest is asked
        r._down(0)
        r._down(1)
        assert r._pick() == 0

    trio.run(main, clock=clock)


def test_one_member() -> None:
    async def main() -> None:
        r = reads(1)
        r._down(0)
        assert [r._pick() for _ in range(3)] == [0, 0, 0]

    trio.run(main)
