"""Where ``c`` (screenshot) writes: an SVG file in a directory it creates if missing."""

from __future__ import annotations

import time
from pathlib import Path

__all__ = ["save_screenshot"]


def save_screenshot(
    svg: str, directory: Path, filename: str | None = None, now: float | None = None
) -> Path:
    """Write ``svg`` to ``directory/filename`` (default ``cluster-tui-YYYYmmdd-HHMMSS.svg``,
    with ``-2``, ``-3``... if taken) and return the absolute path; the directory is
    created if missing.  :class:`OSError` (naming the path) when it cannot be written."""
    directory = directory.expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    if filename is None:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
        path = directory / f"cluster-tui-{stamp}.svg"
        n = 2
        while path.exists():
            path = directory / f"cluster-tui-{stamp}-{n}.svg"
            n += 1
    else:
        path = directory / (filename if filename.endswith(".svg") else f"{filename}.svg")
    path.write_text(svg, encoding="utf-8")
    return path.absolute()
