"""``cluster-tool backup --out DIR [--member N]``: a one-shot backup of the live cluster.

The leader (or member ``N``) is asked for its committed end at the time of the call
(``backup-query``); its latest snapshot and the log from it up to that position are
pulled over the admin connection (:mod:`cluster.backup.pull`), every record checked as it
is written, then the whole directory is checked again (:func:`cluster.tool.offline.verify`)
before the manifest is trusted.  The result is the backup format ``cluster-tool restore``
reads; the position it **covers** is printed.  A failure removes what was written and
says why (exit 1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from ..config import MemberEndpoints
from ..tool.client import describe_all, find_leader
from ..tool.offline import verify
from ..transport.tls import TlsIdentity
from .link import BackupLinkError, Link, Pull
from .pull import sync
from .store import BackupStore, StoreError

ATTEMPTS = 3
RETRY_AFTER = 0.5
FAILOVER_WAIT = 30.0
"""How long a backup whose leader was lost waits for a new one (an election after the
leader heartbeat timeout)."""


class OneShotError(Exception):
    """The backup was not made (the reason in words)."""


async def choose(members: list[MemberEndpoints], member: int | None, limit: float) -> int:
    """The member to back up from: ``member``, else the leader."""
    if member is not None:
        return member
    described = await describe_all(members, limit)
    leader = find_leader(described)
    if leader < 0:
        down = "; ".join(f"member {r.member.member_id}: {r.failure}" for r in described
                         if r.status is None)  # fmt: skip
        raise OneShotError(
            "no leader found (use --member N to back up from a member)"
            + (f": {down}" if down else "")
        )
    return leader


async def live_backup(
    members: list[MemberEndpoints],
    out: Path,
    *,
    member: int | None = None,
    tls: TlsIdentity | None = None,
    limit: float = 10.0,
) -> dict[str, Any]:
    """Make the backup in ``out``; its manifest (``covers``: the position it holds to).

    Without ``member``, a leader lost half-way (killed, deposed) is not the end: the new
    leader is found and the backup made again from it (:data:`ATTEMPTS` in all); its
    commit position is at least the old one's, so the backup still covers every write
    acknowledged before the call."""
    chosen = await choose(members, member, limit)
    for attempt in range(ATTEMPTS):
        try:
            return await _from(next(m for m in members if m.member_id == chosen), out, tls,
                               limit)  # fmt: skip
        except BackupLinkError as exc:
            if member is not None or attempt + 1 == ATTEMPTS or "refused" in str(exc):
                raise OneShotError(str(exc)) from None
        chosen = await _new_leader(members, limit)
    raise AssertionError("unreachable")


async def _new_leader(members: list[MemberEndpoints], limit: float) -> int:
    """The leader, once there is one again (within :data:`FAILOVER_WAIT` seconds)."""
    deadline = trio.current_time() + FAILOVER_WAIT
    while True:
        await trio.sleep(RETRY_AFTER)
        try:
            return await choose(members, None, limit)
        except OneShotError:
            if trio.current_time() >= deadline:
                raise


async def _from(
    endpoints: MemberEndpoints, out: Path, tls: TlsIdentity | None, limit: float
) -> dict[str, Any]:
    try:
        store = BackupStore.create(out)
    except StoreError as exc:
        raise OneShotError(str(exc)) from None
    link = Link(endpoints, tls, limit)
    try:
        await sync(store, Pull(link), keep=1)
        store.close()
        checked = verify(out)
        if not checked["ok"]:
            raise OneShotError(f"the backup does not verify: {checked['problems']}")
        return store.commit(records=checked["records"])
    except BaseException as exc:
        store.remove()
        if isinstance(exc, OSError):
            raise OneShotError(f"writing {out} failed: {exc.strerror or exc}") from None
        raise
    finally:
        await link.aclose()
