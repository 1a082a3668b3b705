"""The cluster's members (``--members``): parsing, the checks that name each typo, the
digest the member links compare, and the ingress endpoints clients are given.

``0=host:ingress:consensus:admin,1=...``: :func:`parse_members` checks the shape,
:func:`check_members` the hosts and ports (a typo of an IP address, a host that is no
host name, a port used twice); :func:`members_digest` is what a member link's hello
carries, and :func:`members_difference` says, from a peer's digest, which entries differ.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass


class ConfigError(ValueError):
    """A setting with a bad value; the message names the setting and where it came from."""


@dataclass(frozen=True, slots=True)
class MemberEndpoints:
    member_id: int
    host: str
    ingress_port: int
    consensus_port: int
    admin_port: int

    @property
    def ingress(self) -> str:
        return f"{self.host}:{self.ingress_port}"


DEFAULT_HOST = "127.0.0.1"
DEFAULT_INGRESS_PORT = 9010
DEFAULT_CONSENSUS_PORT = 9020
DEFAULT_ADMIN_PORT = 9030


def _separator_hint(text: str) -> str:
    """`` (separate members with ',', not ';')`` when ``text`` holds a character that no
    host or port has; else ``""``."""
    stray = re.search(r"[^\w.\-:\[\]%=]", text)
    if stray is None:
        return ""
    return f" (separate members with ',', not {stray.group()!r})"


def parse_members(text: str) -> list[MemberEndpoints]:
    """Parse ``0=host:ingress:consensus:admin,1=...`` into member endpoints.

    Only the shape is checked here (every entry ``id=host:port:port:port``, ids distinct):
    what a node also needs of its list (hosts that are addresses or host names, no port
    used twice) is :func:`check_members`, which :attr:`NodeConfig.member_list` applies.
    """
    members: list[MemberEndpoints] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        ident, sep, rest = part.partition("=")
        if "=" in rest:  # two members in one entry: a separator other than ','
            raise ValueError(
                f"bad member {part!r}: more than one member in one entry"
                + (_separator_hint(rest) or " (separate members with ',')")
            )
        fields = rest.rsplit(":", 3)
        if not sep or len(fields) != 4:
            raise ValueError(
                f"bad member {part!r}: expected id=host:ingress_port:consensus_port:admin_port"
                + _separator_hint(rest)
            )
        host = fields[0].strip().strip("[]")
        numbers: list[int] = []
        for field in (ident, *fields[1:]):
            try:
                numbers.append(int(field))
            except ValueError:
                raise ValueError(
                    f"bad member {part!r}: id and ports must be integers, not {field.strip()!r}"
                    + _separator_hint(field)
                ) from None
        member_id, *ports = numbers
        if member_id < 0:
            raise ValueError(f"bad member {part!r}: member id must not be negative")
        if not host or any(not 0 < p < 65536 for p in ports):
            raise ValueError(f"bad member {part!r}: empty host or port outside 1..65535")
        members.append(MemberEndpoints(member_id, host, *ports))
    if not members:
        raise ValueError("no members given")
    ids = [m.member_id for m in members]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate member ids in {text!r}")
    return members


_LABEL = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")


def host_error(host: str) -> str:
    """Why ``host`` is neither an IP address nor a valid host name (``""`` when it is one).

    A host name is dot-separated labels of 1-63 letters, digits, ``-`` (not first or
    last) and ``_`` (which container platforms' names use), at most 253 characters, with
    an optional final dot.  A name shaped like an IPv4 address (its last label all digits,
    which no top-level domain is, or three of four labels numbers: ``127.0.0.l``) is
    refused as an IP address with a typo, and so is anything with a ``:`` that is not an
    IPv6 address."""
    try:
        ipaddress.ip_address(host)
        return ""
    except ValueError:
        pass
    if ":" in host:
        return f"host {host!r} is not an IP address (nor an IPv6 address: a typo?)"
    labels = (host[:-1] if host.endswith(".") else host).split(".")
    numeric = sum(label.isdigit() for label in labels)
    if labels[-1].isdigit() or (len(labels) == 4 and numeric >= 3):
        return (
            f"host {host!r} is not an IP address (an IPv4 address is four numbers "
            "0-255 separated by dots: a typo?)"
        )
    if len(host) > 253 or not all(_LABEL.match(label) for label in labels):
        return (
            f"host {host!r} is not an IP address or a valid host name (dot-separated "
            "labels of letters, digits and '-')"
        )
    return ""


_PORTS = ("ingress", "consensus", "admin")


def _entry(member: MemberEndpoints) -> str:
    host = f"[{member.host}]" if ":" in member.host else member.host
    return (
        f"{member.member_id}={host}:{member.ingress_port}:{member.consensus_port}:"
        f"{member.admin_port}"
    )


def _canonical_host(host: str) -> str:
    """One spelling per host: IP addresses in their compressed form, names lower case
    without a final dot."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower().rstrip(".")


def check_members(members: list[MemberEndpoints], *, ports: bool = True) -> list[MemberEndpoints]:
    """``members`` if a node can use them, else :class:`ConfigError` naming the entry: a
    host that is neither an IP address nor a valid host name (:func:`host_error`), and
    with ``ports``, one member's ports not all different or one ``host:port`` in two
    members' entries (two listeners cannot share it)."""
    for member in members:
        error = host_error(member.host)
        if error:
            raise ConfigError(f"bad member {_entry(member)!r}: {error}")
    if not ports:
        return members
    used: dict[tuple[str, int], tuple[MemberEndpoints, str]] = {}
    for member in members:
        numbers = (member.ingress_port, member.consensus_port, member.admin_port)
        for i, (role, port) in enumerate(zip(_PORTS, numbers, strict=True)):
            for other_role, other in zip(_PORTS[i + 1 :], numbers[i + 1 :], strict=True):
                if port == other:
                    raise ConfigError(
                        f"bad member {_entry(member)!r}: its {role} and {other_role} ports "
                        f"are both {port} (each needs a port of its own)"
                    )
        host = _canonical_host(member.host)
        for role, port in zip(_PORTS, numbers, strict=True):
            first = used.setdefault((host, port), (member, role))
            if first[0] is not member:
                shown = f"[{member.host}]" if ":" in member.host else member.host
                raise ConfigError(
                    f"members {first[0].member_id} and {member.member_id} both use "
                    f"{shown}:{port} (member {first[0].member_id}'s {first[1]} port and "
                    f"member {member.member_id}'s {role} port): each port can be used once"
                )
    return members


_DIGEST_PART = 4
"""Bytes of SHA-256 per part of a members digest."""


def _digest_part(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()[:_DIGEST_PART]


def members_digest(members: Sequence[MemberEndpoints]) -> bytes:
    """A short, stable digest of a member list, for the member links' hello: equal for
    two lists that name the same members at the same addresses, whatever their order or
    spelling (``::1`` or ``0:0::1``, ``Host`` or ``host``).

    It is 4 bytes of SHA-256 of the member ids, then 4 bytes of SHA-256 of each member's
    entry (``id=host:ingress:consensus:admin``) in id order, so that a member that
    receives another's digest can say which entries differ (:func:`members_difference`)
    without the list itself on the wire."""
    ordered = sorted(members, key=lambda m: m.member_id)
    parts = [_digest_part(",".join(str(m.member_id) for m in ordered))]
    for m in ordered:
        canonical = dataclasses.replace(m, host=_canonical_host(m.host))
        parts.append(_digest_part(_entry(canonical)))
    return b"".join(parts)


def members_difference(
    members: Sequence[MemberEndpoints], digest: bytes
) -> tuple[bool, str] | None:
    """How the member list whose :func:`members_digest` is ``digest`` differs from
    ``members``: ``None`` when it does not (or ``digest`` is empty: a member that does
    not say), else ``(same_ids, words)``: whether both lists name the same member ids
    (then only addresses differ), and which of our entries the other list lacks."""
    ours = members_digest(members)
    if not digest or digest == ours:
        return None
    ordered = sorted(members, key=lambda m: m.member_id)
    shown = ",".join(_entry(m) for m in ordered)
    if len(digest) % _DIGEST_PART or len(digest) < _DIGEST_PART:
        return False, f"its members digest {digest.hex()} is not ours {ours.hex()} ({shown})"
    theirs = [digest[i : i + _DIGEST_PART] for i in range(0, len(digest), _DIGEST_PART)]
    mine = [ours[i : i + _DIGEST_PART] for i in range(0, len(ours), _DIGEST_PART)]
    if theirs[0] == mine[0] and len(theirs) == len(mine):
        differ = [m for m, a, b in zip(ordered, mine[1:], theirs[1:], strict=True) if a != b]
        entries = ", ".join(_entry(m) for m in differ)
        return True, (
            f"the same member ids, but its entries for "
            f"{_members_named([m.member_id for m in differ])} differ from ours ({entries})"
        )
    missing = [m for m, part in zip(ordered, mine[1:], strict=True) if part not in theirs[1:]]
    words = (
        f"other member ids (it lists {len(theirs) - 1} members, we list {len(mine) - 1}: {shown})"
    )
    if missing:
        words += (
            f"; our entries for {_members_named([m.member_id for m in missing])} "
            "are not in its list"
        )
    return False, words


def _members_named(ids: Sequence[int]) -> str:
    if len(ids) == 1:
        return f"member {ids[0]}"
    return "members " + ", ".join(str(i) for i in ids)


def format_ingress_endpoints(members: Sequence[MemberEndpoints]) -> str:
    return ",".join(f"{m.member_id}={m.ingress}" for m in members)
