"""TUI tests run on asyncio (Textual's loop): anyio's pytest plugin with the asyncio
backend for the pilot tests, ``snap_compare`` (synchronous) for the SVG snapshots.  The
root conftest leaves async tests under ``tests/tui`` alone (no Trio mark)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def utc() -> Iterator[None]:
    """Event timestamps are local time: pin the zone so snapshots match anywhere."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = old
        time.tzset()
