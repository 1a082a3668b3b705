"""The leader cut off by a real partition, in network namespaces (issue 44, items 1 and 6).

Three ``python -m cluster.node`` members, each in a network namespace of its own, and the
clients (``netns_client.py``) in another, on a bridge (:mod:`netns`).  Under writes from
four sessions the leader is isolated for 7 s, and (another run) cut off from the other
members only for 5 s (packets dropped, nothing reset), then healed.  A new leader must
have been elected meanwhile, no acknowledged write may be lost, the old leader must have
caught up with the new leader's commit position (as it was at the heal) within
:data:`BOUND`, and the history of three more sessions writing and reading (queries of
both levels) a few shared keys must be linearizable (``tests/lincheck.py``; follower
reads: values written by then).

Skipped, with the reason, where namespaces cannot be made (not root, no ``ip``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netns import HEARTBEAT_TIMEOUT, NODE_ARGS, Lab, lab, unavailable

from cluster.local import LocalCluster, free_ports
from tests.lincheck import Op, check, check_follower_reads

KV = "cluster.examples.kv:KeyValueService"
CUTS = [5.0, 7.0]
"""5 s, as in issue 44 (the suite runs it cut off from the members only: cut off from
everyone, it passes with links left to the kernel too, see :data:`BOUND`); 7 s heals
just after the kernel's fifth retransmission (6.2 s after the cut: 0.2, 0.6, 1.4, 3.0,
6.2 s), where a link left to the kernel waits longest (its next try is at 12.6 s)."""
BOUND = 2 * HEARTBEAT_TIMEOUT
"""Seconds from the heal to the old leader's commit position at the new leader's: two
heartbeat timeouts.  Its links were found silent during the cut (after 1 s) and closed;
after the heal a redial is through at its next SYN (a dial that timed out is tried again
at once; a SYN dropped by the cut is sent again a second later) or its back-off (at most
0.5 s); then the new leader resends from where the old one's log agrees.  Measured with
nft: 0.22-1.04 s after a 5 s cut, 0.34 s after 7 s; before links noticed silence,
1.59-1.73 s and 6.14 s (with the bridge port set down: 0.25-0.74 s, and 1.56-1.74 s
before, after 5 s).  So the 5 s cut passes with the old code too; the 7 s one does not."""
HELPER = Path(__file__).with_name("netns_client.py")


class NamespacedCluster(LocalCluster):
    def __init__(self, directory: Path, the_lab: Lab) -> None:
        ports = free_ports(3)
        members = ",".join(
            f"{i}={the_lab.address(i)}:{ports[0]}:{ports[1]}:{ports[2]}" for i in range(3)
        )
        super().__init__(3, KV, directory, extra_args=NODE_ARGS, members=members)
        self.lab = the_lab

    def command(self, member_id: int) -> list[str]:
        return self.lab.command(self.lab.members[member_id], super().command(member_id))


def lines(directory: Path) -> list[dict[str, Any]]:
    path = directory / "members.jsonl"
    if not path.exists():
        return []
    found = []
    for text in path.read_text().splitlines():
        try:
            found.append(json.loads(text))
        except ValueError:  # a line being written
            pass
    return found


def wait_until(what: str, limit: float, check: Any, helper: subprocess.Popen[bytes]) -> Any:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        if helper.poll() is not None:
            raise AssertionError(f"the client helper exited ({helper.returncode}) waiting {what}")
        time.sleep(0.1)
    raise AssertionError(f"timed out after {limit}s waiting for {what}")


@pytest.fixture
def namespaces() -> Iterator[Lab]:
    why = unavailable()
    if why is not None:
        pytest.skip(f"no network namespaces here: {why}")
    with lab(3) as made:
        yield made


@pytest.mark.slow
@pytest.mark.parametrize(
    ("cut", "from_clients"),
    [(CUTS[1], True), (CUTS[0], False)],
    ids=["7s", "5s-members-only"],
)
def test_the_leader_cut_off_in_namespaces(
    namespaces: Lab, tmp_path: Path, cut: float, from_clients: bool
) -> None:
    """``from_clients`` False: the leader is cut off from the other members only, so the
    sessions connected to it keep asking it (writes and queries) while the others elect a
    new leader: it must answer no query from its old state."""
    cluster = NamespacedCluster(tmp_path, namespaces)
    work = tmp_path / "clients"
    work.mkdir()
    helper: subprocess.Popen[bytes] | None = None
    try:
        for member_id in range(3):
            cluster.start(member_id)
        with open(work / "helper.log", "wb") as log:
            helper = subprocess.Popen(
                namespaces.command(
                    namespaces.clients, [sys.executable, str(HELPER), cluster.members, str(work)]
                ),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        acked = work / "acked"

        def writes() -> int:
            return int(acked.read_text() or 0) if acked.exists() else 0

        def leader() -> dict[str, Any] | None:
            recent = [x for x in lines(work)[-30:] if x.get("role") == "LEADER"]
            return recent[-1] if recent and writes() > 100 else None

        old = wait_until("a leader and writes", 90, leader, helper)
        how = namespaces.isolate(old["m"]) if from_clients else namespaces.split(old["m"])
        cut_at = time.time()
        before = writes()
        time.sleep(cut)
        if from_clients:
            namespaces.heal(old["m"])
        else:
            namespaces.unsplit(old["m"])
        healed = time.time()

        def new_leader() -> dict[str, Any] | None:
            elected = [
                x
                for x in lines(work)
                if x.get("role") == "LEADER" and x["m"] != old["m"] and x["term"] > old["term"]
            ]
            return elected[0] if elected else None

        new = wait_until("a new leader", 30, new_leader, helper)
        assert new["t"] < healed, "a new leader was elected during the cut"

        def target() -> int | None:
            after = [x for x in lines(work) if x["t"] >= healed and x["m"] == new["m"]]
            return after[0]["commit"] if after and "commit" in after[0] else None

        position = wait_until("the new leader's commit position", 30, target, helper)

        def caught_up() -> float | None:
            for x in lines(work):
                if x["t"] >= healed and x["m"] == old["m"] and x.get("commit", -1) >= position:
                    return float(x["t"])
            return None

        back = wait_until("the old leader to catch up", 60, caught_up, helper) - healed
        assert writes() > before, "writes went on during the cut"
        (work / "stop").touch()
        summary_file = work / "summary.json"
        wait_until("the read-back", 120, summary_file.exists, helper)
        summary = json.loads(summary_file.read_text())
        print(
            f"\nleader {old['m']} cut off for {cut:g} s ({how}): member {new['m']} elected "
            f"{new['t'] - cut_at:.2f} s after the cut; the old leader back in step {back:.2f} s "
            f"after the heal; {summary['acked']} writes acknowledged, "
            f"{len(summary['lost'])} lost"
        )
        assert summary["lost"] == []
        assert back <= BOUND, back
        history = [
            Op(
                op["client"],
                op["kind"],
                op["key"],
                tuple(op["args"]),
                op["call"],
                op.get("ret"),
                op.get("result"),
                consistency=op.get("consistency", "linearizable"),
            )
            for op in json.loads((work / "history.json").read_text())
            if op["kind"] == "put" or "ret" in op  # a read that never completed tells nothing
        ]
        result = check(history)
        reads = sum(op.kind == "get" and op.ret is not None for op in history)
        print(f"{len(history)} ops on the shared keys ({reads} reads), linearizable: {result.ok}")
        assert result.ok, result.explain()
        assert check_follower_reads(history) == []
        assert reads > 0
    finally:
        if helper is not None and helper.poll() is None:
            helper.kill()
            helper.wait(10)
        cluster.stop_all()
