"""Recorded admin data for the console's snapshot tests, and the recorder that made it.

:class:`RecordedSource` is a test double of the console's data feed
(:class:`tui.source.ClusterSource`): it answers ``describe`` and ``errors`` from a
recording, one round of polls at a time, on a clock of its own (each round is
``round_seconds`` later), so a replay renders the same screen every time.  When the
recording runs out it stops answering (the console keeps its last state), so the screen
is still when the snapshot is taken.

The recording (``recorded_cluster.json``) was made against a real 3-member cluster with
``python tests/tui/console_recording.py`` (see :func:`record`): a steady phase with a
key-value client writing and an idle session that times out; the cluster suspended (and
resumed); the leader killed and a new one elected; the killed member started again; and
``shutdown`` (what ``cluster-tool shutdown`` sends).  ``phases`` gives the number of
rounds at the end of each phase.
The bodies are stored as the JSON objects ``describe`` answered (less ``members`` and
``links``) and converted to :class:`~cluster.protocol.admin.MemberStatus` on replay.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec

from cluster.config import MemberEndpoints, parse_members
from cluster.protocol.admin import MemberStatus
from tui.source import ActionResult, SourceError

RECORDING = Path(__file__).with_name("recorded_cluster.json")
WALL_CLOCK_BASE = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC; the tests run with TZ=UTC
_DROPPED_KEYS = ("members", "links")  # not shown by the console


def load_recording() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(RECORDING.read_text())
    return data


class RecordedSource:
    """Replays ``rounds``: each a ``{member_id: describe body or error text}`` mapping."""

    def __init__(
        self,
        members: str,
        rounds: Sequence[dict[str, Any]],
        *,
        errors: Sequence[dict[str, list[dict[str, Any]]]] = (),
        round_seconds: float = 0.5,
        snapshot: ActionResult | None = None,
    ) -> None:
        self._members = parse_members(members)
        self.rounds = list(rounds)
        self.errors_by_round = list(errors)
        self.round_seconds = round_seconds
        self.index = -1
        self.snapshot_result = snapshot or ActionResult(
            "snapshot", True, "OK", "SNAPSHOT applied successfully", member_id=0
        )
        self.actions: list[tuple[int, str]] = []

    @property
    def members(self) -> Sequence[MemberEndpoints]:
        return self._members

    def clock(self) -> float:
        return max(self.index, 0) * self.round_seconds

    def wall_clock(self) -> float:
        return WALL_CLOCK_BASE + self.clock()

    async def describe(self, member_id: int) -> MemberStatus:
        if member_id == self._members[0].member_id:
            self.index += 1  # members are asked in order, the first one opens a round
        if self.index >= len(self.rounds):
            await anyio.sleep_forever()
        answer = self.rounds[self.index].get(str(member_id), "no answer")
        if isinstance(answer, str):
            await anyio.lowlevel.checkpoint()
            raise SourceError(answer)
        await anyio.lowlevel.checkpoint()
        return msgspec.convert(answer, MemberStatus)

    async def errors(self, member_id: int, limit: int) -> list[dict[str, Any]]:
        await anyio.lowlevel.checkpoint()
        if 0 <= self.index < len(self.errors_by_round):
            return list(self.errors_by_round[self.index].get(str(member_id), []))[-limit:]
        return []

    async def snapshot(self, member_id: int) -> ActionResult:
        await anyio.lowlevel.checkpoint()
        self.actions.append((member_id, "snapshot"))
        return self.snapshot_result

    async def admin_action(self, member_id: int, command: str) -> ActionResult:
        await anyio.lowlevel.checkpoint()
        self.actions.append((member_id, command))
        return ActionResult(command, True, "OK", f"{command.upper()} applied", member_id)

    async def aclose(self) -> None:
        pass


# ---------------------------------------------------------------------- the recorder


def _trim(status: MemberStatus) -> dict[str, Any]:
    body: dict[str, Any] = msgspec.to_builtins(status)
    return {k: v for k, v in body.items() if k not in _DROPPED_KEYS}


async def _record(out: Path, steady_rounds: int, failover_rounds: int) -> None:
    import tempfile

    import client
    from cluster.config import format_ingress_endpoints
    from cluster.examples.kv import KeyValueClient
    from cluster.local import LocalCluster
    from tui.source import LiveSource

    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(
            3,
            "cluster.examples.kv:KeyValueService",
            tmp,
            extra_args=["--leader-heartbeat-timeout", "1s", "--startup-canvass-timeout", "5s",
                        "--session-timeout", "2s"],
        )  # fmt: skip
        cluster.start_all()
        try:
            members = parse_members(cluster.members)
            source = LiveSource(members)
            endpoints = format_ingress_endpoints(members)
            rounds: list[dict[str, Any]] = []
            errors: list[dict[str, Any]] = []
            phases: dict[str, int] = {}

            async def poll_round() -> None:
                answers: dict[str, Any] = {}
                errs: dict[str, Any] = {}
                for m in members:
                    try:
                        answers[str(m.member_id)] = _trim(await source.describe(m.member_id))
                        errs[str(m.member_id)] = await source.errors(m.member_id, 10)
                    except SourceError as exc:
                        answers[str(m.member_id)] = str(exc)
                rounds.append(answers)
                errors.append(errs)
                await anyio.sleep(0.5)

            await anyio.sleep(3)  # elected
            async with client.connect(endpoints) as c, KeyValueClient(c) as kv:
                async with client.connect(endpoints, keepalive_interval=60):
                    async with anyio.create_task_group() as tg:

                        async def load() -> None:
                            for i in range(100_000):
                                await kv.put(f"key-{i % 50}", b"v" * (20 + i % 40))
                                await anyio.sleep(0.02)

                        tg.start_soon(load)
                        for _ in range(steady_rounds):
                            await poll_round()
                        phases["steady"] = len(rounds)

                        def leader_now() -> int:
                            return next(
                                int(k)
                                for k, v in rounds[-1].items()
                                if isinstance(v, dict) and v["role"] == "LEADER"
                            )

                        leader = leader_now()
                        await source.admin_action(leader, "suspend")
                        for _ in range(4):
                            await poll_round()
                        phases["suspended"] = len(rounds)
                        await source.admin_action(leader, "resume")
                        for _ in range(2):
                            await poll_round()
                        phases["resumed"] = len(rounds)
                        cluster.kill(leader)
                        for _ in range(failover_rounds):
                            await poll_round()
                        phases["failover"] = len(rounds)
                        tg.cancel_scope.cancel()
            cluster.start(leader)
            for _ in range(60):
                await poll_round()
                if all(isinstance(v, dict) for v in rounds[-1].values()):
                    break
            await poll_round()
            phases["restarted"] = len(rounds)
            await source.admin_action(leader_now(), "shutdown")
            for _ in range(6):
                await poll_round()
            phases["shutdown"] = len(rounds)
            await source.aclose()
        finally:
            cluster.stop_all()
    document = {"members": cluster.members, "steady_rounds": steady_rounds,
                "phases": phases, "rounds": rounds, "errors": errors}  # fmt: skip
    await anyio.Path(out).write_text(_dumps(document))


def _dumps(document: dict[str, Any]) -> str:
    """JSON with one round (or errors round) a line: readable diffs, a small file."""
    lines = ["{"]
    for key, value in document.items():
        if isinstance(value, list):
            items = ",\n  ".join(json.dumps(v, separators=(",", ":")) for v in value)
            lines.append(f' "{key}": [\n  {items}\n ],')
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)},")
    lines[-1] = lines[-1].rstrip(",")
    return "\n".join([*lines, "}"]) + "\n"


def record(steady_rounds: int = 14, failover_rounds: int = 10) -> None:
    """Record a fresh ``recorded_cluster.json`` (then re-run with ``--snapshot-update``)."""
    anyio.run(_record, RECORDING, steady_rounds, failover_rounds)


if __name__ == "__main__":
    record()
