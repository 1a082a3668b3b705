"""Leader-side replication: one task per follower ships the log as it is on disk.

A replicator sends ``AppendRequest`` chunks of the leader's log (byte ranges, unchanged,
never crossing a term boundary) from the follower's ``next_position``: from the
in-memory log buffer when the follower is close behind, from the archive when it is
catching up.  It sends whatever is new in one chunk per wake-up (batching), keeps the
link's backlog bounded, and probes with an empty request every heartbeat interval so a
follower that lost data or diverged reports where it really is.

All replicators of a term run inside the leadership cancel scope: an election cancels
them together.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from ..core.consensus import ConsensusModule
from .consensus import PeerLink

MAX_CHUNK = 1 << 20
MAX_LINK_BACKLOG = 4 << 20


class Replicator:
    def __init__(
        self,
        cm: ConsensusModule,
        member_id: int,
        link: PeerLink,
        read_log: Callable[[int, int], Awaitable[bytes]],
        log_end: Callable[[], int],
        wait_for_log: Callable[[], Awaitable[None]],
        heartbeat_interval: float,
    ) -> None:
        self.cm = cm
        self.member_id = member_id
        self.link = link
        self.read_log = read_log
        self.log_end = log_end
        self.wait_for_log = wait_for_log
        self.heartbeat_interval = heartbeat_interval

    async def run(self) -> None:
        cm = self.cm
        link = self.link
        connects = link.connects
        next_heartbeat = -1e18  # one number for both the test and the wait: no FP drift
        while True:
            follower = cm.followers.get(self.member_id)
            if follower is None:
                return
            if not link.is_connected:
                await link.connected.wait()
                continue
            if link.connects != connects:
                # data sent on a broken connection may be lost: resend from what the
                # follower has confirmed
                connects = link.connects
                if follower.match_position >= 0:
                    follower.next_position = follower.match_position
            end = self.log_end()
            start = follower.next_position
            if start < end and link.backlog < MAX_LINK_BACKLOG:
                stop = cm.replication_stop(start, min(end, start + MAX_CHUNK))
                data = await self.read_log(start, stop)
                if (
                    cm.followers.get(self.member_id) is not follower
                    or follower.next_position != start
                ):
                    continue
                link.send(cm.append_request(self.member_id, start, data))
                follower.next_position = stop
                next_heartbeat = trio.current_time() + self.heartbeat_interval
                await trio.lowlevel.checkpoint()
                continue
            now = trio.current_time()
            if now >= next_heartbeat:
                link.send(cm.append_request(self.member_id, start, b""))
                next_heartbeat = now + self.heartbeat_interval
            with trio.move_on_at(next_heartbeat):
                if link.backlog >= MAX_LINK_BACKLOG:
                    await trio.sleep(0.001)
                else:
                    await self.wait_for_log()
