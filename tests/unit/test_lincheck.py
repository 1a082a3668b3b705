"""The linearizability checker (``tests/lincheck.py``): hand-written histories that are
and are not linearizable, the failing window it reports, the monotonic-reads check, and
property tests: a history recorded from a real sequential execution, each op given a
random interval around the moment it took effect, is always linearizable; the same
history with one read's answer changed to a value never written, or to a value already
overwritten before the read began (a stale read), never is."""

from __future__ import annotations

import itertools
import random
import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.lincheck import (
    Op,
    cas,
    check,
    check_follower_reads,
    check_monotonic_reads,
    delete,
    get,
    put,
)


def verdict(history: list[Op]) -> bool | None:
    return check(history).linearizable


# --------------------------------------------------------------------------- by hand


def test_sequential_history_is_linearizable() -> None:
    history = [
        get("a", "x", None, 0, 1),
        put("a", "x", 1, 2, 3),
        get("b", "x", 1, 4, 5),
        cas("b", "x", 1, 2, True, 6, 7),
        cas("a", "x", 1, 3, False, 8, 9),
        get("a", "x", 2, 10, 11),
        delete("a", "x", True, 12, 13),
        delete("b", "x", False, 14, 15),
        get("b", "x", None, 16, 17),
    ]
    result = check(history)
    assert result.ok
    assert result.linearizable is True
    assert "linearizable: 9 ops on 1 keys" in result.explain()


def test_stale_read_after_a_completed_write_is_caught() -> None:
    history = [
        put("a", "x", "old", 0, 1),
        put("b", "x", "new", 2, 3),
        get("c", "x", "old", 4, 5),  # began after "new" was acknowledged
    ]
    result = check(history)
    assert result.linearizable is False
    [failure] = result.failures
    assert failure.key == "x"
    # the window: the write it missed and the read; the first write is not needed
    assert failure.needed == history[1:]
    text = result.explain()
    assert "key 'x' is not linearizable" in text
    assert "put('x', 'new')" in text
    assert "get('x') -> 'old'" in text
    assert "2.0000" in text
    assert "5.0000" in text


def test_lost_write_is_caught() -> None:
    history = [
        put("a", "x", 1, 0, 1),
        put("a", "x", 2, 2, 3),
        get("b", "x", 1, 4, 5),  # the second write lost
        get("b", "x", 2, 6, 7),
    ]
    assert verdict(history) is False
    assert verdict([put("a", "x", 1, 0, 1), get("b", "x", None, 2, 3)]) is False


def test_read_of_a_value_never_written_is_caught() -> None:
    result = check([get("a", "x", "ghost", 0, 1)])
    assert result.linearizable is False
    assert result.failures[0].from_start


def test_cas_anomalies_are_caught() -> None:
    # two compare-and-sets from 0 to 1, one after the other, both succeeded
    assert (
        verdict(
            [
                put("a", "x", 0, 0, 1),
                cas("a", "x", 0, 1, True, 2, 3),
                cas("b", "x", 0, 1, True, 4, 5),
            ]
        )
        is False
    )
    # a compare-and-set that failed although the key held the old value
    assert verdict([put("a", "x", 0, 0, 1), cas("b", "x", 0, 1, False, 2, 3)]) is False
    # one that succeeded on a value the key never held
    assert verdict([put("a", "x", 0, 0, 1), cas("b", "x", 5, 1, True, 2, 3)]) is False
    # concurrent ones: one of them wins
    assert (
        verdict(
            [
                put("a", "x", 0, 0, 1),
                cas("a", "x", 0, 1, True, 2, 6),
                cas("b", "x", 0, 2, False, 3, 5),
                get("c", "x", 1, 7, 8),
            ]
        )
        is True
    )


def test_delete_answers_whether_the_key_existed() -> None:
    assert verdict([delete("a", "x", True, 0, 1)]) is False
    assert verdict([put("a", "x", 1, 0, 1), delete("a", "x", False, 2, 3)]) is False
    assert verdict([put("a", "x", 1, 0, 1), delete("a", "x", True, 2, 3)]) is True
    assert (
        verdict([put("a", "x", 1, 0, 1), delete("a", "x", True, 2, 3), get("b", "x", 1, 4, 5)])
        is False
    )


def test_concurrent_ops_that_fit_in_one_order() -> None:
    # two overlapping writes: either may be last; reads during them may see either
    history = [
        put("a", "x", 1, 0, 10),
        put("b", "x", 2, 1, 9),
        get("c", "x", None, 0.5, 1.5),
        get("c", "x", 2, 2, 3),
        get("d", "x", 1, 4, 5),
        get("c", "x", 1, 11, 12),
    ]
    assert verdict(history) is True
    # the same, but the last read says 2 after a read concurrent with nothing said 1
    # and both writes had completed: no order explains it
    history[-1] = get("c", "x", 2, 11, 12)
    history.append(get("d", "x", 1, 13, 14))
    assert verdict(history) is False


