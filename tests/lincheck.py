"""The project's linearizability checker: histories of a key-value map, checked per key.

A history is a list of :class:`Op`: who asked (``client``), what (``kind``: ``put``,
``get``, ``delete``, ``cas``), on which ``key``, with which ``args``, when it was invoked
(``call``) and when it completed (``ret``), and what it answered (``result``).  An op
whose ``ret`` is None never completed: it raised or timed out, so it may or may not have
taken effect, at any moment after its invocation (Jepsen's ``info``).  Leave out ops that
certainly did not take effect (Jepsen's ``fail``).  Times are any monotonic clock, the
same for every client (``time.monotonic()`` of the process that ran the clients, or
virtual time in the simulator).

The model is a map whose keys are independent registers (absent: ``None``)::

    put(k, v)            -> None       the key holds v
    get(k)               -> v | None   what the key holds
    delete(k)            -> existed    the key is absent; whether it was present
    cas(k, old, new)     -> ok         if the key holds old (None: absent): it holds new

Linearizability is compositional, so :func:`check` checks each key on its own, with
Wing and Gong's search as Lowe improved it and Porcupine implements it: take the
earliest pending invocation whose step is legal, memoize (the set of ops linearized, the
model's state) so that no configuration is explored twice, and backtrack when a
completion is reached whose invocation has not been linearized.  The state is the set
of values the key may hold (Porcupine's power-set model), so that "relaxed" ops can be
checked loosely: their result not checked, their effect optional.  An op that never
completed is not a branch of the search (it would be concurrent with everything after
it): it is a source whose effect may happen at any moment after its invocation, and a
value written only by such an op must not be seen, replaced and seen again.  A search
that takes more than ``budget`` steps on a key gives "unknown" for it instead of going
on.

For a key that is not linearizable, :func:`check` finds the smallest failing window: a
stretch of time whose completed ops cannot be ordered to explain their results, whatever
the key held before it (any value written earlier), with the ops that overlap its edges
relaxed; then it relaxes every op inside it that is not needed for the failure.
:meth:`CheckResult.explain` prints it, with times relative to the first invocation.

:func:`check_monotonic_reads` checks that a client's successive reads never reflect an
older log position (``Op.position``: the position the answer reflected), the guarantee
of ``consistency="follower"`` reads.

Plain Python, no trio: used by the unit tests, the real-process history tests and the
scripts (``from tests.lincheck import ...`` with the repository root on ``sys.path``).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

KINDS = ("put", "get", "delete", "cas")
DEFAULT_BUDGET = 2_000_000
"""Search steps per key (each one an invocation tried or a backtrack) before "unknown"."""


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of a history (see the module's notes)."""

    client: Hashable
    kind: str
    key: str
    args: tuple[Any, ...]
    call: float
    ret: float | None
    result: Any = None
    position: int | None = None
    """For reads: the log position the answer reflected (for the monotonic check)."""
    consistency: str = "linearizable"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown kind {self.kind!r}: one of {', '.join(KINDS)}")
        wanted = {"put": 1, "get": 0, "delete": 0, "cas": 2}[self.kind]
        if len(self.args) != wanted:
            raise ValueError(f"{self.kind} takes {wanted} argument(s), got {self.args!r}")
        if self.ret is not None and self.ret < self.call:
            raise ValueError(f"completed ({self.ret}) before it was invoked ({self.call})")

    @property
    def completed(self) -> bool:
        return self.ret is not None

    def describe(self) -> str:
        """``put('x', 'v1')``, ``get('x') -> 'v1'``, ``cas('x', 1, 2) -> ?``."""
        args = ", ".join(repr(a) for a in (self.key, *self.args))
        text = f"{self.kind}({args})"
        if self.kind == "put":
            return text if self.completed else f"{text} -> ?"
        result = repr(self.result) if self.completed else "?"
        text = f"{text} -> {result}"
        if self.position is not None:
            text += f" @{self.position}"
        return text


def put(client: Hashable, key: str, value: Any, call: float, ret: float | None) -> Op:
    return Op(client, "put", key, (value,), call, ret)


def get(
    client: Hashable,
    key: str,
    result: Any,
    call: float,
    ret: float | None,
    *,
    position: int | None = None,
    consistency: str = "linearizable",
) -> Op:
    return Op(client, "get", key, (), call, ret, result, position, consistency)


