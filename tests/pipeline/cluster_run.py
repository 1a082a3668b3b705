"""Produce real archives: a 3-member cluster, KV load, a leader SIGKILL failover.

The members run with TLS (certificates from :func:`cluster.certs.make_certs`), so every
client session has a principal (``app``, the name on its certificate); the last session
has its egress dialled back (``egress_host``), so its response channel is ``host:port``.
Admin actions go to the leader's admin port with the ``admin`` certificate: SUSPEND,
RESUME and SNAPSHOT between the first two sessions, SHUTDOWN at the end (the members
stop themselves).

Used by the session-scoped fixture of ``test_pipeline.py``; runnable on its own
(``python tests/pipeline/cluster_run.py DIR``) to get archives to play with.
"""

from __future__ import annotations

import itertools
import json
import signal
import sys
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import trio

import client
from cluster import admin_client
from cluster.certs import make_certs
from cluster.config import parse_members
from cluster.examples.kv import KeyValueClient
from cluster.local import LocalCluster

KV = "cluster.examples.kv:KeyValueService"
NODE_ARGS = [
    "--leader-heartbeat-timeout",
    "1s",
    "--election-timeout",
    "500ms",
    "--session-timeout",
    "10s",
    "--segment-size",
    "16KiB",  # several segment files per member: several partitions each
    "--archive-retention",
    "0",  # the whole log: the tables count every message the clients sent (a first
    # segment wholly below the SNAPSHOT's position would otherwise go at SHUTDOWN's)
]
CONNECT_TIMEOUT = 24.0
PRINCIPAL = "app"
"""The client certificate the sessions use: their principal."""
EGRESS_HOST = "127.0.0.1"


@dataclass
class SessionRecord:
    """What one client session sent: ``offers`` counts every send, resends included."""

    cluster_session_id: int
    phase: str
    offers: int = 0
    requests: int = 0
    acked: int = 0
    closed_by_client: bool = False
    response_channel: str = ""


@dataclass
class RunRecord:
    """What the clients did during the run, for the tests to compare with the tables."""

    directory: str
    sessions: list[SessionRecord] = field(default_factory=list)
    killed_leader: int = -1
    new_leader: int = -1
    term_before: int = -1
    term_killed: int = -1
    """The term whose leader was killed (term_before unless an election came between)."""
    term_after: int = -1
    certs: str = ""
    actions: list[str] = field(default_factory=list)
    """The admin actions requested, in order (SUSPEND, RESUME, SNAPSHOT, SHUTDOWN)."""

    def to_json(self) -> str:
        return json.dumps(
            {
                "directory": self.directory,
                "killed_leader": self.killed_leader,
                "new_leader": self.new_leader,
                "term_before": self.term_before,
                "term_killed": self.term_killed,
                "term_after": self.term_after,
                "certs": self.certs,
                "actions": self.actions,
                "sessions": [vars(s) for s in self.sessions],
            },
            indent=2,
        )


class CountingSession:
    """A client session with a KV client whose offers are counted."""

    def __init__(
        self, endpoints: str, phase: str, record: RunRecord, egress_host: str | None = None
    ) -> None:
        self.endpoints = endpoints
        self.phase = phase
        self.run_record = record
        self.egress_host = egress_host

    async def __aenter__(self) -> tuple[KeyValueClient, SessionRecord]:
        for attempt in itertools.count(1):
            try:
                self._cm = client.connect(
                    self.endpoints,
                    connect_timeout=CONNECT_TIMEOUT / 3,
                    certs_dir=Path(self.run_record.certs) / f"client-{PRINCIPAL}",
                    egress_host=self.egress_host,
                )
                self.client = await self._cm.__aenter__()
                break
            except client.ConnectTimeoutError:
                if attempt >= 3:
                    raise
        self.record = SessionRecord(self.client.cluster_session_id, self.phase)
        self.record.response_channel = self.client._response_channel
        self.run_record.sessions.append(self.record)
        original = self.client.offer
        record = self.record

        async def counting_offer(payload: bytes) -> None:
            record.offers += 1
            await original(payload)

        self.client.offer = counting_offer  # type: ignore[method-assign]
        self.kv = KeyValueClient(self.client)
        await self.kv.__aenter__()
        return self.kv, self.record

    async def __aexit__(self, *exc: object) -> None:
        await self.kv.__aexit__(None, None, None)
        await self._cm.__aexit__(None, None, None)
        self.record.closed_by_client = True


