"""SVG snapshots of the console's main screen, on recorded admin data.

The data source is :class:`console_recording.RecordedSource` (a replay of ``describe``
answers recorded from a real 3-member cluster); everything else is the real console.
Update with ``pytest tests/tui --snapshot-update`` after reviewing the difference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from console_recording import RecordedSource, load_recording
from textual.pilot import Pilot

from tui.app import ClusterConsole

SIZE = (120, 40)

pytestmark = pytest.mark.usefixtures("utc")


def make_console(source: RecordedSource) -> ClusterConsole:
    return ClusterConsole(
        source,
        interval=0.02,
        round_wait=10.0,  # every member in every round, however slow the machine
        clock=source.clock,
        wall_clock=source.wall_clock,
    )


def replay_until_done(app: ClusterConsole, rounds: int) -> Callable[[Pilot[Any]], Any]:
    async def run_before(pilot: Pilot[Any]) -> None:
        for _ in range(500):
            if app.rounds >= rounds:
                break
            await pilot.pause(0.02)
        assert app.rounds == rounds
        await pilot.pause()

    return run_before


def recorded(phase: str) -> RecordedSource:
    """The recording up to the end of ``phase``: steady, suspended, resumed, failover,
    restarted, shutdown (see ``console_recording``)."""
    data = load_recording()
    rounds = data["rounds"][: data["phases"][phase]]
    return RecordedSource(data["members"], rounds, errors=data["errors"])


def test_steady_cluster(snap_compare: Any) -> None:
    """Leader highlighted, positions, a session timed out (dimmed), throughput, redirects."""
    source = recorded("steady")
    app = make_console(source)
    assert snap_compare(
        app, terminal_size=SIZE, run_before=replay_until_done(app, len(source.rounds))
    )


def test_suspended(snap_compare: Any) -> None:
    """The leader SUSPENDED: the banner says so in yellow, not a green LEADER."""
    source = recorded("suspended")
    app = make_console(source)
    assert snap_compare(
        app, terminal_size=SIZE, run_before=replay_until_done(app, len(source.rounds))
    )


def test_leader_killed(snap_compare: Any) -> None:
    """The old leader DOWN, the new one highlighted, the election in the events log."""
    source = recorded("failover")
    app = make_console(source)
    assert snap_compare(
        app, terminal_size=SIZE, run_before=replay_until_done(app, len(source.rounds))
    )


def test_shutdown(snap_compare: Any) -> None:
    """``cluster-tool shutdown``: every member stopped at once, said in one line; no
    member "down", no election."""
    source = recorded("shutdown")
    app = make_console(source)
    assert snap_compare(
        app, terminal_size=SIZE, run_before=replay_until_done(app, len(source.rounds))
    )


def test_events_filtered(snap_compare: Any) -> None:
    """``f``: the events log shows warnings and errors only, and says so in its title."""
    source = recorded("restarted")
    app = make_console(source)
    wait = replay_until_done(app, len(source.rounds))

    async def run_before(pilot: Pilot[Any]) -> None:
        await wait(pilot)
        await pilot.press("f")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_unreachable_members(snap_compare: Any) -> None:
    """Nothing answers: every member DOWN with the reason, no leader, no traceback."""
    data = load_recording()
    rounds = [{str(i): "connection refused" for i in range(3)}] * 3
    source = RecordedSource(data["members"], rounds)
    app = make_console(source)
    assert snap_compare(app, terminal_size=SIZE, run_before=replay_until_done(app, 3))


def test_suspend_confirmation(snap_compare: Any) -> None:
    """``p`` asks before suspending the cluster."""
    source = recorded("steady")
    app = make_console(source)
    wait = replay_until_done(app, len(source.rounds))

    async def run_before(pilot: Pilot[Any]) -> None:
        await wait(pilot)
        await pilot.press("p")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
