"""``connect()``: open a session with the cluster for the length of an ``async with``
block (its arguments checked, the client's tasks started, the handshake run, the session
closed at the end), yielding the :class:`~client._client.ClusterClient`."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from cluster.protocol import DEFAULT_MAX_FRAME_SIZE

from ._client import ClusterClient
from ._credentials import CredentialsSupplier, as_credentials_supplier, load_certs
from ._endpoints import parse_endpoints
from ._exception_groups import raise_unwrapped

__all__ = ["connect"]


def _check_positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be positive, got {value!r}")


@asynccontextmanager
async def connect(
    ingress_endpoints: str,
    *,
    credentials: bytes | CredentialsSupplier | None = None,
    egress_host: str | None = None,
    connect_timeout: float = 5.0,
    keepalive_interval: float = 1.0,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    max_egress_backlog: int = 100_000,
    certs_dir: str | os.PathLike[str] | None = None,
) -> AsyncIterator[ClusterClient]:
    """Open a session with the cluster; close it when the block ends.

    ``async with client.connect("0=127.0.0.1:9010,1=127.0.0.1:9011") as c:``

    - ``ingress_endpoints``: ``"member_id=host:port,..."``; every member is tried at once,
      and a follower redirects the client to the leader.
    - ``credentials``: bytes sent in the connect request, or a
      :class:`~client.CredentialsSupplier` (which also answers challenges).
    - ``egress_host``: by default (None) the cluster sends the session's egress back on
      the client's ingress connection, so members dial nobody and a client behind a
      firewall or NAT works; given an address, the client listens there and the leader
      dials it (Aeron's response channel; members must be able to reach it).
    - ``connect_timeout``: seconds to get a session before :class:`ConnectTimeoutError`.
    - ``keepalive_interval``: idle seconds before a ``SessionKeepAlive`` is sent.
    - ``max_frame_size``: largest frame accepted on egress or offered on ingress.
    - ``max_egress_backlog``: received application messages held before ``receive()``
      fails with :class:`~client.errors.EgressBacklogExceededError`.
    - ``certs_dir``: a ``client-<NAME>`` folder from ``cluster-tool certs``: mutual TLS
      with the members (whose certificates are checked), and NAME is the principal.

    Raises :class:`SessionRejectedError`, :class:`AuthenticationRejectedError`,
    :class:`ConnectTimeoutError` (its message says what each member did: refused,
    timed out, the TLS handshake's reason...), :class:`TlsRequiredError` (a
    ``ConnectTimeoutError``, at once: every member wants TLS and no ``certs_dir`` was
    given), :class:`CertsDirError` (``certs_dir`` is no usable client folder: a
    member's, an expired certificate, a missing file), :class:`ValueError` (bad
    arguments).  Errors come out as themselves, never wrapped in an ``ExceptionGroup``.
    """
    endpoints = parse_endpoints(ingress_endpoints)
    supplier = as_credentials_supplier(credentials)
    identity = None if certs_dir is None else load_certs(certs_dir)
    _check_positive("connect_timeout", connect_timeout)
    _check_positive("keepalive_interval", keepalive_interval)
    _check_positive("max_frame_size", max_frame_size)
    _check_positive("max_egress_backlog", max_egress_backlog)
    user_error: BaseException | None = None
    try:
        async with anyio.create_task_group() as tg:
            client = ClusterClient(
                endpoints,
                credentials=supplier,
                egress_host=egress_host,
                keepalive_interval=keepalive_interval,
                max_frame_size=max_frame_size,
                max_egress_backlog=max_egress_backlog,
                identity=identity,
            )
            try:
                await tg.start(client._run)
                await client._establish(connect_timeout)
                try:
                    yield client
                except BaseException as exc:
                    user_error = exc
                    raise
            finally:
                await client.close()
    except BaseExceptionGroup as group:
        raise_unwrapped(group, user_error)
