#!/usr/bin/env python3
"""An external reference: etcd (from the system's packages) on this machine, under the
paced write loads of its own ``etcdctl check perf``.

Starts a 3-member etcd cluster on 127.0.0.1 (each member's data in a temporary folder,
its write-ahead log fsynced as etcd always does), runs ``etcdctl check perf --load L``
for each ``--loads`` (etcd 3.4's models: ``s`` 150 writes/s from 50 clients, ``m`` 1,000
from 200, ``l`` 8,000 from 500, ``xl`` 15,000 from 1,000; 60 s each, keys and values of a
few hundred bytes), and prints what it reports: the write throughput it reached, the
slowest request, the standard deviation, and whether etcd calls that a pass.  Compare
with ``scripts/probe.py --rate`` (paced) and ``scripts/bench.py`` (saturated) run just
before or after on the same machine.

    python3 scripts/etcd_reference.py --loads m l
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cluster.local import free_ports  # noqa: E402

HOST = "127.0.0.1"


def start(directory: Path) -> tuple[list[subprocess.Popen[bytes]], str]:
    ports = free_ports(6, HOST)
    peers = [f"http://{HOST}:{ports[2 * i + 1]}" for i in range(3)]
    clients = [f"http://{HOST}:{ports[2 * i]}" for i in range(3)]
    initial = ",".join(f"e{i}={peer}" for i, peer in enumerate(peers))
    processes = []
    for i in range(3):
        command = [
            "etcd", "--name", f"e{i}", "--data-dir", str(directory / f"e{i}"),
            "--listen-client-urls", clients[i], "--advertise-client-urls", clients[i],
            "--listen-peer-urls", peers[i], "--initial-advertise-peer-urls", peers[i],
            "--initial-cluster", initial, "--initial-cluster-state", "new",
            "--initial-cluster-token", "triarch-reference", "--log-level", "error",
        ]  # fmt: skip
        log = (directory / f"e{i}.log").open("wb")
        processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))
    endpoints = ",".join(clients)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        health = subprocess.run(
            ["etcdctl", "--endpoints", endpoints, "endpoint", "health"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if health.returncode == 0:
            return processes, endpoints
        time.sleep(0.5)
    stop(processes)
    raise RuntimeError(f"etcd did not become healthy: {health.stderr[-500:]}")


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


def check_perf(endpoints: str, load: str) -> dict[str, Any]:
    out = subprocess.run(
        ["etcdctl", "--endpoints", endpoints, "check", "perf", "--load", load],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    text = out.stdout + out.stderr
    throughput = re.search(r"Throughput (?:is|too low:) ([\d.]+) writes/s", text)
    slowest = re.search(r"Slowest request took (?:too long: )?([\d.]+)s", text)
    stddev = re.search(r"Stddev is ([\d.]+)s", text)
    return {
        "load": load,
        "writes_per_s": float(throughput.group(1)) if throughput else None,
        "slowest_ms": float(slowest.group(1)) * 1e3 if slowest else None,
        "stddev_ms": float(stddev.group(1)) * 1e3 if stddev else None,
        "passed": out.returncode == 0,
        "output": text.strip().splitlines()[-6:],
    }


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--loads", nargs="+", default=["m"], choices=["s", "m", "l", "xl"])
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if not (shutil.which("etcd") and shutil.which("etcdctl")):
        print("etcd and etcdctl are not installed (Debian: apt-get install etcd-server "
              "etcd-client)", file=sys.stderr)  # fmt: skip
        return 2
    version = subprocess.run(["etcd", "--version"], capture_output=True, text=True).stdout
    results = []
    with tempfile.TemporaryDirectory(prefix="triarch-etcd-") as tmp:
        for load in args.loads:  # a fresh cluster for each: no history carried over
            directory = Path(tmp) / load
            directory.mkdir()
            processes, endpoints = start(directory)
            try:
                results.append(check_perf(endpoints, load))
            finally:
                stop(processes)
    if args.json:
        print(json.dumps({"etcd": version.splitlines()[0], "results": results}))
        return 0
    print(version.splitlines()[0])
    for r in results:
        print(
            f"  load {r['load']}: {r['writes_per_s']} writes/s, slowest {r['slowest_ms']} ms, "
            f"stddev {r['stddev_ms']} ms, {'PASS' if r['passed'] else 'FAIL'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
