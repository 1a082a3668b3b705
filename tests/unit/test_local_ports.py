"""The ports ``cluster.local`` hands out: below the kernel's ephemeral range, distinct,
free, and in a worker's own slice (a member restarted on its port must find it free)."""

from __future__ import annotations

import socket

import pytest

from cluster import local


def test_ports_are_distinct_free_and_below_the_ephemeral_range() -> None:
    ports = local.free_ports(9) + local.free_ports(9)
    assert len(set(ports)) == 18
    whole = local.port_range()
    assert all(p in whole for p in ports)
    assert all(p < local._ephemeral_start() for p in ports)
    for port in ports:
        assert local._bindable("127.0.0.1", port)


def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        monkeypatch.setenv(local.PORTS_VARIABLE, f"{port}-{port + 99}")
        local._cursors[local.port_range()] = 0  # the walk starts at the held port
        chosen = local.free_ports(3)
    assert port not in chosen
    assert all(port < p < port + 100 for p in chosen)


def test_a_range_too_small_falls_back_to_ports_the_os_picks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(local.PORTS_VARIABLE, "20000-20002")
    ports = local.free_ports(2)
    assert len(set(ports)) == 2
    assert all(p >= local._ephemeral_start() for p in ports)


def test_no_free_port_left_in_the_range_is_an_error_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(local.PORTS_VARIABLE, "21000-21099")
    monkeypatch.setattr(local, "_bindable", lambda host, port: False)  # every one taken
    with pytest.raises(OSError, match="fewer than 2 free ports in 21000-21099"):
        local.free_ports(2)
