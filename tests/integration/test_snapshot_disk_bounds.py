"""Issue 33, points 6 and 7: a snapshot install bounded by the disk, node state writable
on a full disk, and a follower stranded by corruption below the snapshot.  The full-disk
cases use a small tmpfs (root; skipped otherwise)."""

from __future__ import annotations

import json
import logging
import os
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from test_full_disk import fill_up, small_disk
from test_member_links import Cluster, send, wait_for

from cluster.archive.node_state import RESERVE_NAME, SLOT_SIZE, NodeState
from cluster.archive.recording_log import RecordingLog
from cluster.archive.storage import NodeStorage
from cluster.node import Node
from cluster.protocol import PROTOCOL_VERSION
from cluster.protocol.consensus import MAX_SNAPSHOT_CHUNK, MemberHello, RequestVote, SnapshotChunk


def _free(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def test_the_candidate_term_is_saved_on_a_full_disk(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "1m") as disk:
        data = disk / "member"
        data.mkdir()
        state = NodeState(data)
        assert (data / RESERVE_NAME).stat().st_size == SLOT_SIZE
        state.save(candidate_term_id=1, commit_position=100)
        fill_up(disk)
        storage = NodeStorage(RecordingLog.open(data), state)
        for term in range(2, 30):
            storage.save_candidate_term(term)
            state.save(commit_position=100 + term)
        again = NodeState(data)
        assert (again.candidate_term_id, again.commit_position) == (29, 129)
        assert json.loads((data / "node-state.json").read_text())["candidate_term_id"] == 29
        assert (data / RESERVE_NAME).exists()
        assert not storage.disk.problem


def test_a_save_cut_between_its_renames_is_finished_at_load(tmp_path: Path) -> None:
    state = NodeState(tmp_path)
    state.save(candidate_term_id=3)
    reserve = tmp_path / RESERVE_NAME
    os.replace(reserve, reserve.with_suffix(".old"))  # as a crash would leave it
    again = NodeState(tmp_path)
    assert again.candidate_term_id == 3
    assert reserve.exists()
    assert not reserve.with_suffix(".old").exists()


# ------------------------------------------------- forged and abandoned snapshot streams


def _chunk(term: int, leader: int, position: int, length: int, offset: int, data: bytes) -> object:
    return SnapshotChunk(
        leadership_term_id=term,
        leader_member_id=leader,
        log_position=position,
        snapshot_term_id=term,
        term_base_log_position=0,
        length=length,
        offset=offset,
        crc=zlib.crc32(data),
        data=data,
    )


@asynccontextmanager
async def leader_gone(tmp_path: Path) -> AsyncIterator[tuple[Cluster, Node, Node]]:
    """Members 0 and 1 of three up; the leader then crashes (its task cancelled, no
    hand-over): the follower, which cannot win an election alone, still names it."""
    c = Cluster(tmp_path)
    async with trio.open_nursery() as nursery:
        scopes = {}
        for node in c.nodes:
            scope = scopes[node.config.member_id] = trio.CancelScope()

            async def run(
                node: Node = node, scope: trio.CancelScope = scope, *, task_status: Any
            ) -> None:
                with scope:
                    await node.run(handle_signals=False, task_status=task_status)

            await nursery.start(run)
        await wait_for(lambda: any(n.cm.is_ready_leader for n in c.nodes), 30)
        leader, follower = c.leader, c.follower
        await wait_for(lambda: follower.cm.log.commit_position >= leader.cm.log.commit_position > 0)
        scopes[leader.config.member_id].cancel()
        await trio.sleep(0.05)
        try:
            yield c, leader, follower
        finally:
            await follower.shutdown()
            nursery.cancel_scope.cancel()


def install_files(node: Node) -> list[Path]:
    return sorted((node.data_dir / "snapshots").glob("install-*.tmp"))


async def test_a_forged_stream_declaring_more_than_the_disk_holds_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "cluster.node")
    with small_disk(tmp_path / "disk", "64m") as disk:
        async with leader_gone(disk) as (c, leader, follower):
            me, term = leader.config.member_id, leader.cm.leadership_term_id
            position = follower.cm.log.published_position + (1 << 20)
            free = _free(disk)
            data = bytes(MAX_SNAPSHOT_CHUNK)
            frames = [
                MemberHello(me, PROTOCOL_VERSION),
                _chunk(term, me, position, 1 << 36, 0, b""),
            ]
            frames += [_chunk(term, me, position, 1 << 36, k * len(data), data) for k in range(40)]
            await send(c.consensus_port(follower.config.member_id), *frames)
            await trio.sleep(0.3)
            assert install_files(follower) == []
            assert follower.catchup.refused_installs == 1
            assert _free(disk) >= free - (1 << 20), (free, _free(disk))
            assert follower.cm.replica.snapshot.transfer is None
            refusals = [r for r in caplog.records if "refused" in r.getMessage()]
            assert len(refusals) == 1, [r.getMessage() for r in refusals]


async def test_an_abandoned_stream_leaves_no_file_and_a_full_disk_still_votes(
    tmp_path: Path,
) -> None:
    with small_disk(tmp_path / "disk", "64m") as disk:
        async with leader_gone(disk) as (c, leader, follower):
            me, term = leader.config.member_id, leader.cm.leadership_term_id
            position = follower.cm.log.published_position + (1 << 20)
            data = bytes(MAX_SNAPSHOT_CHUNK)
            length = 4 * len(data)
            frames = [MemberHello(me, PROTOCOL_VERSION), _chunk(term, me, position, length, 0, b"")]
            frames += [_chunk(term, me, position, length, 0, data)]
            began = trio.current_time()
            await send(c.consensus_port(follower.config.member_id), *frames)
            # the leader is dead: no chunk comes again, and the file goes at once
            await wait_for(lambda: install_files(follower) == [], 10)
            gone = trio.current_time() - began
            assert gone < 2 + 1, gone  # --leader-heartbeat-timeout 2s, or an election
            assert follower.catchup.abandoned_installs == 1
            # the disk fills up: the follower still saves the term of a candidate (member 2,
            # as an attacker could speak) it votes for
            await wait_for(lambda: follower.cm.leader_member_id != me, 10)
            fill_up(disk)
            log_term = follower.cm.log.terms.term_at(follower.cm.log.published_position)
            vote = RequestVote(
                log_leadership_term_id=log_term,
                log_position=follower.cm.log.published_position,
                candidate_term_id=term + 1,
                candidate_member_id=2,
                protocol_version=PROTOCOL_VERSION,
            )
            await send(
                c.consensus_port(follower.config.member_id), MemberHello(2, PROTOCOL_VERSION), vote
            )
            await wait_for(lambda: follower.storage.node_state.candidate_term_id == term + 1, 10)
            assert not follower.storage.disk.full
