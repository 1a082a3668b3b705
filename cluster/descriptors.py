"""File descriptors: the node's own limit raised, and its connection caps sized from it.

The common soft ``RLIMIT_NOFILE`` is 1,024, as was ``--max-connections``: issue 33 had
1,100 idle connects make ``node-state.json`` writes fail with EMFILE.  At start-up
(:func:`fit_descriptors`, called by :mod:`cluster.launch`) the node raises its soft limit
to the hard one, keeps :data:`RESERVE` descriptors for its own files and links (archive
segments, snapshots being written, read or sent, node state, the recording log, the
listening sockets, member links, the archive thread's pipe), and sizes the ports' caps from
the rest: when the configured caps need more than that, ``--max-connections`` (then
``--max-admin-connections``) is lowered, with a WARNING naming the figures.  Every port
counts its connections at accept (:mod:`cluster.transport.gate`), so the caps hold and the
reserve stays free for the writes.
"""

from __future__ import annotations

import dataclasses
import logging

from .config import NodeConfig

log = logging.getLogger("cluster.node")

RESERVE = 64
"""Descriptors kept for the node's own files and links, beyond the ports' caps."""

METRICS_CONNECTIONS = 32
"""The metrics port's cap (:data:`cluster.agents.exporter.MAX_CONNECTIONS`)."""


def raise_limit() -> tuple[int, int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (as far as the kernel allows);
    ``(soft before, soft now, hard)``; ``(-1, -1, -1)`` where there is no such limit."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not a Unix
        return -1, -1, -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        target = _nr_open()
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError):
            pass
    now = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft, now, hard


def _nr_open() -> int:
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20


def fixed_needs(config: NodeConfig) -> int:
    """Descriptors the ports other than ingress may hold at once: admin, metrics,
    consensus (each other member's link both ways, and strangers before their hello) and
    the egress connections the leader dials (one per session at most)."""
    others = max(0, len(config.member_list) - 1)
    metrics = METRICS_CONNECTIONS if config.metrics_port else 0
    consensus = 2 * others + (2 * others + 2)
    return config.max_admin_connections + metrics + consensus + config.max_concurrent_sessions


def size_connections(config: NodeConfig, limit: int) -> NodeConfig:
    """``config`` with its caps lowered to fit ``limit`` descriptors (WARNING when
    lowered); ``config`` itself when they fit or ``limit`` is unknown (negative)."""
    if limit < 0:
        return config
    fixed = fixed_needs(config)
    room = limit - RESERVE
    if config.max_connections + fixed <= room:
        return config
    admin = config.max_admin_connections
    ingress = room - fixed
    if ingress < 16:  # a tiny limit: the admin port gives way first
        admin = max(2, admin - (16 - ingress))
        ingress = max(4, room - (fixed - config.max_admin_connections + admin))
    log.warning(
        "the descriptor limit is %d: with %d kept for the node's files and links and %d "
        "for the other ports, --max-connections is lowered from %d to %d%s (raise the "
        "hard limit, ulimit -Hn, for more)",
        limit,
        RESERVE,
        fixed - config.max_admin_connections + admin,
        config.max_connections,
        ingress,
        f" and --max-admin-connections from {config.max_admin_connections} to {admin}"
        if admin != config.max_admin_connections
        else "",
    )
    return dataclasses.replace(config, max_connections=ingress, max_admin_connections=admin)


def fit_descriptors(config: NodeConfig) -> NodeConfig:
    """Raise the limit (:func:`raise_limit`), log the figures, and size the caps
    (:func:`size_connections`)."""
    before, soft, hard = raise_limit()
    if soft < 0:
        return config
    fitted = size_connections(config, soft)
    log.info(
        "descriptors: soft limit %d -> %d (hard %s); connections at most: ingress %d, "
        "admin %d, others %d; %d kept for files and links",
        before,
        soft,
        "unlimited" if hard < 0 else hard,
        fitted.max_connections,
        fitted.max_admin_connections,
        fixed_needs(fitted) - fitted.max_admin_connections,
        RESERVE,
    )
    return fitted
