"""The clients of ``test_netns_partition.py``, run inside the lab's client namespace
(``ip netns exec``): they reach the members' addresses there, which exist nowhere else.

``python netns_client.py MEMBERS DIR``: writers put unique keys (``key-W-N`` = ``N``)
as fast as they are acknowledged, and every member's ``describe`` is polled every
50 ms; each answer is a JSON line in ``DIR/members.jsonl`` (wall-clock time, member,
role, term, commit position), each acknowledged write counts in ``DIR/acked``.  Once
``DIR/stop`` exists the writers stop and every acknowledged key is read back
(linearizable queries); ``DIR/summary.json`` then says how many were acknowledged and
which were lost.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import trio

import client
from cluster.admin_client import AdminUnreachable, reply_body, request
from cluster.config import parse_members
from cluster.examples.kv import KeyValueClient
from cluster.local import ingress_endpoints
from cluster.members import MemberEndpoints

WRITERS = 4


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


async def main(members: str, directory: Path) -> None:
    stop = directory / "stop"
    listed = parse_members(members)
    acked: list[str] = []
    async with trio.open_nursery() as nursery:
        for member in listed:
            nursery.start_soon(poll, member, directory / "members.jsonl", stop)
        async with (
            client.connect(ingress_endpoints(members), connect_timeout=60) as c,
            KeyValueClient(c) as kv,
        ):
            async with trio.open_nursery() as writers:
                for w in range(WRITERS):
                    writers.start_soon(write, kv, w, acked, stop)

                async def count() -> None:
                    while not stop.exists():
                        (directory / "acked").write_text(str(len(acked)))
                        await trio.sleep(0.1)

                writers.start_soon(count)
            lost = [key for key in acked if await kv.get(key) != key.rsplit("-", 1)[1].encode()]
        summary = {"acked": len(acked), "lost": lost}
        (directory / "summary.json").write_text(json.dumps(summary))
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], Path(sys.argv[2]))
