"""The clients of ``test_netns_partition.py``, run inside the lab's client namespace
(``ip netns exec``): they reach the members' addresses there, which exist nowhere else.

``python netns_client.py MEMBERS DIR``: writers put unique keys (``key-W-N`` = ``N``)
as fast as they are acknowledged, and every member's ``describe`` is polled every
50 ms; each answer is a JSON line in ``DIR/members.jsonl`` (wall-clock time, member,
role, term, commit position), each acknowledged write counts in ``DIR/acked``.  Once
``DIR/stop`` exists the writers stop and every acknowledged key is read back
(linearizable queries); ``DIR/summary.json`` then says how many were acknowledged and
which were lost.

Meanwhile :data:`READERS` more sessions, one op at a time, put unique values to a few
shared keys (``reg-K``) and read them (``get``: linearizable, and one in three
``consistency="follower"``); every op is recorded with its invocation and completion
times (``time.monotonic()`` of this process; an op that raised or took over
:data:`OP_TIMEOUT` never completed) in ``DIR/history.json`` for the test to check for
linearizability (``tests/lincheck.py``).
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import trio

import client
from cluster.admin_client import AdminUnreachable, reply_body, request
from cluster.config import parse_members
from cluster.examples.kv import KeyValueClient
from cluster.local import ingress_endpoints
from cluster.members import MemberEndpoints

WRITERS = 4
READERS = 3
REGISTERS = ("reg-0", "reg-1", "reg-2")
OP_TIMEOUT = 10.0


async def poll(member: MemberEndpoints, out: Path, stop: Path) -> None:
    with out.open("a") as lines:
        while not stop.exists():  # noqa: ASYNC240
            try:
                status = reply_body(await request(member, "describe", timeout=1))
            except AdminUnreachable as exc:
                line = {"t": time.time(), "m": member.member_id, "error": str(exc)}
            else:
                line = {
                    "t": time.time(),
                    "m": member.member_id,
                    "role": status["role"],
                    "term": status["leadership_term_id"],
                    "commit": status["commit_position"],
                }
            lines.write(json.dumps(line) + "\n")
            lines.flush()
            await trio.sleep(0.05)


async def write(kv: KeyValueClient, writer: int, acked: list[str], stop: Path) -> None:
    n = 0
    while not stop.exists():  # noqa: ASYNC240
        key = f"key-{writer}-{n}"
        await kv.put(key, str(n).encode())
        acked.append(key)
        n += 1


async def register_ops(
    endpoints: str, index: int, history: list[dict[str, Any]], stop: Path
) -> None:
    """One session's ops on the shared keys, recorded; a new session after one failed."""
    rnd = random.Random(index)
    n = 0
    generation = 0
    while not stop.exists():  # noqa: ASYNC240
        who = f"r{index}.{generation}"
        generation += 1
        try:
            async with (
                client.connect(endpoints, connect_timeout=60) as c,
                KeyValueClient(c) as kv,
            ):
                while not stop.exists():  # noqa: ASYNC240
                    key = rnd.choice(REGISTERS)
                    dice = rnd.random()
                    op: dict[str, Any] = {"client": who, "key": key, "call": time.monotonic()}
                    history.append(op)
                    if dice < 0.4:
                        value = f"{who}-{n}"
                        n += 1
                        op.update(kind="put", args=[value])
                    else:
                        consistency = "follower" if dice > 0.8 else "linearizable"
                        op.update(kind="get", args=[], consistency=consistency)
                    with trio.move_on_after(OP_TIMEOUT):
                        if op["kind"] == "put":
                            await kv.put(key, op["args"][0].encode())
                        else:
                            answer = await kv.get(key, consistency=op["consistency"])
                            op["result"] = None if answer is None else answer.decode()
                        op["ret"] = time.monotonic()
                    if "ret" not in op:
                        break  # it may yet take effect: this session is done
        except client.ClusterClientError:
            await trio.sleep(0.2)  # an op in flight, if any, never completed


async def main(members: str, directory: Path) -> None:
    stop = directory / "stop"
    listed = parse_members(members)
    acked: list[str] = []
    lost: list[str] = []
    history: list[dict[str, Any]] = []
    async with trio.open_nursery() as nursery:
        for member in listed:
            nursery.start_soon(poll, member, directory / "members.jsonl", stop)
        async with trio.open_nursery() as readers:
            for index in range(READERS):
                readers.start_soon(register_ops, ingress_endpoints(members), index, history, stop)
            readers.start_soon(writers_and_read_back, members, directory, acked, stop, lost)
        # the history first: the test reads it once the summary is there
        (directory / "history.json").write_text(json.dumps(history))
        summary = {"acked": len(acked), "lost": lost}
        (directory / "summary.json").write_text(json.dumps(summary))
        nursery.cancel_scope.cancel()


async def writers_and_read_back(
    members: str, directory: Path, acked: list[str], stop: Path, lost: list[str]
) -> None:
    async with (
        client.connect(ingress_endpoints(members), connect_timeout=60) as c,
        KeyValueClient(c) as kv,
    ):
        async with trio.open_nursery() as writers:
            for w in range(WRITERS):
                writers.start_soon(write, kv, w, acked, stop)

            async def count() -> None:
                while not stop.exists():  # noqa: ASYNC240
                    # whole or not at all: the test never reads a file being written
                    (directory / "acked.tmp").write_text(str(len(acked)))
                    (directory / "acked.tmp").replace(directory / "acked")
                    await trio.sleep(0.1)

            writers.start_soon(count)
        for key in acked:
            if await kv.get(key) != key.rsplit("-", 1)[1].encode():
                lost.append(key)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], Path(sys.argv[2]))
