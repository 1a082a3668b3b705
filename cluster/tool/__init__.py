"""``cluster-tool``: query and control a running cluster through its members' admin ports.

Usage::

    cluster-tool [--members 0=host:ingress:consensus:admin,1=...] [--output table|json] \\
        [--timeout 2s] [--certs-dir DIR] COMMAND [COMMAND'S OPTIONS]

``cluster-tool COMMAND --help`` shows a command's own options; the common ones
(``--members``, ``--output``/``--json``, ``--timeout``, ``--certs-dir``) go before or after
the command's name.

Queries: ``describe`` (every member), ``health`` (every member up and healthy,
one ready leader with a quorum, ACTIVE, its disk writable),
``list-members``, ``recording-log``, ``errors`` (each member's distinct error log,
:mod:`cluster.errorlog`), ``timings`` (fsync, duty-cycle, commit and replication times)
and ``stalls`` (the event-loop stalls of :mod:`cluster.agents.stalls`).  Cluster actions
(sent to the leader, found through ``describe``, or to ``--member N``): ``snapshot``,
``suspend``, ``resume``, ``shutdown`` (snapshot, then every member stops), ``abort``
(every member stops, no snapshot).
``invalidate-latest-snapshot`` edits the recording log of ``--member N`` or of every
member.  Members only accept the cluster actions and ``invalidate-latest-snapshot`` from
a loopback address (or, with TLS, an admin principal), so run the tool on a member's host.

``certs --out DIR [--client NAME ...] [--days N]`` needs no running cluster: it makes the
cluster's certificates (:mod:`cluster.certs`) for the members of ``--members`` in ``DIR``,
reusing the CA already there and keeping the folders already made.

``--output json`` prints one JSON object per command, of a fixed shape whether members
are up or down (:mod:`cluster.tool.render`, ``docs/cluster-tool.md``).  Unreachable
members are shown as down, except when TLS is why: "member N requires TLS: pass
--certs-dir (a client-NAME folder)" (a member closed our plaintext request and answers a
TLS hello), or "TLS handshake with member N failed: " and OpenSSL's reason.  A
``--certs-dir`` that is a member's folder or holds an expired certificate is a usage
error.  Exit codes: 0 success, 1 a command refused or failed, a
member down (``describe``) or unhealthy (``health``) or no member answered, 2 usage errors.
``--members`` defaults to ``$CLUSTER_MEMBERS``.
"""

from __future__ import annotations

from .cli import COMMANDS, QUERIES, build_parser, main
from .client import (
    Result,
    Unreachable,
    describe_all,
    find_leader,
    request,
    request_all,
    use_certs,
)
from .commands import ACTIONS, Options
from .render import describe_document, describe_table

__all__ = [
    "ACTIONS",
    "COMMANDS",
    "QUERIES",
    "Options",
    "Result",
    "Unreachable",
    "build_parser",
    "describe_all",
    "describe_document",
    "describe_table",
    "find_leader",
    "main",
    "request",
    "request_all",
    "use_certs",
]
