#!/usr/bin/env python3
"""A Jepsen-style run: real members partitioned in network namespaces, under load from
several client sessions, with the history checked afterwards (issue 44, items 1 and 2).

As root (network namespaces)::

    python3 scripts/nemesis.py --duration 300 --seed 7 --out nemesis-out

What it does:

1. makes a namespace per member, one for the clients and a bridge between them
   (``tests/integration/netns.py``; nothing is added to the host's namespace, the
   addresses ``10.77.0.x`` exist only inside them); exits with 2 and the reason where
   namespaces cannot be made (not root, no ``ip``);
2. starts ``--members`` ``python -m cluster.node`` members (the register service,
   ``scripts/nemesis_service.py``), each in its namespace, and ``--clients`` client
   processes (``scripts/nemesis_client.py``) of ``--sessions`` sessions each in the
   clients' namespace: writes, linearizable queries and follower reads of a few shared
   keys, every op recorded;
3. for ``--duration`` seconds, in seeded order and timing (``--seed``): a quiet time
   (``--quiet``), then a fault (``scripts/nemesis_faults.py``: the leader isolated, a
   split with the leader in the minority or the majority, a bridge, a one-way cut, a
   member's link flapping every second, random loss where ``nft`` is installed) held for
   ``--hold`` seconds, then healed;
4. heals everything, stops the clients, reads every key once more, waits for the members
   to agree, stops the members, and checks (``scripts/nemesis_report.py``): the history
   is linearizable, follower reads are sound, every acknowledged write is in every
   member's log, the members converged, and the cluster served again within
   ``--recovery-bound`` seconds of each heal;
5. writes ``report.md`` and ``report.json`` to ``--out`` (the members' logs and data
   stay in ``--out/run`` when the run failed or with ``--keep``).

Exit code 0 when every check passed, 1 when one failed, 2 when it could not run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
sys.path[:0] = [str(ROOT), str(SCRIPTS), str(ROOT / "tests" / "integration")]

from nemesis_faults import KINDS, Fault, FaultLab  # noqa: E402
from nemesis_report import analyze, load_lines, load_ops, markdown  # noqa: E402
from netns import NODE_ARGS, unavailable  # noqa: E402

from cluster.local import LocalCluster, free_ports  # noqa: E402

SERVICE = "nemesis_service:NemesisService"
CLIENT = SCRIPTS / "nemesis_client.py"
STARTUP_LIMIT = 120.0
"""Seconds for a leader and the first ops (a busy machine)."""
LEADER_WAIT = 5.0
"""Seconds a fault waits for a leader to be known (then it picks a member at random)."""
SETTLE = 3.0
"""Seconds of load after the last heal before the clients stop."""


def say(text: str) -> None:
    print(f"[nemesis {time.strftime('%H:%M:%S')}] {text}", flush=True)


class NamespacedCluster(LocalCluster):
    """Members each in a namespace of the lab, on its address."""

    def __init__(self, directory: Path, lab: FaultLab, nodes: int) -> None:
        ports = free_ports(3)
        members = ",".join(
            f"{i}={lab.address(i)}:{ports[0]}:{ports[1]}:{ports[2]}" for i in range(nodes)
        )
        super().__init__(nodes, SERVICE, directory, extra_args=NODE_ARGS, members=members)
        self.lab = lab

    def command(self, member_id: int) -> list[str]:
        return self.lab.command(self.lab.members[member_id], super().command(member_id))


class Members:
    """The members' ``describe`` lines (written by client 0), read as they come."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.last: dict[int, dict[str, Any]] = {}

    def read(self) -> None:
        if not self.path.exists():
            return
        with self.path.open() as f:
            f.seek(self.offset)
            data = f.read()
        complete = data[: data.rfind("\n") + 1]
        self.offset += len(complete.encode())
        for text in complete.splitlines():
            try:
                line = json.loads(text)
            except ValueError:
                continue
            self.last[line["m"]] = line

    def leader(self, within: float = 2.0) -> int | None:
        """The member that says it leads (the highest term), as of ``within`` seconds."""
        self.read()
        now = time.monotonic()
        leaders = [
            x for x in self.last.values() if x.get("role") == "LEADER" and now - x["mt"] <= within
        ]
        return max(leaders, key=lambda x: x["term"])["m"] if leaders else None


