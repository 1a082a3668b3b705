"""Root test configuration.

pytest-trio's ``trio_mode`` would claim every async test in the session, which breaks
asyncio-based tests (Textual's, the client's asyncio runs).  So trio mode stays off and
this hook marks async tests with ``pytest.mark.trio`` unless they already chose a runner
(``anyio``/``asyncio``) or live under ``tests/tui``.
"""

from __future__ import annotations

import inspect

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        if not inspect.iscoroutinefunction(item.obj):
            continue
        if "tests/tui" in str(item.path).replace("\\", "/"):
            continue
        if any(item.get_closest_marker(n) is not None for n in ("anyio", "asyncio", "trio")):
            continue
        item.add_marker(pytest.mark.trio)
