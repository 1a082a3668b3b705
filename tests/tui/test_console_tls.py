"""The console against members that require TLS (issue 31): without ``--certs-dir``, or
with another cluster's client folder, it says so (TLS REQUIRED / TLS FAILED, and the
reason) instead of showing every member down.

A 2-member cluster of node processes with ``--certs-dir``; the console polls it through
the admin ports as ``cluster-tui`` does (no leader is needed: the first poll tells)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable

from cluster import admin_client
from cluster.certs import make_certs
from cluster.config import parse_members
from cluster.local import LocalCluster
from cluster.transport.tls import TlsError, tls_required
from tui.app import ClusterConsole, main
from tui.model import ClusterModel
from tui.source import LiveSource, MemberPoll

pytestmark = pytest.mark.anyio

SIZE = (160, 40)
MEMBERS = 2


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("console-tls-pki")
    members = [(i, "127.0.0.1") for i in range(MEMBERS)]
    make_certs(root / "ours", members)
    make_certs(root / "other", members)
    return root


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory, pki: Path) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("console-tls")
    with LocalCluster(
        MEMBERS, "cluster.examples.kv:KeyValueService", directory, certs=pki / "ours"
    ) as running:
        running.wait_ready(60)
        yield running


@pytest.fixture(autouse=True)
def plaintext_admin() -> Iterator[None]:
    """The admin client's certificates are the process's: none before and after."""
    admin_client.use_certs(None)
    yield
    admin_client.use_certs(None)


def console(members: str) -> ClusterConsole:
    return ClusterConsole(LiveSource(parse_members(members), timeout=10.0))


async def wait_for(pilot: Pilot[Any], predicate: Callable[[], object], within: float) -> None:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > within:
            pytest.fail(f"not within {within}s")
        await pilot.pause(0.05)


def cell(app: ClusterConsole, row: str, column: str) -> str:
    value = app.query_one("#members", DataTable).get_cell(row, column)
    return str(getattr(value, "plain", value))


def banner(app: ClusterConsole) -> str:
    return str(app.query_one("#banner").render())


async def test_without_certificates_the_console_says_tls_is_required(
    tls_cluster: LocalCluster,
) -> None:
    app = console(tls_cluster.members)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: all(m.known for m in app.model.members.values()), 30)
        for i in range(MEMBERS):
            row = app.model.members[i]
            assert row.error == tls_required([i]), row.error
            assert cell(app, str(i), "status") == "TLS REQUIRED"
        assert " TLS REQUIRED " in banner(app), banner(app)
        assert tls_required([0]) in banner(app)
        texts = [e.text for e in app.events]
        assert all(tls_required([i]) in texts for i in range(MEMBERS)), texts
        assert not any("unreachable" in t or "down" in t for t in texts), texts


async def test_with_another_clusters_folder_the_console_gives_the_handshakes_reason(
    tls_cluster: LocalCluster, pki: Path
) -> None:
    admin_client.use_certs(pki / "other" / "client-admin")
    app = console(tls_cluster.members)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: all(m.known for m in app.model.members.values()), 30)
        for i in range(MEMBERS):
            error = app.model.members[i].error
            assert error.startswith(f"TLS handshake with member {i} failed: certificate "
                                    "verify failed: "), error  # fmt: skip
            assert cell(app, str(i), "status") == "TLS FAILED"
        assert " TLS FAILED " in banner(app), banner(app)


def test_a_member_folder_is_refused_when_the_console_starts(
    pki: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = pki / "ours" / "member-0"
    with pytest.raises(SystemExit) as exited:
        main(["--members", "0=127.0.0.1:1:2:3", "--certs-dir", str(folder)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"{folder} is member-0's folder" in err, err
    assert f"cluster-tui needs a client-NAME folder, e.g. {pki / 'ours' / 'client-admin'}" in err
    with pytest.raises(TlsError):
        admin_client.use_certs(folder)


def test_the_model_tells_a_tls_mistake_as_it_is() -> None:
    """Without the app: a TLS reason is the event and the verdict; a member that is
    simply down stays "unreachable"."""
    model = ClusterModel(parse_members("0=h:1:2:3,1=h:4:5:6"), wall_clock=lambda: 0.0)
    events = model.apply_round(
        [MemberPoll(0, 0.0, None, tls_required([0])), MemberPoll(1, 0.0, None, "refused")]
    )
    assert [e.text for e in events] == [tls_required([0]), "member 1 unreachable: refused"]
    assert events[0].severity == "error"
    verdict = model.headline
    assert (verdict.state, verdict.detail) == ("TLS REQUIRED", tls_required([0]))
