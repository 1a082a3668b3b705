"""Packaging (issue #21): one version everywhere, and a wheel that carries what the
commands need (the console's stylesheet: without it `cluster-tui` from a wheel crashed
at start)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import shutil
import struct
import subprocess
import sys
import termios
import time
import venv
import zipfile
from pathlib import Path

import pytest

from cluster import __version__
from cluster.local import members_string

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = [
    "cluster.node",
    "cluster.tool",
    "cluster.local",
    "cluster.pipeline",
    "tui.app",
    "cluster.examples.kv",
]


@pytest.mark.parametrize("module", COMMANDS)
def test_every_command_prints_the_one_version(module: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", module, "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip().endswith(f"(Triarch) {__version__}"), out.stdout


def run_console(command: list[str], wait_for: bytes, timeout: float = 60.0) -> tuple[int, bool]:
    """Run a console in a pseudo-terminal of 160x40 until its screen shows ``wait_for``,
    then press `q`; its exit code, and whether it showed ``wait_for``."""
    master, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    process = subprocess.Popen(
        command,
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env={**os.environ, "TERM": "xterm-256color"},
        start_new_session=True,
    )
    os.close(terminal)
    screen = b""

    def read(until: float, done) -> None:  # type: ignore[no-untyped-def]
        nonlocal screen
        while not done() and time.monotonic() < until:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    screen += os.read(master, 65536)
                except OSError:  # the console has exited
                    return

    try:
        read(time.monotonic() + timeout, lambda: wait_for in screen)
        shown = wait_for in screen
        os.write(master, b"q")
        read(time.monotonic() + 20, lambda: process.poll() is not None)  # keep draining
        return process.wait(5), shown
    finally:
        process.kill()
        os.close(master)


def build_wheel(into: Path) -> Path:
    """The wheel of the files the repository tracks, built in a copy of them (as from
    a fresh clone: no egg-info or build folder of an editable install to borrow from)."""
    source = into.parent / f"{into.name}-source"
    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, tracked):
        path = ROOT / name.decode()
        if path.is_file():
            (source / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, source / name.decode())
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(into), str(source)],
        check=True,
        timeout=300,
        capture_output=True,
    )
    (wheel,) = into.glob("triarch-*.whl")
    return wheel


USER_PROGRAM = """\
import client


async def main() -> None:
    async with client.connect("0=127.0.0.1:9000") as c:
        await c.offer(b"hello")
        reply: int = await c.receive()  # bytes: the library's hints say so
        print(reply)
"""


def test_the_wheel_carries_the_stylesheet_the_license_the_version_and_py_typed(
    tmp_path: Path,
) -> None:
    wheel = build_wheel(tmp_path / "dist")
    assert wheel.name.startswith(f"triarch-{__version__}-")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert "tui/app.tcss" in names
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
        metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
        assert f"Version: {__version__}" in zf.read(metadata).decode()
        # PEP 561: without the marker a user's type checker ignores the library's hints
        assert {"cluster/py.typed", "client/py.typed"} <= names
        zf.extractall(tmp_path / "installed")
    # the wheel's files as installed packages (a virtualenv whose site-packages points
    # at them), and mypy over a user's program: it reads the hints and finds the mistake
    env = tmp_path / "venv"
    venv.create(env, with_pip=False)
    (site,) = (env / "lib").glob("python3*/site-packages")
    (site / "triarch.pth").write_text(f"{tmp_path / 'installed'}\n")
    (tmp_path / "user.py").write_text(USER_PROGRAM)
    mypy = [sys.executable, "-m", "mypy", "--no-incremental", "--strict"]
    out = subprocess.run(
        [*mypy, "--python-executable", str(env / "bin" / "python"), str(tmp_path / "user.py")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert 'expression has type "bytes", variable has type "int"' in out.stdout, out.stdout
    assert "py.typed" not in out.stdout


@pytest.mark.slow
def test_installed_from_the_wheel_into_a_clean_virtualenv_the_commands_start(
    tmp_path: Path,
) -> None:
    """A new user's install: the wheel (and its dependencies from the package index)
    into a fresh virtualenv; then a node, `cluster-tool` and `cluster-tui` from there."""
    wheel = build_wheel(tmp_path / "dist")
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    bin_dir = env / "bin"
    subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "-q", str(wheel)],
        check=True,
        timeout=600,
        capture_output=True,
    )
    for command in ("cluster-node", "cluster-tool", "cluster-tui", "cluster-local", "cluster-kv"):
        out = subprocess.run(
            [str(bin_dir / command), "--version"], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, (command, out.stderr)
        assert __version__ in out.stdout
    # the console's stylesheet is where Textual looks for it, beside tui/app.py
    check = "import importlib.resources as r; print(r.files('tui').joinpath('app.tcss').is_file())"
    out = subprocess.run(
        [str(bin_dir / "python"), "-c", check], capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "True", out.stderr
    # a node from the installed package, and cluster-tool against it
    members = members_string(1)
    node = subprocess.Popen(
        [
            str(bin_dir / "cluster-node"),
            "--members",
            members,
            "--dir",
            str(tmp_path / "data"),
            "--service",
            "cluster.examples.echo:EchoService",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            out = subprocess.run(
                [str(bin_dir / "cluster-tool"), "--members", members, "describe"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            if out.returncode == 0 and "LEADER" in out.stdout:
                break
            assert time.monotonic() < deadline, out.stdout + out.stderr
            time.sleep(0.5)
        # and the console, in a terminal, shows the leader and quits on `q`
        code, shown = run_console([str(bin_dir / "cluster-tui"), "--members", members], b"LEADER")
        assert shown
        assert code == 0
    finally:
        node.terminate()
        assert node.wait(timeout=20) == 0
