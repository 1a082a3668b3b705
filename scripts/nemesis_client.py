"""The client sessions of ``scripts/nemesis.py``, run inside the lab's client namespace
(``ip netns exec``): the members' addresses exist only there.

``python nemesis_client.py --members M --dir D --index I --sessions S --origin T --seed N``

Each of ``S`` sessions does one op at a time on a few shared keys of the register
service (``nemesis_service.py``): ``set KEY VALUE`` through the log (a unique value),
``get KEY`` (a linearizable query) and ``at KEY`` (a follower read; its answer carries
the log position it reflects).  The keys change every :data:`KEY_EPOCH` seconds after
``T`` (``time.monotonic()``, the same clock in every process of the machine), so that
no key's history grows past what the checker searches quickly.  Every op is a JSON
line in ``D/history-I.jsonl`` once it completed or was given up (``ret`` null: it may
or may not have taken effect; its session is then abandoned and a new one opened, as a
Jepsen process is).

Client 0 also polls every member's ``describe`` (admin port) every :data:`POLL` s into
``D/members.jsonl`` (``mt``: monotonic time, member, role, term, commit, append and
applied positions) for the leader's identity and the catch-up times.

Once ``D/stop`` exists the sessions end after their op in flight; client 0 then reads
every key once more (linearizable) and asks every member, with follower reads, for its
service state's digest (``digest``: member, log position, SHA-256 of the state), and
writes ``D/final.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
from pathlib import Path
from typing import IO, Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import client  # noqa: E402
from cluster.admin_client import AdminUnreachable, reply_body, request  # noqa: E402
from cluster.config import parse_members  # noqa: E402
from cluster.local import ingress_endpoints  # noqa: E402
from cluster.members import MemberEndpoints  # noqa: E402

KEY_EPOCH = 20.0
"""Seconds a set of keys is used for."""
KEYS = 3
"""Keys in use at once."""
OP_TIMEOUT = 8.0
"""Seconds before an op is given up (indeterminate)."""
PACE = 0.01
"""Seconds between two ops of a session."""
POLL = 0.1


def keys_at(origin: float, now: float) -> list[str]:
    epoch = int(max(0.0, now - origin) // KEY_EPOCH)
    return [f"e{epoch}k{j}" for j in range(KEYS)]


class History:
    """The op lines of this client process, written as they complete."""

    def __init__(self, path: Path) -> None:
        self.file: IO[str] = path.open("a")
        self.keys: set[str] = set()

    def record(self, op: dict[str, Any]) -> None:
        self.keys.add(op["key"])
        self.file.write(json.dumps(op) + "\n")
        self.file.flush()


async def one_op(c: client.ClusterClient, op: dict[str, Any]) -> bool:
    """Do ``op``; fill in ``ret`` (and ``result``, ``position``); False if given up."""
    try:
        with trio.fail_after(OP_TIMEOUT):
            if op["kind"] == "put":
                await c.offer(f"set {op['key']} {op['args'][0]}".encode())
                reply = await c.receive()
                if reply != b"ok":
                    raise RuntimeError(f"unexpected reply {reply!r}")
            elif op["consistency"] == "follower":
                answer = await c.query(f"at {op['key']}".encode(), consistency="follower")
                where, _, text = answer.decode().partition(" ")
                op["position"] = int(where)
                op["result"] = text or None
            else:
                text = (await c.query(f"get {op['key']}".encode())).decode()
                op["result"] = text or None
    except (Exception, trio.TooSlowError) as exc:
        op["ret"] = None
        op["error"] = f"{type(exc).__name__}: {exc}"[:200]
        op.pop("result", None)
        op.pop("position", None)
        return False
    op["ret"] = time.monotonic()
    return True


async def session_loop(
    endpoints: str, name: str, seed: int, origin: float, history: History, stop: Path
) -> None:
    rnd = random.Random(seed)
    values = itertools.count()
    for generation in itertools.count():
        if stop.exists():  # noqa: ASYNC240
            return
        who = f"{name}.{generation}"
        try:
            async with client.connect(endpoints, connect_timeout=OP_TIMEOUT) as c:
                while not stop.exists():  # noqa: ASYNC240
                    now = time.monotonic()
                    key = rnd.choice(keys_at(origin, now))
                    dice = rnd.random()
                    op: dict[str, Any] = {"client": who, "key": key, "call": now}
                    if dice < 0.4:
                        op.update(kind="put", args=[f"{name}-{next(values):06d}"])
                    else:
                        op.update(
                            kind="get",
                            args=[],
                            consistency="follower" if dice >= 0.75 else "linearizable",
                        )
                    ok = await one_op(c, op)
                    history.record(op)
                    if not ok:
                        break
                    await trio.sleep(PACE)
        except client.ClusterClientError as exc:  # a connect that failed, a close
            del exc
        await trio.sleep(0.2)


async def poll(member: MemberEndpoints, out: IO[str], stop: Path) -> None:
    while not stop.exists():  # noqa: ASYNC240
        line: dict[str, Any] = {"mt": time.monotonic(), "m": member.member_id}
        try:
            status = reply_body(await request(member, "describe", timeout=1))
        except AdminUnreachable as exc:
            line["error"] = str(exc)[:120]
        else:
            line.update(
                role=status["role"],
                term=status["leadership_term_id"],
                leader=status["leader_member_id"],
                commit=status["commit_position"],
                append=status["append_position"],
                applied=status["applied_position"],
            )
        out.write(json.dumps(line) + "\n")
        out.flush()
        await trio.sleep(POLL)


async def final_state(endpoints: str, members: int, history: History) -> dict[str, Any]:
    """A last linearizable read of every key used, and each member's state digest."""
    reads: dict[str, str | None] = {}
    digests: dict[str, Any] = {}
    async with client.connect(endpoints, connect_timeout=30) as c:
        for key in sorted(history.keys):
            op: dict[str, Any] = {"client": "final", "key": key, "call": time.monotonic()}
            op.update(kind="get", args=[], consistency="linearizable")
            if await one_op(c, op):
                history.record(op)
                reads[key] = op.get("result")
        top = await c.query(b"digest")  # a linearizable one: the newest position
        digests["leader"] = top.decode()
        # follower reads go round-robin over every member; each answer names its member
        with trio.move_on_after(60):
            while len(digests) < members + 1:
                answer = (await c.query(b"digest", consistency="follower")).decode()
                member, _, rest = answer.partition(" ")
                digests[member] = rest
    return {"reads": reads, "digests": digests}


