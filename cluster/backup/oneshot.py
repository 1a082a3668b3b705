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

from ..config import MemberEndpoints
from ..tool.client import describe_all, find_leader
from ..tool.offline import verify
from ..transport.tls import TlsIdentity
from .link import BackupLinkError, Link, Pull
from .pull import sync
from .store import BackupStore, StoreError


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
    """Make the backup in ``out``; its manifest (``covers``: the position it holds to)."""
    chosen = await choose(members, member, limit)
    endpoints = next(m for m in members if m.member_id == chosen)
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
        return store.commit(kind="live", records=checked["records"])
    except (BackupLinkError, OSError, OneShotError) as exc:
        store.remove()
        if isinstance(exc, OSError):
            raise OneShotError(f"writing {out} failed: {exc.strerror or exc}") from None
        raise OneShotError(str(exc)) from None
    finally:
        await link.aclose()