def delete(client: Hashable, key: str, existed: bool | None, call: float, ret: float | None) -> Op:
    return Op(client, "delete", key, (), call, ret, existed)


def cas(
    client: Hashable, key: str, old: Any, new: Any, ok: bool | None, call: float, ret: float | None
) -> Op:
    return Op(client, "cas", key, (old, new), call, ret, ok)


# --------------------------------------------------------------------------- the model

_State = frozenset[Any]
"""The values the key may hold (``None``: absent): more than one once an op whose
effect is optional (relaxed) was linearized."""


class _Other:
    """A value written before a window that none of the window's ops names: all such
    values behave alike in the window, so one stands for them all."""

    def __repr__(self) -> str:
        return "<another value written earlier>"


OTHER = _Other()


def _step(state: _State, op: Op, relaxed: bool) -> _State:
    """The states after ``op`` from ``state`` (empty: not legal there)."""
    kind = op.kind
    if relaxed:  # effect optional, result not checked
        if kind == "put":
            return state | {op.args[0]}
        if kind == "delete":
            return state | {None}
        if kind == "cas":
            return state | {op.args[1]} if op.args[0] in state else state
        return state
    if kind == "get":
        return frozenset((op.result,)) if op.result in state else frozenset()
    if kind == "put":
        return frozenset((op.args[0],))
    if kind == "delete":
        if op.result:
            return frozenset((None,)) if any(v is not None for v in state) else frozenset()
        return frozenset((None,)) if None in state else frozenset()
    old, new = op.args
    if op.result:
        return frozenset((new,)) if old in state else frozenset()
    return frozenset(v for v in state if v != old)


# --------------------------------------------------------------------------- the search


class BudgetExceeded(Exception):
    pass


def _linearizable(
    ops: Sequence[Op], relaxed: Sequence[bool], initial: _State, budget: int
) -> tuple[bool, int, float]:
    """Wing & Gong / Lowe with Porcupine's memo: whether ``ops`` (the ``relaxed`` ones
    checked loosely) have a linearization from ``initial``, the steps it took, and the
    frontier: the latest completion the search was stopped at (every op completed before
    it had been linearized).  Raises :class:`BudgetExceeded` past ``budget`` steps.

    Ops that never completed are not searched over: each one would be concurrent with
    everything after its invocation and double the configurations for the rest of the
    history (a history with a stale read and a dozen of them took minutes).  Each is a
    source instead: from its invocation on, its effect may happen at any moment, as
    often as needed (:func:`_closure`).  That is looser than once: a value written only
    by such an op and seen, replaced and seen again is caught by :func:`_resurrected`."""
    sources = sorted((op for op in ops if op.ret is None), key=lambda op: op.call)
    source_calls = [op.call for op in sources]
    pairs = [(op, r) for op, r in zip(ops, relaxed, strict=True) if op.ret is not None]
    ops = [op for op, _ in pairs]
    relaxed = [r for _, r in pairs]
    rets = [op.ret or 0.0 for op in ops]
    n = len(ops)
    # entries: 0..n-1 the invocations, n..2n-1 the completions; a doubly linked list in
    # time order (invocations before completions at the same time), 2n the head
    times = []
    for i, op in enumerate(ops):
        times.append((op.call, 0, i))
        times.append((rets[i], 1, n + i))
    times.sort()
    head = 2 * n
    nxt = [-1] * (2 * n + 1)
    prv = [-1] * (2 * n + 1)
    last = head
    for _, _, entry in times:
        nxt[last] = entry
        prv[entry] = last
        last = entry
    nxt[last] = -1

    def lift(call: int) -> None:
        for entry in (call, call + n):
            p, q = prv[entry], nxt[entry]
            nxt[p] = q
            if q != -1:
                prv[q] = p

    def unlift(call: int) -> None:
        for entry in (call + n, call):
            p, q = prv[entry], nxt[entry]
            nxt[p] = entry
            if q != -1:
                prv[q] = entry

    closures: dict[tuple[_State, int], _State] = {}

    def closed(state: _State) -> _State:
        """``state`` with the effects of every source invoked before the first
        completion still in the list (what the next op linearized may see)."""
        if not sources:
            return state
        entry = nxt[head]
        while entry != -1 and entry < n:
            entry = nxt[entry]
        until = math.inf if entry == -1 else rets[entry - n]
        count = bisect.bisect_right(source_calls, until)
        found = closures.get((state, count))
        if found is None:
            found = closures[(state, count)] = _closure(state, sources[:count])
        return found

    state = initial
    seeing = closed(state)
    linearized = 0
    seen: set[tuple[int, _State]] = set()
    stack: list[tuple[int, _State]] = []
    steps = 0
    frontier = -math.inf
    entry = nxt[head]
    while entry != -1:
        steps += 1
        if steps > budget:
            raise BudgetExceeded
        if entry < n:  # an invocation: try to linearize it here
            after = _step(seeing, ops[entry], relaxed[entry])
            if after:
                bits = linearized | (1 << entry)
                if (bits, after) not in seen:
                    seen.add((bits, after))
                    stack.append((entry, state))
                    state, linearized = after, bits
                    lift(entry)
                    seeing = closed(state)
                    entry = nxt[head]
                    continue
            entry = nxt[entry]
        else:
            frontier = max(frontier, rets[entry - n])
            if not stack:
                return False, steps, frontier
            call, state = stack.pop()
            linearized &= ~(1 << call)
            unlift(call)
            seeing = closed(state)
            entry = nxt[call]
    return True, steps, frontier