async def converge(members: list[MemberEndpoints], limit: float) -> dict[str, Any]:
    """Poll every member's ``describe`` until all report the same commit, append and
    applied positions (``equal``), for up to ``limit`` seconds."""
    began = time.monotonic()
    values: dict[int, Any] = {}
    while time.monotonic() - began < limit:
        values = {}
        for member in members:
            try:
                status = reply_body(await request(member, "describe", timeout=1))
            except AdminUnreachable as exc:
                values[member.member_id] = str(exc)[:80]
                continue
            values[member.member_id] = [
                status["commit_position"],
                status["append_position"],
                status["applied_position"],
            ]
        if len({json.dumps(v) for v in values.values()}) == 1:
            return {"equal": True, "values": values, "after_s": time.monotonic() - began}
        await trio.sleep(0.2)
    return {"equal": False, "values": values, "after_s": time.monotonic() - began}


async def main(args: argparse.Namespace) -> None:
    directory = Path(args.dir)
    stop = directory / "stop"
    endpoints = ingress_endpoints(args.members)
    history = History(directory / f"history-{args.index}.jsonl")
    async with trio.open_nursery() as nursery:
        if args.index == 0:
            out = (directory / "members.jsonl").open("a")
            for member in parse_members(args.members):
                nursery.start_soon(poll, member, out, stop)
        async with trio.open_nursery() as sessions:
            for s in range(args.sessions):
                name = f"c{args.index}s{s}"
                seed = args.seed * 1000 + args.index * 100 + s
                sessions.start_soon(session_loop, endpoints, name, seed, args.origin, history, stop)
        if args.index == 0:
            try:
                final = await final_state(endpoints, len(parse_members(args.members)), history)
                final["converged"] = await converge(parse_members(args.members), 60)
            except Exception as exc:  # reported in final.json, not raised
                final = {"error": f"{type(exc).__name__}: {exc}"}
            (directory / "final.json").write_text(json.dumps(final))
        nursery.cancel_scope.cancel()
    (directory / f"done-{args.index}").touch()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--origin", type=float, required=True)
    parser.add_argument("--seed", type=int, default=0)
    trio.run(main, parser.parse_args())