def completed_ops(work: Path) -> int:
    count = 0
    for path in work.glob("history-*.jsonl"):
        count += path.read_text().count('"ret": ')  # lines with a completion time
        count -= path.read_text().count('"ret": null')
    return count


def wait_until(what: str, limit: float, predicate: Any, helpers: Sequence[Any]) -> Any:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        for helper in helpers:
            if helper.poll() is not None:
                raise RuntimeError(f"a client process exited ({helper.returncode}) waiting {what}")
        time.sleep(0.1)
    raise RuntimeError(f"timed out after {limit:g} s waiting for {what}")


def archive_bytes(directory: Path, member_id: int) -> bytes:
    archive = directory / f"node-{member_id}" / "archive"
    return b"".join(p.read_bytes() for p in sorted(archive.glob("*.seg")))


SET = re.compile(rb"set (e\d+k\d+) (c\d+s\d+-\d{6})")
"""A write in the log (the values are of one width: the bytes after one are a frame's)."""


def logs_check(
    directory: Path, members: int, raw: list[dict[str, Any]], commit: int | None
) -> dict[str, Any]:
    """What every member's log holds of the acknowledged writes, and whether the logs
    agree byte for byte up to ``commit`` (the position they converged on; each member's
    stop, one after the other, may add an election's entries after it)."""
    logs = [archive_bytes(directory, m) for m in range(members)]
    acked = [(op["key"], op["args"][0]) for op in raw if op["kind"] == "put" and op.get("ret")]
    missing: dict[str, list[str]] = {}
    for m, data in enumerate(logs):
        held = {(k.decode(), v.decode()) for k, v in SET.findall(data)}
        missing[str(m)] = [f"{k}={v}" for k, v in acked if (k, v) not in held]
    return {
        "missing": missing,
        "identical": commit is not None
        and all(len(data) >= commit and data[:commit] == logs[0][:commit] for data in logs),
        "compared_bytes": commit,
        "sizes": [len(data) for data in logs],
    }


def converged_commit(final: dict[str, Any]) -> int | None:
    """The commit position every member reported at the end (None: they did not agree)."""
    converged = final.get("converged") or {}
    if not converged.get("equal"):
        return None
    commit: int = next(iter(converged["values"].values()))[0]
    return commit


