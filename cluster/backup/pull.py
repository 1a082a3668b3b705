"""One pass of a backup from one member: what a one-shot backup does once and the
continuous backup does at every poll (:func:`sync`).

From the member's ``backup-query``: the newest snapshot the backup lacks is fetched
(checked, then renamed into place); the log is read from where the backup's ends (or,
for a new backup or one that fell behind the member's log start, from that snapshot) up
to the member's committed end, every record CRC-checked; the terms are merged; retention
drops the snapshots beyond ``keep`` and the log below the oldest kept one; then the
recording log and the manifest are replaced.  A file that went away on the member
meanwhile (a compaction) is retried from a fresh query a few times.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from .link import BackupLinkError, Pull, SnapshotDamaged
from .store import BackupStore

log = logging.getLogger("cluster.backup")

COMMIT_EVERY = 16 << 20
"""Bytes of log after which a long pass saves its progress (the manifest)."""
RETRIES = 3


def _snapshot_groups(query: dict[str, Any]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """The member's snapshot entries by (position, term), those that its log covers."""
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for entry in query["snapshots"]:
        position = int(entry["log_position"])
        if query["log_start"] <= position <= query["readable_end"]:
            groups.setdefault((position, int(entry["leadership_term_id"])), []).append(entry)
    return {k: v for k, v in groups.items() if any(e["service_id"] == -1 for e in v)}


def source_fields(pull: Pull, query: dict[str, Any]) -> dict[str, Any]:
    return {
        "source": f"member {pull.member_id} ({pull.link.member.host}:"
        f"{pull.link.member.admin_port}, {query['role']})",
        "cluster_id": query["cluster_id"],
        "member_id": query["member_id"],
        "source_commit_position": query["commit_position"],
    }


async def _once(store: BackupStore, pull: Pull, keep: int, upto: int | None) -> dict[str, Any]:
    query = await pull.query()
    known = store.manifest.get("cluster_id")
    if known is not None and known != query["cluster_id"]:
        raise BackupLinkError(
            f"member {pull.member_id} is of cluster {query['cluster_id']}, the backup in "
            f"{store.out} of cluster {known}: refused"
        )
    stop = query["readable_end"] if upto is None else min(upto, query["readable_end"])
    groups = _snapshot_groups(query)
    end = store.log_end
    behind = end is None or end < query["log_start"]
    newest = None
    for candidate in sorted(groups, reverse=True):  # the newest that passes its check
        if candidate[0] <= store.latest_snapshot or not (behind or candidate[0] <= stop):
            break
        try:
            temp = store.snapshot_temp()
            await pull.snapshot(groups[candidate][0], temp)
        except SnapshotDamaged as exc:
            log.warning("%s: an older one is taken", exc)
            continue
        store.add_snapshot(groups[candidate], temp)
        newest = candidate
        break
    if behind and newest is None and 0 <= query["log_start"] <= store.latest_snapshot:
        newest = (store.latest_snapshot, -1)  # the one it holds: the log from there
    if behind:
        if newest is None:
            if query["log_start"] > 0 or end is not None:
                raise BackupLinkError(
                    f"member {pull.member_id} holds no valid snapshot and its log begins at "
                    f"{query['log_start']}: nothing to start a backup from"
                )
            store.start_at(0)
        else:
            store.start_at(newest[0])
    since = 0
    start = store.log_end
    assert start is not None
    if start < stop:
        async for chunk in pull.log(start, stop):
            store.append(chunk)
            since += len(chunk)
            if since >= COMMIT_EVERY:
                since = 0
                store.commit(**source_fields(pull, query))
    store.set_terms(query["terms"])
    store.retain(keep)
    return store.commit(**source_fields(pull, query))


async def sync(
    store: BackupStore, pull: Pull, *, keep: int, upto: int | None = None
) -> dict[str, Any]:
    """Bring ``store`` up to ``pull``'s member's committed log (at most ``upto``);
    the manifest.  BackupLinkError when the member cannot serve it."""
    failure: BackupLinkError | None = None
    for attempt in range(RETRIES):
        try:
            return await _once(store, pull, keep, upto)
        except BackupLinkError as exc:
            failure = exc
            if not any(word in str(exc) for word in ("gone", "no longer held", "log start")):
                raise
            await trio.sleep(0.1 * (attempt + 1))  # compacted meanwhile: ask again
    assert failure is not None
    raise failure