def _closure(state: _State, sources: Sequence[Op]) -> _State:
    """``state`` with every effect the ``sources`` (never-completed ops) may have had,
    each as often as it applies (a compare-and-set may apply after another source)."""
    while True:
        grown = state
        for op in sources:
            grown = _step(grown, op, relaxed=True)
        if grown == state:
            return state
        state = grown


# --------------------------------------------------------------------------- results


@dataclass(slots=True)
class KeyFailure:
    """A key whose history is not linearizable, and the window that shows it."""

    key: str
    window: list[Op]
    """Every op in the failing window, by invocation time."""
    needed: list[Op]
    """Those of ``window`` checked exactly: no order of them explains their results
    (the others are relaxed: their effect optional, their result not checked)."""
    from_start: bool
    """The window begins with the history (the key was absent before it); else any
    value written before the window may have been there."""
    before: list[Any] = field(default_factory=list)
    """The values the key may have held before the window (``from_start``: [None])."""
    reason: str = ""
    """Why, where it is not that no order explains the results (:func:`_resurrected`)."""


@dataclass(slots=True)
class CheckResult:
    keys: int = 0
    ops: int = 0
    failures: list[KeyFailure] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    """Keys whose search ran out of budget."""
    steps: int = 0
    origin: float = 0.0
    """The first invocation: :meth:`explain` prints times relative to it."""

    @property
    def ok(self) -> bool:
        return not self.failures and not self.unknown

    @property
    def linearizable(self) -> bool | None:
        """True, False (a key failed), or None (no key failed, some ran out of budget)."""
        if self.failures:
            return False
        return None if self.unknown else True

    def explain(self) -> str:
        if self.ok:
            return f"linearizable: {self.ops} ops on {self.keys} keys"
        lines = []
        for failure in self.failures:
            lines.append(explain_failure(failure, self.origin))
        if self.unknown:
            lines.append(
                "unknown (the search ran out of budget) for key(s) "
                + ", ".join(map(repr, self.unknown))
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.explain()


def format_ops(ops: Iterable[Op], origin: float = 0.0, marked: Iterable[Op] = ()) -> str:
    """The ops as a table: client, invoked, completed (s after ``origin``), the op;
    ``*`` before each of ``marked``."""
    mark = {id(op) for op in marked}
    rows = ["  client          invoked  completed  op"]
    for op in ops:
        done = "never" if op.ret is None else f"{op.ret - origin:.4f}"
        star = "*" if id(op) in mark else " "
        rows.append(
            f"{star} {op.client!s:<14} {op.call - origin:>8.4f} {done:>10}  {op.describe()}"
        )
    return "\n".join(rows)


def explain_failure(failure: KeyFailure, origin: float = 0.0) -> str:
    if failure.reason:
        return f"key {failure.key!r} is not linearizable: {failure.reason}:\n" + format_ops(
            failure.window, origin, failure.needed
        )
    if failure.from_start:
        before = "from the start (the key absent)"
    else:
        shown = ", ".join(repr(v) for v in failure.before[:8])
        more = f" and {len(failure.before) - 8} more" if len(failure.before) > 8 else ""
        before = f"whatever the key held before it (one of {shown}{more})"
    return (
        f"key {failure.key!r} is not linearizable: no order of the {len(failure.needed)} "
        f"ops marked * (each at a moment between its invocation and its completion) "
        f"explains their results, {before}; the window's other ops may or may not have "
        f"taken effect:\n" + format_ops(failure.window, origin, failure.needed)
    )


# --------------------------------------------------------------------------- checking


def _prepared(ops: Iterable[Op]) -> list[Op]:
    """The ops that can matter, by invocation.  A read that never completed tells
    nothing.  Nor does a write that never completed whose value no op names (no read
    answered it, no compare-and-set expects it), where no completed op could be helped
    by the key holding some value nobody names (a compare-and-set answering False, a
    delete answering True): dropping it is exact, and keeps its value out of the states
    searched for the rest of the history (its effect may happen at any moment)."""
    ops = list(ops)
    named = {op.result for op in ops if op.kind == "get" and op.completed}
    named.update(op.args[0] for op in ops if op.kind == "cas")
    anything_helps = any(
        op.completed and bool(op.result) == (op.kind == "delete")
        for op in ops
        if op.kind in ("cas", "delete")
    )

    def matters(op: Op) -> bool:
        if op.completed:
            return True
        if op.kind == "get":
            return False
        if op.kind == "delete" or anything_helps:
            return True
        return _written(op) in named

    return sorted(
        filter(matters, ops), key=lambda op: (op.call, math.inf if op.ret is None else op.ret)
    )


def check_key(ops: Sequence[Op], budget: int = DEFAULT_BUDGET) -> tuple[bool, int, float]:
    """Whether one key's ops are linearizable from an absent key, the steps taken, and
    the latest completion the search reached.  Raises :class:`BudgetExceeded`."""
    ops = _prepared(ops)
    relaxed = [not op.completed for op in ops]
    return _linearizable(ops, relaxed, frozenset((None,)), budget)


def check(history: Iterable[Op], budget: int = DEFAULT_BUDGET) -> CheckResult:
    """Check every key's ops; each key not linearizable comes with its smallest failing
    window (:class:`KeyFailure`).  Reads of a weaker consistency than linearizable
    (``consistency="follower"``: any member answers from what it has applied) are left
    out: a follower a write has not reached yet may rightly answer the value before it.
    They have checks of their own: :func:`check_monotonic_reads`,
    :func:`check_follower_reads`."""
    by_key: dict[str, list[Op]] = defaultdict(list)
    for op in history:
        if op.consistency == "linearizable":
            by_key[op.key].append(op)
    result = CheckResult(keys=len(by_key), ops=sum(map(len, by_key.values())))
    calls = [op.call for ops in by_key.values() for op in ops]
    result.origin = min(calls, default=0.0)
    for key in sorted(by_key, key=str):
        try:
            ok, steps, frontier = check_key(by_key[key], budget)
        except BudgetExceeded:
            result.unknown.append(key)
            result.steps += budget
            continue
        result.steps += steps
        if not ok:
            result.failures.append(smallest_window(key, by_key[key], budget, frontier))
        else:
            twice = _resurrected(key, _prepared(by_key[key]))
            if twice is not None:
                result.failures.append(twice)
    return result


def _resurrected(key: str, ops: Sequence[Op]) -> KeyFailure | None:
    """A value written by one op only, which never completed, read, then replaced (a
    read of another value invoked after that read completed), then read again (invoked
    after that one completed): the write took effect twice.  The search lets a
    never-completed op take effect as often as it likes; this catches what that lets
    through for the reads of its value."""
    writers: dict[Any, list[Op]] = defaultdict(list)
    for op in ops:
        if op.kind in ("put", "cas"):
            writers[_written(op)].append(op)
    reads = [op for op in ops if op.kind == "get" and op.completed]
    for value, [*wrote] in writers.items():
        if value is None or len(wrote) != 1 or wrote[0].completed:
            continue
        seen = [op for op in reads if op.result == value]
        if len(seen) < 2:
            continue
        first = min(seen, key=lambda op: op.ret or 0.0)
        again = max(seen, key=lambda op: op.call)
        for other in reads:
            if (
                other.result != value
                and other.call > (first.ret or 0.0)
                and (other.ret or 0.0) < again.call
            ):
                window = sorted([wrote[0], first, other, again], key=lambda op: op.call)
                return KeyFailure(
                    key,
                    window,
                    [first, other, again],
                    False,
                    reason=(
                        f"{value!r}, written only by an op that never completed, was read, "
                        f"then replaced, then read again: that write took effect twice"
                    ),
                )
    return None


# --------------------------------------------------------------------------- windows


def _written(op: Op) -> Any:
    if op.kind == "put":
        return op.args[0]
    if op.kind == "cas":
        return op.args[1]
    return None  # a delete writes "absent"; a get writes nothing (None is always there)


class _Windows:
    """Windows of one key's history: ``fails(lo, hi)`` checks the completed ops
    ``done[lo:hi]`` (by completion time) with every op overlapping them relaxed."""

    def __init__(self, ops: list[Op], budget: int) -> None:
        self.ops = ops  # prepared: by invocation
        self.done = sorted((op for op in ops if op.completed), key=lambda op: op.ret or 0.0)
        self.budget = budget

    def members(self, lo: int, hi: int) -> tuple[list[Op], list[bool], float]:
        """The window's ops (by invocation), which are relaxed, and the latest completion
        among them: the completed ops ``done[lo:hi]``, checked exactly, and every other
        op that overlaps one of them in time, relaxed.  Every op left out is then wholly
        before or wholly after all of the exact ones."""
        inside = self.done[lo:hi]
        exact = {id(op) for op in inside}
        rets = [op.ret or 0.0 for op in inside]  # ascending
        # first_call[i]: the earliest invocation among inside[i:]
        first_call = [op.call for op in inside]
        for i in range(len(inside) - 2, -1, -1):
            first_call[i] = min(first_call[i], first_call[i + 1])
        end = rets[-1]
        chosen: list[Op] = []
        relaxed: list[bool] = []
        for op in self.ops:
            if op.call > end:
                break
            if id(op) not in exact:
                # it overlaps one of them: one that completed at or after its invocation
                # was invoked at or before its completion
                i = bisect.bisect_left(rets, op.call)
                ret = math.inf if op.ret is None else op.ret
                if i == len(inside) or first_call[i] > ret:
                    continue
            chosen.append(op)
            relaxed.append(id(op) not in exact)
        return chosen, relaxed, end

    def initial(self, lo: int, window: Sequence[Op], end: float) -> tuple[_State, list[Any]]:
        """The states the key may be in before the window, and the values they stand
        for.  A window from the first completion: absent (no op is left out before it).
        Else the key holds what some op before the first exact op's moment wrote:
        anything written by an op invoked by ``end`` (the values no op of the window
        names behave alike in it: one stands for them all)."""
        if lo == 0:
            return frozenset((None,)), [None]
        earlier: set[Any] = {None}
        for op in self.ops:
            if op.call > end:
                break
            earlier.add(_written(op))
        named: set[Any] = set()
        for op in window:
            if op.kind == "get" and op.completed:
                named.add(op.result)
            elif op.kind == "cas":
                named.add(op.args[0])
        state: set[Any] = {v for v in earlier if v in named or v is None}
        if any(v not in named and v is not None for v in earlier):
            state.add(OTHER)
        return frozenset(state), sorted(earlier, key=repr)

    def fails(self, lo: int, hi: int, exact: set[int] | None = None) -> bool:
        ops, relaxed, end = self.members(lo, hi)
        if exact is not None:
            relaxed = [r or id(op) not in exact for op, r in zip(ops, relaxed, strict=True)]
        state, _ = self.initial(lo, ops, end)
        try:
            ok, _, _ = _linearizable(ops, relaxed, state, self.budget)
        except BudgetExceeded:
            return False
        return not ok


def smallest_window(
    key: str, ops: Sequence[Op], budget: int = DEFAULT_BUDGET, frontier: float | None = None
) -> KeyFailure:
    """The smallest failing window of one key's ops (not linearizable; see the module's
    notes): the fewest completions from the first that fail (``frontier``, the latest
    completion the whole search reached, says where to look), then the latest start
    that still fails, then every op not needed relaxed.  (More ops in a window, more
    constraints: the searches below take failing as monotonic in the window's size.)"""
    windows = _Windows(_prepared(ops), budget)
    rets = [op.ret or 0.0 for op in windows.done]
    n = len(rets)
    hi = n
    guess = 0 if frontier is None else bisect.bisect_right(rets, frontier)
    if 0 < guess < n and windows.fails(0, guess):
        hi = guess
    elif guess < n:  # binary search: a failing window from the start costs a whole search
        low, high = 1, n
        while low < high:
            mid = (low + high) // 2
            if windows.fails(0, mid):
                high = mid
            else:
                low = mid + 1
        if windows.fails(0, low):
            hi = low
    # the latest start that still fails: small windows first (a failing search is
    # exhaustive, a small one cheap), doubling, then binary search
    size = 1
    while size < hi and not windows.fails(hi - size, hi):
        size *= 2
    if size >= hi:
        failing, passing = 0, hi - size // 2
    else:
        failing, passing = hi - size, hi - size // 2
    while passing - failing > 1:
        mid = (failing + passing) // 2
        if windows.fails(mid, hi):
            failing = mid
        else:
            passing = mid
    lo = failing
    window, relaxed, end = windows.members(lo, hi)
    exact = {id(op) for op, r in zip(window, relaxed, strict=True) if not r}
    if windows.fails(lo, hi, exact):  # relax every op not needed
        for op in window:
            if id(op) in exact:
                exact.discard(id(op))
                if not windows.fails(lo, hi, exact):
                    exact.add(id(op))
    _, before = windows.initial(lo, window, end)
    needed = [op for op in window if id(op) in exact]
    return KeyFailure(key, window, needed, lo == 0, before)


# --------------------------------------------------------------------------- monotonic reads


@dataclass(frozen=True, slots=True)
class StaleRead:
    """A read that reflected an older log position than one its client saw earlier."""

    earlier: Op
    later: Op

    def explain(self, origin: float = 0.0) -> str:
        return (
            f"client {self.later.client} read position {self.later.position} after it had "
            f"read position {self.earlier.position}:\n"
            + format_ops([self.earlier, self.later], origin)
        )


def check_monotonic_reads(history: Iterable[Op], consistency: str | None = None) -> list[StaleRead]:
    """Reads (of ``consistency``, or all) that went back in time for their client: a
    read invoked after another read of the same client completed, whose ``position``
    is lower.  Reads without a position or that never completed are skipped."""
    by_client: dict[Hashable, list[Op]] = defaultdict(list)
    for op in history:
        if (
            op.kind == "get"
            and op.completed
            and op.position is not None
            and (consistency is None or op.consistency == consistency)
        ):
            by_client[op.client].append(op)
    stale: list[StaleRead] = []
    for reads in by_client.values():
        by_ret = sorted(reads, key=lambda op: op.ret or 0.0)
        rets = [op.ret or 0.0 for op in by_ret]
        # best[i]: the read of highest position among by_ret[:i + 1]
        best: list[Op] = []
        for op in by_ret:
            best.append(
                op if not best or (op.position or 0) > (best[-1].position or 0) else best[-1]
            )
        for op in sorted(reads, key=lambda op: op.call):
            i = bisect.bisect_left(rets, op.call) - 1  # completed strictly before the call
            if i >= 0 and (best[i].position or 0) > (op.position or 0):
                stale.append(StaleRead(best[i], op))
    return stale


def check_follower_reads(history: Iterable[Op]) -> list[Op]:
    """Follower reads that answered a value no write could have given by then: not the
    key's initial absence and not the value of a put, or a cas that did not fail,
    invoked before the read completed (a made-up, corrupted or foreign value).  A
    follower read may answer any state the log went through up to its completion; how
    fresh it is, is :func:`check_monotonic_reads`'s part."""
    ops = list(history)
    written: dict[str, list[tuple[float, Any]]] = defaultdict(list)
    for op in ops:
        if op.kind == "put" or (op.kind == "cas" and op.result is not False):
            written[op.key].append((op.call, _written(op)))  # (a failed cas wrote nothing)
    wrong = []
    for op in ops:
        if op.kind != "get" or op.consistency != "follower" or op.ret is None:
            continue
        if op.result is None:
            continue
        if not any(value == op.result and call <= op.ret for call, value in written[op.key]):
            wrong.append(op)
    return wrong