def test_new_then_old_reads_are_caught() -> None:
    history = [
        put("a", "x", 1, 0, 10),  # still in flight during both reads
        get("b", "x", 1, 1, 2),
        get("c", "x", None, 3, 4),  # after a read that saw the write: too old
    ]
    assert verdict(history) is False
    history[2] = get("c", "x", None, 1.5, 4)  # overlaps the first read: fine
    assert verdict(history) is True


def test_indeterminate_ops_may_take_effect_later_or_never() -> None:
    # a write that timed out took effect long after other writes completed
    later = [
        put("a", "x", "lost?", 0, None),
        put("b", "x", "b", 1, 2),
        get("c", "x", "b", 3, 4),
        get("c", "x", "lost?", 5, 6),
    ]
    assert verdict(later) is True
    # ... or never
    never = [put("a", "x", "lost?", 0, None), get("c", "x", None, 5, 6)]
    assert verdict(never) is True
    # but once seen it stays: it cannot be undone
    undone = [*later, get("c", "x", "b", 7, 8)]
    assert verdict(undone) is False
    # nor take effect twice: seen, replaced, seen again
    twice = [
        put("a", "x", "t", 0, None),
        get("b", "x", "t", 1, 2),
        put("c", "x", "u", 3, 4),
        get("b", "x", "u", 5, 6),
        get("b", "x", "t", 7, 8),
    ]
    result = check(twice)
    assert result.linearizable is False
    assert "took effect twice" in result.explain()
    assert result.failures[0].needed == [twice[1], twice[3], twice[4]]
    # a read cannot see it before it was invoked
    early = [get("c", "x", "lost?", 0, 1), put("a", "x", "lost?", 2, None)]
    assert verdict(early) is False
    # an indeterminate compare-and-set: applied or not
    for seen in ("1", "2"):
        history = [
            put("a", "x", "1", 0, 1),
            cas("b", "x", "1", "2", None, 2, None),
            get("c", "x", seen, 3, 4),
        ]
        assert verdict(history) is True
    # an indeterminate read tells nothing
    assert verdict([put("a", "x", 1, 0, 1), get("b", "x", "junk", 2, None)]) is True


def test_keys_are_checked_each_on_its_own() -> None:
    history = [
        put("a", "x", 1, 0, 1),
        put("a", "y", 1, 0, 1),
        put("b", "y", 2, 2, 3),
        get("c", "x", 1, 4, 5),
        get("c", "y", 1, 4, 5),  # stale on y only
    ]
    result = check(history)
    assert [failure.key for failure in result.failures] == ["y"]
    assert result.keys == 2
    assert result.ops == 5


