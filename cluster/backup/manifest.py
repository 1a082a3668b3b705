"""``backup.json``: a backup's manifest, and the log positions it promises.

Every kind of backup has one (``cluster-tool backup --from-dir``, ``cluster-tool backup
--out``, ``cluster-backup``): where it came from, the snapshot it starts from, the log it
holds (``log_start``, ``log_end``) and the position it **covers** (every write
acknowledged before a live backup was asked for is at or below it).  ``kind`` says
which program made it: ``cluster-backup`` goes on only with its own (``continuous``).
:mod:`cluster.backup.check` holds the promises against the files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..fileio import read_regular

MANIFEST = "backup.json"
FORMAT = 1
MAX_SIZE = 16 << 20
"""The most a manifest is read for (it lists terms and snapshots: kilobytes)."""

KIND_CONTINUOUS = "continuous"
"""Made by ``cluster-backup``, which goes on with it when started again."""
KIND_LIVE = "live"
"""Made once by ``cluster-tool backup --out`` from the live cluster."""
KIND_OFFLINE = "offline"
"""Made by ``cluster-tool backup --from-dir`` from a stopped member's directory."""


class ManifestError(Exception):
    """The directory holds no manifest this program reads (the reason in words)."""


def read_manifest(directory: Path) -> tuple[dict[str, Any], bytes]:
    """The manifest of the backup in ``directory`` and its bytes (to tell whether it
    changed since); :class:`ManifestError` when there is none or it will not do."""
    path = directory / MANIFEST
    try:
        data = read_regular(path, MAX_SIZE)
    except FileNotFoundError:
        raise ManifestError(f"{directory} is no backup (no {MANIFEST})") from None
    except OSError as exc:
        raise ManifestError(f"{directory} is no backup ({MANIFEST}: {exc})") from None
    try:
        manifest = json.loads(data)
    except ValueError as exc:
        raise ManifestError(f"{directory} is no backup ({MANIFEST}: {exc})") from None
    if not isinstance(manifest, dict):
        raise ManifestError(f"{directory} is no backup ({MANIFEST} holds no object)")
    if manifest.get("format") != FORMAT:
        raise ManifestError(
            f"{directory}: backup format {manifest.get('format')!r} is not {FORMAT}"
        )
    return manifest, data


def _position(manifest: dict[str, Any], key: str, *, optional: bool = False) -> int | None:
    value = manifest.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ManifestError(f"{MANIFEST}: {key} is {value!r}, not a log position")
    return value


@dataclass(frozen=True, slots=True)
class Promise:
    """The log positions a manifest promises (``log_start``/``log_end`` None: a
    ``cluster-backup`` that has pulled nothing yet)."""

    log_start: int | None
    log_end: int | None
    covers: int
    snapshot: int | None
    """The log position of the snapshot it names (None: it names none)."""
    snapshot_term: int | None

    @classmethod
    def of(cls, manifest: dict[str, Any]) -> Promise:
        """:class:`ManifestError` for a manifest whose positions are not positions."""
        start = _position(manifest, "log_start", optional=True)
        end = _position(manifest, "log_end", optional=True)
        if (start is None) != (end is None):
            raise ManifestError(f"{MANIFEST}: log_start {start} with log_end {end}")
        covers = _position(manifest, "covers")
        assert covers is not None
        snapshot = manifest.get("snapshot")
        position = term = None
        if snapshot is not None:
            if not isinstance(snapshot, dict):
                raise ManifestError(f"{MANIFEST}: snapshot is {snapshot!r}")
            position = _position(snapshot, "log_position")
            raw_term = snapshot.get("leadership_term_id")
            if isinstance(raw_term, bool) or not isinstance(raw_term, int):
                raise ManifestError(f"{MANIFEST}: the snapshot's term is {raw_term!r}")
            term = raw_term
        return cls(start, end, covers, position, term)
