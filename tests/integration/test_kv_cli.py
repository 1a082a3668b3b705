"""``cluster-kv`` against three real members, run as a user runs it (issue 43): the
console script pyproject.toml declares, in its own process, for ``get``, ``put``,
``del``, ``cas`` and ``watch``, with exit codes and ``--json``; and a watch that goes on
through a SIGKILL of the leader and a hand-over while puts go on, seeing every change
once, in log order (the command's and the library's ``KeyValueClient.watch`` both)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import trio
from test_failover import local_cluster, restart
from test_handover import tool

import client
from cluster.certs import make_certs
from cluster.examples.kv import KeyChange, KeyValueClient
from cluster.local import LocalCluster

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 60.0  # seconds any one thing may take on a busy 2-core machine


def console_script(directory: Path) -> Path:
    """The ``cluster-kv`` script as pip writes it from pyproject's ``[project.scripts]``."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["cluster-kv"].partition(":")
    path = directory / "cluster-kv"
    path.write_text(
        f"#!{sys.executable}\nimport sys\nfrom {module} import {function}\nsys.exit({function}())\n"
    )
    path.chmod(0o755)
    return path


def environment(cluster: LocalCluster | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("CLUSTER_CLIENT_CERTS_DIR", None)
    if cluster is None:
        env.pop("CLUSTER_MEMBERS", None)
    else:
        env["CLUSTER_MEMBERS"] = cluster.members
    return env


class Kv:
    """Runs the command; each run's exit code, stdout and stderr."""

    def __init__(self, script: Path, cluster: LocalCluster) -> None:
        self.script = script
        self.env = environment(cluster)

    def __call__(self, *args: str | bytes, env: dict[str, str] | None = None) -> Any:
        return subprocess.run(
            [str(self.script), *args],
            capture_output=True,
            env=self.env if env is None else env,
            timeout=DEADLINE,
            check=False,
        )

    def ok(self, *args: str | bytes) -> str:
        done = self(*args)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return str(done.stdout.decode())


class Watching:
    """``cluster-kv ... watch`` in its own process; its lines, read as they come."""

    def __init__(self, script: Path, env: dict[str, str], *args: str) -> None:
        self.process = subprocess.Popen(
            [str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        self.lines: list[str] = []
        self.errors: list[str] = []
        self._threads = [
            threading.Thread(target=self._read, args=(self.process.stdout, self.lines)),
            threading.Thread(target=self._read, args=(self.process.stderr, self.errors)),
        ]
        for thread in self._threads:
            thread.start()

    @staticmethod
    def _read(stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line.decode().rstrip("\n"))

    def wait_for(self, predicate: Any, what: str) -> None:
        deadline = time.monotonic() + DEADLINE
        while not predicate():
            assert self.process.poll() is None, (what, self.process.returncode, self.errors)
            assert time.monotonic() < deadline, (what, self.lines[-5:], self.errors)
            time.sleep(0.05)

    def interrupt(self) -> int:
        """Ctrl-C: its exit code, once it ended and its output is read."""
        self.process.send_signal(signal.SIGINT)
        code = self.process.wait(DEADLINE)
        for thread in self._threads:
            thread.join(DEADLINE)
        return code

    def kill(self) -> None:
        """Make sure it ended, and close its pipes."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for thread in self._threads:
            thread.join(DEADLINE)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


def test_cluster_kv_gets_puts_deletes_compares_and_watches(tmp_path: Path) -> None:
    with local_cluster(3, tmp_path / "data") as cluster:
        script = console_script(tmp_path)
        kv = Kv(script, cluster)
        watch = Watching(script, kv.env, "--json", "watch", "t/")
        try:
            watch.wait_for(lambda: any("watching 't/'" in e for e in watch.errors), "watching")
            assert kv.ok("put", "t/a", "1") == "OK\n"
            assert kv.ok("get", "t/a") == "1\n"
            assert json.loads(kv.ok("--json", "get", "t/a")) == {"key": "t/a", "value": "1"}
            missing = kv("get", "t/missing")
            assert (missing.returncode, missing.stdout) == (1, b"")
            assert b"'t/missing' is absent" in missing.stderr
            missing = kv("get", "--json", "t/missing")  # options after the command too
            assert missing.returncode == 1
            assert json.loads(missing.stdout) == {"key": "t/missing", "value": None}
            assert kv.ok("cas", "t/a", "1", "2") == "OK\n"
            failed = kv("cas", "t/a", "1", "3")
            assert failed.returncode == 1
            assert b"cas did not set 't/a': it holds '2'" in failed.stderr
            assert kv.ok("cas", "--absent", "t/b", "x") == "OK\n"
            failed = kv("--json", "cas", "--absent", "t/b", "y")
            assert failed.returncode == 1
            assert json.loads(failed.stdout) == {"key": "t/b", "ok": False, "value": "x"}
            assert kv.ok("del", "t/b") == "OK\n"
            assert kv("del", "t/b").returncode == 1
            assert kv.ok("put", "t/bin", b"\xff\xfeok") == "OK\n"  # not UTF-8
            assert kv.ok("get", "t/bin") == "\\xff\\xfeok\n"
            assert json.loads(kv.ok("--json", "get", "t/bin")) == {
                "key": "t/bin",
                "value_base64": "//5vaw==",
            }
            assert kv.ok("get", "--consistency", "follower", "t/a") == "2\n"
            assert kv.ok("put", "other/k", "not watched") == "OK\n"
            assert kv.ok("put", "t/last", "done") == "OK\n"
            watch.wait_for(lambda: len(watch.lines) >= 6, "six changes")
            assert watch.interrupt() == 0, watch.errors
            assert not any("Traceback" in e for e in watch.errors), watch.errors
        finally:
            watch.kill()
        changes = [json.loads(line) for line in watch.lines]
        assert [(c["key"], c.get("value", c.get("value_base64"))) for c in changes] == [
            ("t/a", "1"),
            ("t/a", "2"),
            ("t/b", "x"),
            ("t/b", None),
            ("t/bin", "//5vaw=="),
            ("t/last", "done"),
        ]
        positions = [c["position"] for c in changes]
        assert positions == sorted(set(positions))
        # the mistakes: usage (2), and no cluster there (3), each one line, no traceback
        usage = kv("cas", "t/a", "only-one")
        assert usage.returncode == 2
        assert b"cas takes KEY OLD NEW" in usage.stderr
        no_members = kv("get", "k", env=environment(None))
        assert no_members.returncode == 2
        assert b"--members is required (or set CLUSTER_MEMBERS)" in no_members.stderr
        bad = kv("--members", "0=127.0.0.1:x", "get", "k")
        assert bad.returncode == 2
        assert b"port 'x' is not a number" in bad.stderr
    nobody = kv("--timeout", "1s", "get", "k")  # the cluster has stopped
    assert nobody.returncode == 3, nobody.stderr
    assert nobody.stderr.startswith(b"cluster-kv: cannot reach the cluster: ")
    assert nobody.stderr.count(b"\n") == 1


async def puts(kv: KeyValueClient, acked: list[str], stop: trio.Event, done: trio.Event) -> None:
    """Distinct keys under w/, one at a time, until ``stop``; then ``done``."""
    for i in itertools.count():
        if stop.is_set():
            done.set()
            return
        key = f"w/{i:05d}"
        await kv.put(key, str(i).encode())
        acked.append(key)
        await trio.sleep(0.005)


def test_a_watch_sees_every_change_once_in_order_across_a_kill_and_a_hand_over(
    tmp_path: Path,
) -> None:
    seen_here: list[KeyChange] = []
    acked: list[str] = []
    faults: list[str] = []

    async def main(cluster: LocalCluster, watch: Watching) -> None:
        endpoints = cluster.ingress_endpoints
        with trio.fail_after(240):
            async with (
                client.connect(endpoints, connect_timeout=30) as c,
                KeyValueClient(c) as kv,
                client.connect(endpoints, connect_timeout=30) as w,
                KeyValueClient(w) as watcher,
                watcher.watch("w/") as changes,
                trio.open_nursery() as nursery,
            ):

                async def collect() -> None:
                    async for change in changes:
                        seen_here.append(change)

                nursery.start_soon(collect)
                await trio.to_thread.run_sync(
                    watch.wait_for,
                    lambda: any("watching" in e for e in watch.errors),
                    "watching",
                )
                stop, stopped = trio.Event(), trio.Event()
                nursery.start_soon(puts, kv, acked, stop, stopped)
                await trio.sleep(2)
                leader = c.leader_member_id
                cluster.signal(leader, signal.SIGKILL)
                faults.append(f"SIGKILL {leader}")
                await trio.to_thread.run_sync(lambda: cluster.processes[leader].wait(30))
                count = len(acked)
                with trio.fail_after(DEADLINE):
                    while len(acked) < count + 50:  # noqa: ASYNC110
                        await trio.sleep(0.05)
                await restart(cluster, leader)
                await trio.sleep(2)
                done = await trio.to_thread.run_sync(lambda: tool(cluster, "transfer-leadership"))
                assert done.returncode == 0, done.stderr
                faults.append("transfer")
                count = len(acked)
                with trio.fail_after(DEADLINE):
                    while len(acked) < count + 50:  # noqa: ASYNC110
                        await trio.sleep(0.05)
                stop.set()
                with trio.fail_after(DEADLINE):
                    await stopped.wait()
                    while len(seen_here) < len(acked):  # noqa: ASYNC110
                        await trio.sleep(0.05)
                await trio.to_thread.run_sync(
                    watch.wait_for, lambda: len(watch.lines) >= len(acked), "every change"
                )
                nursery.cancel_scope.cancel()
            assert w.replies_dropped == 0
            assert watcher.stray_changes == 0

    with local_cluster(3, tmp_path / "data") as cluster:
        watch = Watching(
            console_script(tmp_path),
            environment(cluster),
            "--json",
            "--timeout",
            "30s",
            "watch",
            "w/",
        )
        try:
            trio.run(main, cluster, watch)
            assert watch.interrupt() == 0, watch.errors
        finally:
            watch.kill()
    from_command = [json.loads(line) for line in watch.lines]
    print(
        f"\n[kv watch] {len(acked)} puts through {', '.join(faults)}; the command saw "
        f"{len(from_command)} changes, the library {len(seen_here)}",
        flush=True,
    )
    # every acknowledged put once, in the order made (one at a time: log order), nothing else
    assert [c.key for c in seen_here] == acked
    assert [c["key"] for c in from_command] == acked
    assert [c["value"] for c in from_command] == [str(int(k[2:])) for k in acked]
    positions = [c.position for c in seen_here]
    assert positions == sorted(set(positions))
    assert [c["position"] for c in from_command] == positions


def readme_kv_lines() -> list[list[str]]:
    """The README's ``cluster-kv`` command lines, as words (the comment kept last)."""
    readme = (ROOT / "README.md").read_text()
    found = []
    for line in readme.splitlines():
        if line.startswith(".venv/bin/cluster-kv "):
            command, _, comment = line.partition("#")
            found.append([*command.split(), comment.strip()])
    return found


def test_the_readme_s_cluster_kv_lines_run_as_written(tmp_path: Path) -> None:
    """The tour's lines, on a single member as the tour starts it (its ports free ones
    here): each prints what its comment says, and the watch shows the put, then stops
    on Ctrl-C with exit 0."""
    lines = readme_kv_lines()
    assert [words[3] for words in lines] == ["put", "get", "watch"]
    with LocalCluster(1, "cluster.examples.kv:KeyValueService", tmp_path / "data") as cluster:
        cluster.wait_ready(20)
        script = console_script(tmp_path)
        env = environment(None)

        def argv(words: list[str]) -> list[str]:
            assert words[0] == ".venv/bin/cluster-kv"
            assert words[1:3] == ["--members", "0=127.0.0.1:9010:9020:9030"]
            return [str(script), "--members", cluster.members, *words[3:-1]]

        (put, get, watch_line) = lines
        watch = Watching(script, env, *argv(watch_line)[1:])
        try:
            watch.wait_for(lambda: watch.errors, "watching")
            for words in (put, get):
                done = subprocess.run(argv(words), capture_output=True, env=env, timeout=60)
                assert done.returncode == 0, done.stderr
                assert done.stdout.decode() == words[-1] + "\n"
            watch.wait_for(lambda: watch.lines, "a change")
            assert watch.interrupt() == 0, watch.errors
        finally:
            watch.kill()
        assert watch.lines == ["PUT greeting hello"]


def test_cluster_kv_with_tls_needs_a_client_folder_and_says_so(tmp_path: Path) -> None:
    """A member with mutual TLS: without ``--certs-dir`` the command says TLS is required
    (exit 3), with a member's folder it is a usage error (2), with a client's folder (or
    ``CLUSTER_CLIENT_CERTS_DIR``) it works; each error one line, no traceback."""
    pki = tmp_path / "pki"
    make_certs(pki, [(0, "127.0.0.1")], ["app"])
    with LocalCluster(
        1, "cluster.examples.kv:KeyValueService", tmp_path / "data", certs=pki
    ) as cluster:
        cluster.wait_ready(60)
        kv = Kv(console_script(tmp_path), cluster)
        plain = kv("--timeout", "10s", "get", "k")
        assert plain.returncode == 3, plain.stderr
        assert plain.stderr.startswith(b"cluster-kv: cannot reach the cluster: ")
        assert b"TLS" in plain.stderr
        assert plain.stderr.count(b"\n") == 1
        member_folder = kv("--certs-dir", str(pki / "member-0"), "get", "k")
        assert member_folder.returncode == 2, member_folder.stderr
        assert member_folder.stderr.startswith(b"cluster-kv: --certs-dir: ")
        assert member_folder.stderr.count(b"\n") == 1
        assert kv.ok("--certs-dir", str(pki / "client-app"), "put", "k", "v") == "OK\n"
        env = {**kv.env, "CLUSTER_CLIENT_CERTS_DIR": str(pki / "client-app")}
        done = kv("get", "k", env=env)
        assert (done.returncode, done.stdout) == (0, b"v\n"), done.stderr