def schedule(
    args: argparse.Namespace, lab: FaultLab, members: Members, helpers: Sequence[Any], end: float
) -> list[Fault]:
    rnd = random.Random(args.seed)
    kinds = [k for k in args.faults.split(",") if k]
    done: list[Fault] = []
    while True:
        cycle = list(kinds)
        rnd.shuffle(cycle)
        for kind in cycle:
            quiet = rnd.uniform(*args.quiet)
            hold = rnd.uniform(*args.hold)
            if time.monotonic() + quiet + hold > end:
                return done
            time.sleep(quiet)
            for helper in helpers:
                if helper.poll() is not None:
                    raise RuntimeError(f"a client process exited ({helper.returncode})")
            leader = members.leader()
            waited = time.monotonic() + LEADER_WAIT
            while leader is None and time.monotonic() < waited:  # an election under way
                time.sleep(0.1)
                leader = members.leader()
            fault = lab.apply(kind, leader, rnd, hold)
            done.append(fault)
            say(f"fault {len(done)}: {kind} ({fault.how}), {fault.heal - fault.start:.1f} s")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    work = out / "run"
    if work.exists():
        shutil.rmtree(work)
    (work / "clients").mkdir(parents=True)
    clients_dir = work / "clients"
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(SCRIPTS)])
    lab = FaultLab(args.members)
    skipped = {k: why for k in args.faults.split(",") if (why := lab.skipped(k))}
    for kind, why in skipped.items():
        say(f"skipping fault {kind}: {why}")
    args.faults = ",".join(k for k in args.faults.split(",") if k not in skipped)
    helpers: list[subprocess.Popen[bytes]] = []
    cluster: NamespacedCluster | None = None
    faults: list[Fault] = []
    try:
        lab.create()
        cluster = NamespacedCluster(work, lab, args.members)
        for member_id in range(args.members):
            cluster.start(member_id)
        origin = time.monotonic()
        for index in range(args.clients):
            argv = [sys.executable, str(CLIENT), "--members", cluster.members, "--dir",
                    str(clients_dir), "--index", str(index), "--sessions", str(args.sessions),
                    "--origin", repr(origin), "--seed", str(args.seed)]  # fmt: skip
            with open(clients_dir / f"client-{index}.log", "wb") as log:
                helpers.append(
                    subprocess.Popen(
                        lab.command(lab.clients, argv), stdout=log, stderr=subprocess.STDOUT
                    )
                )
        members = Members(clients_dir / "members.jsonl")
        wait_until("a leader", STARTUP_LIMIT, lambda: members.leader() is not None, helpers)
        wait_until(
            "the first ops", STARTUP_LIMIT, lambda: completed_ops(clients_dir) >= 20, helpers
        )
        began = time.monotonic()
        say(f"{args.members} members and {args.clients * args.sessions} sessions up after "
            f"{began - origin:.1f} s; faults for {args.duration:g} s")  # fmt: skip
        faults = schedule(args, lab, members, helpers, began + args.duration)
        lab.heal_all()
        time.sleep(SETTLE)
        end = time.monotonic()
        (clients_dir / "stop").touch()
        for helper in helpers:
            try:
                helper.wait(180)
            except subprocess.TimeoutExpired:
                say("a client process did not stop: killed")
                helper.kill()
                helper.wait()
    finally:
        for helper in helpers:
            if helper.poll() is None:
                helper.kill()
                helper.wait()
        if cluster is not None:
            cluster.stop_all()
        lab.destroy()
    raw = load_ops(clients_dir)
    final_path = clients_dir / "final.json"
    final = json.loads(final_path.read_text()) if final_path.exists() else {"error": "no final"}
    settings = {
        "seed": args.seed,
        "duration": args.duration,
        "members": args.members,
        "clients": args.clients,
        "sessions": args.sessions,
        "faults": args.faults,
        "skipped": skipped,
        "quiet": args.quiet,
        "hold": args.hold,
        "recovery_bound": args.recovery_bound,
        "origin": origin,
        "began": began,
        "end": end,
        "ran_s": end - began,
        "nft": lab.nft,
    }
    report = analyze(
        raw,
        [dataclasses.asdict(f) for f in faults],
        load_lines(clients_dir / "members.jsonl"),
        final,
        logs_check(work, args.members, raw, converged_commit(final)),
        settings,
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    (out / "report.md").write_text(markdown(report))
    lin = report["checks"]["linearizable"]
    rec = report["checks"]["recovery"]
    say(
        f"{'PASS' if report['ok'] else 'FAIL'}: {len(faults)} faults, {report['ops']['total']} "
        f"ops ({report['ops']['writes_acknowledged']} writes acknowledged), linearizable: "
        f"{lin['ok']}, max first write after a heal {rec['max_first_write_s']} s, max catch-up "
        f"{rec['max_catch_up_s']} s; report in {out / 'report.md'}"
    )
    for name, c in report["checks"].items():
        if not c["ok"]:
            say(f"check failed: {name}")
    if report["ok"] and not args.keep:
        for member_id in range(args.members):
            shutil.rmtree(work / f"node-{member_id}", ignore_errors=True)
    return 0 if report["ok"] else 1


def pair(text: str) -> tuple[float, float]:
    low, _, high = text.partition(",")
    return float(low), float(high or low)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nemesis.py", description=(__doc__ or "").split("\n\n")[0].replace("\n", " ")
    )
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of faults")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="nemesis-out", help="report directory")
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--clients", type=int, default=2, help="client processes")
    parser.add_argument("--sessions", type=int, default=3, help="sessions per client process")
    parser.add_argument(
        "--faults", default=",".join(KINDS), help=f"comma-separated, of: {', '.join(KINDS)}"
    )
    parser.add_argument("--quiet", type=pair, default=(3.0, 6.0), help="MIN,MAX s between faults")
    parser.add_argument("--hold", type=pair, default=(3.0, 8.0), help="MIN,MAX s a fault lasts")
    parser.add_argument(
        "--recovery-bound", type=float, default=5.0,
        help="seconds after a heal for a write to be acknowledged and the members to catch up",
    )  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the members' data")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    unknown = [k for k in args.faults.split(",") if k and k not in KINDS]
    if unknown:
        print(f"nemesis: unknown fault(s) {unknown}: one of {', '.join(KINDS)}", file=sys.stderr)
        return 2
    why = unavailable()
    if why is not None:
        print(f"nemesis: cannot make network namespaces here: {why}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the finally blocks clean up
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
