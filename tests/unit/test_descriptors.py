"""File descriptors (issue 33): the connection caps sized from the limit, with a reserve,
and running out of descriptors never called a full disk."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest

from cluster.archive.disk import DiskHealth, failure_kind
from cluster.config import NodeConfig
from cluster.descriptors import RESERVE, fixed_needs, size_connections


def test_out_of_descriptors_is_its_own_reason(tmp_path: Path) -> None:
    assert failure_kind(OSError(errno.ENOSPC, "x")) == "disk full"
    assert failure_kind(OSError(errno.EMFILE, "x")) == "out of file descriptors"
    assert failure_kind(OSError(errno.ENFILE, "x")) == "out of file descriptors"
    assert failure_kind(OSError(errno.EIO, "x")) == "disk error"
    disk = DiskHealth(tmp_path)
    reason = disk.failed("node state", OSError(errno.EMFILE, "Too many open files"))
    assert reason.startswith("out of file descriptors: node state failed")
    assert "disk" not in reason
    assert not disk.full
    assert disk.problem == reason
    disk.succeeded("node state")
    assert disk.problem == ""


def test_caps_that_fit_are_kept() -> None:
    config = NodeConfig()
    assert size_connections(config, 1 << 20) is config
    assert size_connections(config, -1) is config


def test_caps_beyond_the_limit_are_lowered_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = NodeConfig()  # --max-connections 1024 at the common soft limit of 1,024
    with caplog.at_level(logging.WARNING, "cluster.node"):
        fitted = size_connections(config, 1024)
    assert fitted.max_connections + fixed_needs(fitted) + RESERVE <= 1024
    assert fitted.max_connections >= 900
    assert "--max-connections is lowered from 1024" in caplog.text
    tiny = size_connections(config, 100)  # the admin port gives way too
    assert tiny.max_connections >= 4
    assert tiny.max_connections + fixed_needs(tiny) + RESERVE <= 100 + 4
    assert tiny.max_admin_connections < config.max_admin_connections
