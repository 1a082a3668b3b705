"""The cluster's certificates: a small PKI for mutual TLS (``cluster-tool certs``).

Layout of ``DIR``::

    DIR/ca.crt, DIR/ca.key          the cluster CA (EC P-256, 10 years)
    DIR/member-<id>/                one folder per member
    DIR/client-<NAME>/              one per client principal (admin and app always)

Every folder holds ``ca.crt``, ``tls.crt`` and ``tls.key`` (what
:func:`cluster.transport.tls.load_identity` reads).  Keys are written mode 0600, folders
0700.  A member's certificate is named ``member-<id>`` (OU ``member``) and carries its
host from ``--members`` plus ``localhost`` and ``127.0.0.1``; a client's is named after
the principal (OU ``client``).  Both may serve and dial (EKU serverAuth and clientAuth).

When ``DIR`` already holds a CA it is reused, and only the folders that are missing are
made: an operator adds a client principal later with the same command.  A folder is
written under a temporary name and renamed into place, so an interrupted run leaves no
half-made folder behind.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .fileio import write_all

ORGANIZATION = "triarch"
CA_NAME = "triarch cluster CA"
CA_DAYS = 3650
DEFAULT_DAYS = 825
DEFAULT_CLIENTS = ("admin", "app")
MEMBER_ROLE = "member"
CLIENT_ROLE = "client"
MEMBER_PREFIX = "member-"
CLIENT_PREFIX = "client-"
CA_CERT = "ca.crt"
CA_KEY = "ca.key"
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"

_CLIENT_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_BACKDATE = dt.timedelta(hours=1)
"""Certificates start an hour in the past, so a member whose clock is a little behind
accepts them at once."""


def check_client_name(name: str) -> str:
    """``name`` if it may name a client principal, else a ``ValueError`` saying why."""
    if not _CLIENT_NAME.fullmatch(name):
        raise ValueError(
            f"bad client name {name!r}: use 1 to 64 of the characters A-Z a-z 0-9 _ . -"
        )
    if name.startswith(MEMBER_PREFIX):
        raise ValueError(f"bad client name {name!r}: {MEMBER_PREFIX}* names are for members")
    return name


def member_folder(out: Path, member_id: int) -> Path:
    return out / f"{MEMBER_PREFIX}{member_id}"


def client_folder(out: Path, name: str) -> Path:
    return out / f"{CLIENT_PREFIX}{name}"


def client_names(clients: Sequence[str] = ()) -> list[str]:
    """The client principals a PKI gets: ``admin``, ``app``, then each of ``clients``
    (checked, without repeats)."""
    names: list[str] = []
    for name in (*DEFAULT_CLIENTS, *clients):
        check_client_name(name)
        if name not in names:
            names.append(name)
    return names


def planned_folders(
    out: Path, members: Sequence[tuple[int, str]], clients: Sequence[str] = ()
) -> list[Path]:
    """Every folder :func:`make_certs` makes or keeps for these members and clients, in
    order: members, then clients."""
    return [member_folder(out, member_id) for member_id, _ in members] + [
        client_folder(out, name) for name in client_names(clients)
    ]


def make_certs(
    out: Path,
    members: Sequence[tuple[int, str]],
    clients: Sequence[str] = (),
    days: int = DEFAULT_DAYS,
) -> list[Path]:
    """Make (or complete) the cluster PKI in ``out``; return the folders created.

    ``members`` are ``(member_id, host)`` pairs; ``clients`` names client principals
    besides ``admin`` and ``app``.  Everything is checked before anything is written:
    a bad name, id, host or ``days`` raises ``ValueError``; a CA in ``out`` that is
    incomplete or unreadable raises ``ValueError`` naming the file; a directory that
    cannot be written raises ``OSError``.
    """
    out = Path(out)
    if days <= 0:
        raise ValueError(f"days must be positive, not {days}")
    hosts = _check_members(members)
    names = client_names(clients)

    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca_cert, ca_key = _load_or_make_ca(out)
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)

    created: list[Path] = []
    for member_id, host in hosts:
        folder = member_folder(out, member_id)
        if not folder.exists():
            sans = _member_sans(host)
            leaf = _leaf(folder.name, MEMBER_ROLE, sans, ca_cert, ca_key, days)
            _write_folder(folder, ca_pem, *leaf)
            created.append(folder)
    for name in names:
        folder = client_folder(out, name)
        if not folder.exists():
            leaf = _leaf(name, CLIENT_ROLE, [], ca_cert, ca_key, days)
            _write_folder(folder, ca_pem, *leaf)
            created.append(folder)
    return created


# ---------------------------------------------------------------------- internals


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _check_members(members: Sequence[tuple[int, str]]) -> list[tuple[int, str]]:
    checked: list[tuple[int, str]] = []
    seen: set[int] = set()
    for member_id, host in members:
        if isinstance(member_id, bool) or not isinstance(member_id, int) or member_id < 0:
            raise ValueError(f"bad member id {member_id!r}: must be an integer >= 0")
        if member_id in seen:
            raise ValueError(f"duplicate member id {member_id}")
        seen.add(member_id)
        host = host.strip().strip("[]")
        if not host or not host.isascii() or any(c.isspace() for c in host):
            raise ValueError(f"bad host {host!r} for member {member_id}")
        checked.append((member_id, host))
    if not checked:
        raise ValueError("no members given")
    return checked


def _member_sans(host: str) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for value in (host, "localhost", "127.0.0.1"):
        try:
            name: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(value))
        except ValueError:
            name = x509.DNSName(value.lower())
        if name not in names:
            names.append(name)
    return names


def _subject(common_name: str, unit: str | None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION)]
    if unit is not None:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, unit))
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _key_usage(
    *, digital_signature: bool = False, key_cert_sign: bool = False, crl_sign: bool = False
) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=crl_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _load_or_make_ca(out: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = out / CA_CERT, out / CA_KEY
    have_cert, have_key = cert_path.exists(), key_path.exists()
    if have_cert and have_key:
        return _load_ca(cert_path, key_path)
    if have_cert or have_key:
        present, missing = (cert_path, key_path) if have_cert else (key_path, cert_path)
        raise ValueError(
            f"{present} exists but {missing} does not: restore it, or remove {present} "
            "to make a new CA (then every certificate must be made again)"
        )
    key = _new_key()
    now = _now()
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_subject(CA_NAME, None))
        .issuer_name(_subject(CA_NAME, None))
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(key_cert_sign=True, crl_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_file(key_path, _key_pem(key), 0o600)
    _write_file(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert, key


def _load_ca(
    cert_path: Path, key_path: Path
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the CA certificate {cert_path}: {exc}") from None
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(f"cannot read the CA key {key_path}: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{key_path} is not an EC private key")
    if key.public_key() != cert.public_key():
        raise ValueError(f"{key_path} is not the key of {cert_path}")
    return cert, key


def _leaf(
    common_name: str,
    role: str,
    sans: list[x509.GeneralName],
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    days: int,
) -> tuple[bytes, bytes]:
    """A certificate signed by the CA and its key, both PEM."""
    key = _new_key()
    now = _now()
    # A reused CA may expire first: no certificate outlives its issuer.
    not_after = min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_subject(common_name, role))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(digital_signature=True), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def _write_file(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # exactly, whatever the umask
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_folder(folder: Path, ca_pem: bytes, cert_pem: bytes, key_pem: bytes) -> None:
    temporary = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        os.chmod(temporary, 0o700)
        _write_file(temporary / CA_CERT, ca_pem, 0o644)
        _write_file(temporary / CERT_FILE, cert_pem, 0o644)
        _write_file(temporary / KEY_FILE, key_pem, 0o600)
        os.rename(temporary, folder)
    except BaseException:
        for child in temporary.iterdir() if temporary.exists() else ():
            child.unlink()
        if temporary.exists():
            temporary.rmdir()
        raise
