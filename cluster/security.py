"""Who may talk to a node: certificates, exposure, and the names on certificates.

* With ``--certs-dir`` (a ``member-<id>`` folder made by ``cluster-tool certs``) every
  port speaks mutual TLS (:class:`~cluster.transport.tcp.TcpNetwork`): a member link
  must present the certificate of the member it claims to be, the ingress and admin
  ports a client certificate of the same CA, whose name is the client's principal.
* Without it the node trusts every process that can reach its ports, so it listens only
  on loopback addresses: any other is refused (exit code 2) unless ``--insecure``.
"""

from __future__ import annotations

import ipaddress
import logging
import sys
from pathlib import Path

import trio

from .cli import CLIENT_CERTS_VARIABLE
from .config import ConfigError, NodeConfig
from .core.auth import AdminPrincipals, Authenticator, AuthorisationService
from .transport.tcp import TcpNetwork
from .transport.tls import PeerCert, TlsError, load_identity, peer_cert

log = logging.getLogger("cluster.node")


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]").partition("%")[0]).is_loopback
    except ValueError:
        return False


def check_exposure(config: NodeConfig) -> None:
    """Refuse to listen beyond loopback in plaintext (unless ``--insecure``)."""
    if config.certs_dir or config.insecure:
        return
    host = config.this_member.host
    if not is_loopback_host(host):
        raise ConfigError(
            f"member {config.member_id} would listen on {host}, which is not a loopback "
            "address, without TLS: anyone who reaches it could act as a member, a client "
            "or an operator. Make certificates with `cluster-tool certs --members ... "
            "--out DIR` and start each member with --certs-dir DIR/member-<id>, or pass "
            "--insecure on a network you trust."
        )


def network_for(config: NodeConfig) -> TcpNetwork:
    """The node's network: mutual TLS with ``--certs-dir``, else plain TCP."""
    if not config.certs_dir:
        return TcpNetwork()
    given = config.named("certs-dir")  # $CLUSTER_CERTS_DIR may have been exported for a tool
    try:
        identity = load_identity(Path(config.certs_dir))
    except TlsError as exc:
        raise ConfigError(f"{given}: {exc}") from None
    expected = f"member-{config.member_id}"
    if identity.role != "member" or identity.name != expected:
        hint = ""
        if given.startswith("$") and identity.role != "member":
            hint = (
                f" ({given[1:]} is the member's setting: `cluster-tool` and `cluster-tui` "
                f"read {CLIENT_CERTS_VARIABLE}; unset {given[1:]} where the member starts, "
                "or pass --certs-dir)"
            )
        raise ConfigError(
            f"{given} {config.certs_dir} holds the certificate of {identity.name!r} "
            f"({identity.role}), not of {expected!r}{hint}"
        )
    return TcpNetwork(tls=identity, handshake_timeout=config.handshake_timeout / 1e9)


def member_cert_error(stream: trio.abc.Stream, member_id: int) -> str:
    """Why ``stream`` may not carry member ``member_id``'s link ("" when it may; a
    plaintext stream may: the node runs without TLS)."""
    cert = peer_cert(stream)
    if cert is None:
        return ""
    if cert.role != "member" or cert.name != f"member-{member_id}":
        return f"certificate {cert.name!r} ({cert.role}) is not member {member_id}'s"
    return ""


def client_cert(stream: trio.abc.Stream) -> tuple[bool, PeerCert | None]:
    """``(allowed, cert)`` for a client port: a TLS peer must hold a client certificate."""
    cert = peer_cert(stream)
    is_tls = isinstance(stream, trio.SSLStream)
    if not is_tls:
        return True, None
    return cert is not None and cert.role == "client", cert


def configure_logging(level: str) -> None:
    """The node's log: stderr, one line per record (set up before anything is checked,
    so that a refused start-up says why in the same log)."""
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def admin_authorisation(
    config: NodeConfig, authenticator: Authenticator | None
) -> AuthorisationService:
    """Who may ask for admin actions (snapshot, suspend, resume, shutdown) through a
    client session: the principals of ``--admin-principals`` (``admin`` by default with
    certificates), or everyone when nothing proves a client's identity (with a warning)."""
    names = [p.strip() for p in config.admin_principals.split(",") if p.strip()]
    if config.certs_dir:  # certificates name every client: "admin" by default
        names = names or ["admin"]
    elif authenticator is None or not authenticator.enforces_identity:
        log.warning(
            "no authenticator enforces client identity: every client is anonymous and "
            "may request snapshots, suspend, resume or stop the cluster"
        )
        return AuthorisationService()
    log.info("admin actions allowed for principals: %s", sorted(names) or "none")
    return AdminPrincipals({name.encode() for name in names})
