"""Parse and format ingress endpoint lists: ``"0=host:port,1=host:port,2=host:port"``.

The same form is used for the client's ``ingress_endpoints`` option, the ``detail`` of a
REDIRECT :class:`~cluster.protocol.egress.SessionEvent` and the ``ingress_endpoints`` of a
:class:`~cluster.protocol.egress.NewLeaderEvent`.  IPv6 hosts are written in brackets:
``"0=[::1]:9010"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

__all__ = [
    "Endpoint",
    "format_endpoints",
    "merge_endpoints",
    "parse_endpoints",
    "parse_host_port",
]


class Endpoint(NamedTuple):
    """A TCP endpoint: host name or address, and port."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_host_port(text: str, *, allow_port_zero: bool = False) -> Endpoint:
    """Parse ``host:port`` (or ``[v6addr]:port``) into an :class:`Endpoint`.

    Raises :class:`ValueError` naming the problem when the text is malformed.
    """
    text = text.strip()
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise ValueError(f"endpoint {text!r}: missing ']' after IPv6 address")
        host = text[1:close]
        rest = text[close + 1 :]
        if not rest.startswith(":"):
            raise ValueError(f"endpoint {text!r}: expected ':port' after ']'")
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(f"endpoint {text!r}: expected host:port")
        if ":" in host:
            parts = text.split(":")
            if len(parts) in (3, 4) and all(p.isdigit() for p in parts[1:]):
                raise ValueError(
                    f"endpoint {text!r} looks like a --members entry "
                    "(host:ingress:consensus:admin): pass the ingress endpoints, "
                    f"e.g. {parts[0]}:{parts[1]}"
                )
            raise ValueError(f"endpoint {text!r}: write IPv6 addresses in brackets, [addr]:port")
    if not host:
        raise ValueError(f"endpoint {text!r}: empty host")
    if not port_text.isdigit() or not port_text.isascii():
        raise ValueError(f"endpoint {text!r}: port {port_text!r} is not a number")
    port = int(port_text)
    low = 0 if allow_port_zero else 1
    if not low <= port <= 65535:
        raise ValueError(f"endpoint {text!r}: port {port} outside {low}..65535")
    return Endpoint(host, port)


def parse_endpoints(text: str) -> dict[int, Endpoint]:
    """Parse ``"0=host:port,1=host:port"`` into ``{member_id: Endpoint}`` (input order kept).

    Whitespace around entries is ignored.  Raises :class:`ValueError` for an empty list,
    an entry without ``=``, a member id that is not a non-negative integer, a duplicate
    member id, or a bad ``host:port``.
    """
    if not isinstance(text, str):
        raise TypeError(f"ingress endpoints must be a str, not {type(text).__name__}")
    if not text.strip():
        raise ValueError("ingress endpoints are empty; expected '0=host:port,1=host:port,...'")
    endpoints: dict[int, Endpoint] = {}
    for index, raw in enumerate(text.split(",")):
        entry = raw.strip()
        if not entry:
            raise ValueError(f"ingress endpoints {text!r}: entry {index} is empty")
        member, sep, address = entry.partition("=")
        member = member.strip()
        if not sep:
            raise ValueError(
                f"ingress endpoints {text!r}: entry {entry!r} must be member_id=host:port"
            )
        if not member.isdigit() or not member.isascii():
            raise ValueError(
                f"ingress endpoints {text!r}: member id {member!r} is not a non-negative integer"
            )
        member_id = int(member)
        if member_id in endpoints:
            raise ValueError(f"ingress endpoints {text!r}: member id {member_id} appears twice")
        try:
            endpoints[member_id] = parse_host_port(address)
        except ValueError as exc:
            raise ValueError(f"ingress endpoints {text!r}: member {member_id}: {exc}") from None
    return endpoints


def format_endpoints(endpoints: Mapping[int, Endpoint]) -> str:
    """Format ``{member_id: Endpoint}`` as ``"0=host:port,1=host:port"``."""
    return ",".join(f"{member_id}={endpoint}" for member_id, endpoint in endpoints.items())


def merge_endpoints(
    given: Mapping[int, Endpoint], advertised: Mapping[int, Endpoint]
) -> dict[int, Endpoint]:
    """The endpoints to dial: each member the application gave keeps its endpoint, and
    the members' advertised ones (a REDIRECT's, a NewLeaderEvent's) fill in the members
    it did not give.

    What the application gave is how *it* reaches a member: a TCP proxy, a NAT's or a
    port-forward's address, a load balancer.  A member advertises the address it binds
    (``--members``), which the client may not reach at all; moving there would strand a
    session behind a proxy at its first leader change.  Given members first, in their
    order, then the others in the order advertised."""
    merged = dict(given)
    for member_id, endpoint in advertised.items():
        merged.setdefault(member_id, endpoint)
    return merged
