"""``cluster-tool``'s commands on a data directory, with no cluster: they read the
directory and never change it (a stopped member's, or a live one's)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ..archive.identity import DataDirError, holder_pid, read_identity
from .commands import emit


def cmd_pid(directory: Path, output: str) -> int:
    """``pid --dir D``: the process holding ``D`` (Aeron's ClusterTool ``pid``); exit 1
    when no process holds it, 2 when it is no member's directory."""
    try:
        pid = holder_pid(directory)
        identity = read_identity(directory)
    except DataDirError as exc:
        print(f"cluster-tool pid: error: {exc}", file=sys.stderr)
        return 2
    if output == "json":
        emit({
            "dir": str(directory),
            "pid": pid,
            "held": pid is not None,
            "member_id": None if identity is None else identity.member_id,
            "cluster_id": None if identity is None else identity.cluster_id,
        })  # fmt: skip
    elif pid is None:
        print(f"no process holds {directory}")
    else:
        print(pid if pid else f"held by a process that wrote no pid in {directory}")
    return 0 if pid is not None else 1


def run(command: str, args: Any) -> int:
    if command == "pid":
        return cmd_pid(args.dir, args.output)
    raise AssertionError(command)