def test_the_window_is_small_in_a_long_history() -> None:
    history = random_history(random.Random(7), 600, keys=1)
    reads = [i for i, op in enumerate(history) if op.kind == "get" and op.completed]
    i = reads[len(reads) // 2]
    op = history[i]
    history[i] = get(op.client, op.key, "ghost", op.call, op.ret)
    [failure] = check(history).failures
    assert failure.needed == [history[i]]
    assert len(failure.window) < 15  # the ghost read and what overlaps it


def test_a_search_out_of_budget_says_unknown() -> None:
    # twelve writes all overlapping and reads that fit only at the very end: many orders
    history = [put(c, "x", c, 0, 10) for c in range(12)]
    history += [get("r", "x", 11, 11, 12), get("r", "x", 3, 13, 14)]
    result = check(history, budget=50)
    assert result.linearizable is None
    assert result.unknown == ["x"]
    assert "ran out of budget" in result.explain()
    assert check(history).linearizable is False


def test_thousands_of_ops_check_fast() -> None:
    history = random_history(random.Random(1), 5000, keys=1, indeterminate=0.02)
    began = time.perf_counter()
    result = check(history)
    took = time.perf_counter() - began
    print(f"\n5000 ops on one key: {took * 1000:.0f} ms, {result.steps} steps")
    assert result.ok
    assert took < 10  # well under a second alone; a busy machine is slower


# --------------------------------------------------------------------------- monotonic reads


def test_monotonic_reads_per_client() -> None:
    history = [
        get("a", "x", 1, 0, 1, position=100, consistency="follower"),
        get("a", "y", 1, 2, 3, position=160, consistency="follower"),
        get("a", "x", 1, 4, 5, position=160, consistency="follower"),
        get("b", "x", 0, 6, 7, position=50, consistency="follower"),  # another client
        get("a", "x", 0, 2.5, 3.5, position=120, consistency="follower"),  # overlaps
    ]
    assert check_monotonic_reads(history) == []
    back = get("a", "x", 1, 8, 9, position=120, consistency="follower")
    [stale] = check_monotonic_reads([*history, back])
    assert stale.later is back
    assert stale.earlier.position == 160
    assert "client a read position 120 after it had read position 160" in stale.explain()
    # only the level asked for
    assert check_monotonic_reads([*history, back], consistency="linearizable") == []
    # reads that never completed, or without a position, are skipped
    assert check_monotonic_reads([*history, get("a", "x", 1, 8, None, position=1)]) == []


def test_follower_reads_are_not_held_to_linearizability_but_to_values_written() -> None:
    """A follower read may answer a state before a write another client completed (the
    write has not reached that member yet): not a failure of ``check``, which leaves
    follower reads out; a value nobody wrote by then is ``check_follower_reads``'."""
    history = [
        put("w", "k", "1", 0, 1),
        put("w", "k", "2", 2, 3),
        get("r", "k", "1", 4, 5, position=10, consistency="follower"),  # behind: allowed
        get("r", "k", None, 4.5, 5.5, position=1, consistency="follower"),  # before both
    ]
    assert check(history).ok
    assert check_follower_reads(history) == []
    # the same stale read, asked as linearizable, fails
    assert verdict([*history[:2], get("r", "k", "1", 4, 5)]) is False
    made_up = get("r", "k", "3", 6, 7, consistency="follower")
    early = get("r", "k", "4", 6, 7, consistency="follower")  # written only after it
    later = put("w", "k", "4", 8, 9)
    assert check_follower_reads([*history, made_up, early, later]) == [made_up, early]
    # a cas's new value counts as written; a read that never completed is not checked
    swapped = cas("w", "k", "2", "5", True, 10, 11)
    assert (
        check_follower_reads(
            [*history, swapped, get("r", "k", "5", 10.5, 12, consistency="follower")]
        )
        == []
    )
    assert check_follower_reads([get("r", "k", "9", 0, None, consistency="follower")]) == []
    failed = cas("w", "k", "1", "6", False, 10, 11)  # a failed cas wrote nothing
    six = get("r", "k", "6", 12, 13, consistency="follower")
    assert check_follower_reads([*history, failed, six]) == [six]


# --------------------------------------------------------------------------- properties


def random_history(
    rnd: random.Random,
    n: int,
    *,
    keys: int = 2,
    span: float = 3.0,
    indeterminate: float = 0.0,
    clients: int = 5,
) -> list[Op]:
    """A history of a real sequential execution: op ``i`` takes effect at time ``i``,
    and is given an interval of up to ``span`` on each side of it; an indeterminate op
    (never completed) took effect there, or never."""
    state: dict[str, Any] = {}
    history: list[Op] = []
    for i in range(n):
        key = f"k{rnd.randrange(keys)}"
        call, ret = i - rnd.uniform(0, span), i + rnd.uniform(0, span)
        client = f"c{rnd.randrange(clients)}"
        kind = rnd.choice(("put", "get", "get", "cas", "delete"))
        never = rnd.random() < indeterminate
        applies = not (never and rnd.random() < 0.5)
        done = None if never else ret
        current = state.get(key)
        if kind == "put":
            if applies:
                state[key] = f"v{i}"
            history.append(put(client, key, f"v{i}", call, done))
        elif kind == "get":
            history.append(get(client, key, current, call, done))
        elif kind == "delete":
            if applies:
                state.pop(key, None)
            history.append(delete(client, key, current is not None, call, done))
        else:
            old = current if rnd.random() < 0.5 else f"v{rnd.randrange(i + 1)}"
            if old == current and applies:
                state[key] = f"v{i}"
            history.append(cas(client, key, old, f"v{i}", old == current, call, done))
    return history


histories = st.builds(
    random_history,
    st.integers(0, 2**32).map(random.Random),  # a realistic history, not a worst case
    st.integers(1, 300),
    keys=st.integers(1, 3),
    span=st.floats(0.0, 4.0),
    indeterminate=st.sampled_from([0.0, 0.05, 0.2]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories)
def test_a_real_execution_is_always_linearizable(history: list[Op]) -> None:
    result = check(history)
    assert result.ok, result.explain()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories, st.data())
def test_a_read_of_a_value_never_written_is_always_caught(
    history: list[Op], data: st.DataObject
) -> None:
    reads = [i for i, op in enumerate(history) if op.kind == "get" and op.completed]
    if not reads:
        return
    i = data.draw(st.sampled_from(reads))
    op = history[i]
    history[i] = get(op.client, op.key, "never-written", op.call, op.ret)
    result = check(history)
    assert result.linearizable is False
    [failure] = result.failures
    assert failure.key == op.key
    assert history[i] in failure.needed  # the window names the bad read


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories, st.data())
def test_an_injected_stale_read_is_always_caught(history: list[Op], data: st.DataObject) -> None:
    """A completed read made to answer a value that a completed write had already
    replaced (both writes acknowledged before the read began)."""
    candidates = []
    for i, op in enumerate(history):
        if op.kind != "get" or not op.completed:
            continue
        writes = [
            w
            for w in history
            if w.key == op.key and w.kind == "put" and w.ret is not None and w.ret < op.call
        ]
        writes.sort(key=lambda w: w.ret or 0.0)
        # an older write that a later write (invoked after it completed) overwrote,
        # with no write of the key in flight or unfinished around them
        for older, newer in itertools.pairwise(writes):
            if newer.call > (older.ret or 0.0) and older.args[0] != op.result:
                candidates.append((i, older.args[0]))
    if not candidates:
        return
    i, stale_value = data.draw(st.sampled_from(candidates))
    op = history[i]
    history[i] = get(op.client, op.key, stale_value, op.call, op.ret)
    assert verdict(history) is False