async def put_many(
    kv: KeyValueClient,
    record: SessionRecord,
    prefix: str,
    count: int,
    milestone: tuple[int, trio.Event] | None = None,
) -> None:
    """``count`` puts, up to 50 in flight, every one acknowledged; ``milestone`` = (n,
    event): the event is set once n are acknowledged."""
    limiter = trio.CapacityLimiter(50)

    async def one(i: int) -> None:
        async with limiter:
            record.requests += 1
            await kv.put(f"{prefix}-{i}", f"value-{i}".encode())
            record.acked += 1
            if milestone is not None and record.acked >= milestone[0]:
                milestone[1].set()

    async with trio.open_nursery() as nursery:
        for i in range(count):
            nursery.start_soon(one, i)


async def admin(cluster: LocalCluster, record: RunRecord, leader: int, command: str) -> None:
    """``command`` on ``leader``'s admin port (with the ``admin`` certificate)."""
    member = parse_members(cluster.members)[leader]
    reply = await admin_client.request(member, command, timeout=30.0)
    assert reply.ok, f"{command} on member {leader}: {reply.message}"
    record.actions.append(command.upper())


async def drive(cluster: LocalCluster, record: RunRecord, per_phase: int) -> None:
    endpoints = cluster.ingress_endpoints
    admin_client.use_certs(Path(record.certs) / "client-admin")
    with trio.fail_after(120):
        # Phase 1: a session that writes and closes before the failover.
        async with CountingSession(endpoints, "before", record) as (kv, s):
            await put_many(kv, s, "before", per_phase)
            record.term_before = kv.client.leadership_term_id
            leader = kv.client.leader_member_id
        # Admin actions on the leader: they go into the log as ClusterActionRequests.
        for command in ("suspend", "resume", "snapshot"):
            await admin(cluster, record, leader, command)
        # Phase 2: a session open across the failover, writing while the leader dies.
        async with CountingSession(endpoints, "across", record) as (kv, s):
            third = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(put_many, kv, s, "across", per_phase, (per_phase // 3, third))
                await third.wait()
                leader = kv.client.leader_member_id
                record.term_killed = kv.client.leadership_term_id
                cluster.kill(leader)
                record.killed_leader = leader
            record.new_leader = kv.client.leader_member_id
            record.term_after = kv.client.leadership_term_id
        # The killed member comes back and catches up.
        cluster.start(leader)
        await trio.to_thread.run_sync(lambda: cluster.wait_ready(20, member_ids=[leader]))
        # Phase 3: a session after the failover, with a key that expires (a timer).
        async with CountingSession(endpoints, "after", record, EGRESS_HOST) as (kv, s):
            await put_many(kv, s, "after", per_phase)
            s.requests += 1
            await kv.put("expiring", b"soon", ttl=0.2)
            s.acked += 1
            await trio.sleep(0.5)
            leader = kv.client.leader_member_id
        # Let every member apply everything and save its commit position (once a second).
        await trio.sleep(2.5)
        # SHUTDOWN: every member takes a snapshot and stops.
        await admin(cluster, record, leader, "shutdown")
        deadline = trio.current_time() + 20
        while any(p.poll() is None for p in cluster.processes.values()):
            assert trio.current_time() < deadline, "the members did not stop after SHUTDOWN"
            await trio.sleep(0.1)


def produce(directory: Path, per_phase: int = 300) -> RunRecord:
    certs = directory.with_name(directory.name + "-certs")
    make_certs(certs, [(i, "127.0.0.1") for i in range(3)])
    record = RunRecord(str(directory), certs=str(certs))
    cluster = LocalCluster(3, KV, directory, extra_args=NODE_ARGS, certs=certs)
    try:
        cluster.start_all(timeout=20)
        trio.run(drive, cluster, record, per_phase)
    finally:
        admin_client.use_certs(None)
        for proc in cluster.processes.values():
            if proc.poll() is None:
                with suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)
        cluster.stop_all()
    (directory / "run.json").write_text(record.to_json())
    return record


if __name__ == "__main__":
    started = time.monotonic()
    out = produce(Path(sys.argv[1]))
    print(out.to_json())
    print(f"took {time.monotonic() - started:.1f}s")
