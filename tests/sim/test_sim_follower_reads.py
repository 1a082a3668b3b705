"""Follower reads at real followers in the simulator (issue 43): a client's follower
queries go in turn to every member over query connections (:mod:`tests.sim.sim_follower`),
and invariant (9) checks every member's answers (the sweeps run it on every seed)."""

from __future__ import annotations

from pathlib import Path

from .harness import SimCluster
from .test_sim import _node, _sim


def test_every_member_answers_and_one_cut_off_holds_what_it_cannot_answer(
    tmp_path: Path,
) -> None:
    """Every member answers follower queries.  Then one follower is cut off from the
    other members (the clients still reach it) and falls behind: once the reader has an
    answer from past what that follower applied, the follower holds its queries (their
    ``min_position`` is past its state), the reader moves each to the next member after
    a second without an answer, and every query is still answered.  After the heal the
    follower catches up and answers again."""
    seen: dict[str, int] = {}

    async def scenario(sim: SimCluster) -> None:
        writer = sim.new_client(own_egress=False, window=2)
        reader = sim.new_client(own_egress=True, query_share=1.0, window=8)
        sim.add_client(writer)
        sim.add_client(reader)
        leader = await sim.wait_for_leader()
        by = sim.history.answered_by

        await sim.wait_for(
            "every member answered follower queries",
            lambda: all(by.get(m, 0) >= 3 for m in range(3)),
            10.0,
        )
        lagger = (leader + 1) % 3
        sim.partition([lagger], [m for m in range(3) if m != lagger])
        await sim.wait_for(
            "the reader got an answer from past what the cut-off member committed",
            lambda: reader.queries.seen_position > _node(sim, lagger).cm.commit_position,
            5.0,
        )
        mark = by.get(lagger, 0)
        sent = reader.follower_reads.sent_to.get(lagger, 0)
        answered = sum(q.answered_at is not None for q in sim.history.queries)
        await sim.sleep(4.0)
        seen["lagger_while_cut"] = by.get(lagger, 0) - mark
        seen["answered_while_cut"] = (
            sum(q.answered_at is not None for q in sim.history.queries) - answered
        )
        seen["sent_to_lagger_while_cut"] = reader.follower_reads.sent_to.get(lagger, 0) - sent
        sim.heal()
        mark = by.get(lagger, 0)
        await sim.wait_for(
            "the member answers again once it caught up",
            lambda: by.get(lagger, 0) > mark,
            10.0,
        )

    sim, _ = _sim(8, 3, tmp_path, scenario)
    assert seen["lagger_while_cut"] == 0
    assert seen["answered_while_cut"] >= 20
    assert seen["sent_to_lagger_while_cut"] >= 2  # asked, held, passed over a while
    assert all(q.answered_at is not None for q in sim.history.queries)
    assert sim.checker.queries.by_level.get("follower", 0) >= 30
    assert sim.checker.queries.checked >= len(sim.history.queries)
