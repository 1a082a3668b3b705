"""A backup's connection to one member's admin port: kept open across the many
``backup-read`` chunks (with TLS, one handshake), every reply checked.

:class:`Link` asks; :class:`Pull` turns the replies into a member's query, a whole
snapshot file (its records checked) and the log in chunks of whole, CRC-checked records.
Every failure is a :class:`BackupLinkError` with a reason in words (the member is
unreachable, it refused, the file went away, a record failed its check).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

from ..archive.errors import ArchiveError
from ..archive.record import RecordError, iter_records
from ..archive.snapshots import read_snapshot
from ..config import MemberEndpoints
from ..core.snapshot import SnapshotError, parse_snapshot
from ..protocol.admin import AdminCommand, AdminReply, decode_body
from ..protocol.codec import ADMIN
from ..protocol.errors import ProtocolError
from ..protocol.framing import FrameDecoder, encode_frame
from ..transport.tls import TlsIdentity, load_client_identity

MAX_REPLY = 80 << 20
"""A chunk is at most 1 MiB, or one record (at most 64 MiB) and its header."""
_ids = itertools.count(1)


class BackupLinkError(Exception):
    """No usable answer from the member (the reason in words)."""


class SnapshotDamaged(BackupLinkError):
    """The member's snapshot file fails its check (an older one may do)."""


def client_identity(folder: str | None, user: str) -> TlsIdentity | None:
    """``--certs-dir``'s client identity (an admin principal's folder), or None."""
    return None if folder is None else load_client_identity(Path(folder), user=user,
                                                            preferred="admin")  # fmt: skip


def _write_checked(into: Path, data: bytes) -> str:
    """Write a snapshot file and check it: "" when whole (its records and their
    layout), else why not (removed)."""
    into.write_bytes(data)
    try:
        parse_snapshot(read_snapshot(into))
    except (ArchiveError, SnapshotError) as exc:
        into.unlink(missing_ok=True)
        return str(exc)
    return ""


class Link:
    """One member's admin port, opened on first use, reopened after any failure."""

    def __init__(
        self, member: MemberEndpoints, tls: TlsIdentity | None, timeout: float = 10.0
    ) -> None:
        self.member = member
        self.tls = tls
        self.timeout = timeout
        self._stream: trio.abc.Stream | None = None
        self._decoder = FrameDecoder(MAX_REPLY)

    async def _open(self) -> trio.abc.Stream:
        stream: trio.abc.Stream = await trio.open_tcp_stream(
            self.member.host, self.member.admin_port
        )
        if self.tls is None:
            return stream
        tls = trio.SSLStream(stream, self.tls.client_context, server_side=False,
                             https_compatible=False)  # fmt: skip
        try:
            await tls.do_handshake()
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        return tls

    async def request(self, command: str, args: dict[str, str] | None = None) -> AdminReply:
        """The member's reply to ``command`` (``ok`` or not); BackupLinkError when none."""
        message = AdminCommand(next(_ids), command, dict(args or {}))
        done = False
        try:
            with trio.fail_after(self.timeout):
                if self._stream is None:
                    self._stream = await self._open()
                    self._decoder = FrameDecoder(MAX_REPLY)
                stream = self._stream
                await stream.send_all(encode_frame(message))
                while True:
                    data = await stream.receive_some(1 << 20)
                    if not data:
                        raise BackupLinkError("the member closed the connection")
                    for body in self._decoder.feed(data):
                        reply = ADMIN.decode(body)
                        if isinstance(reply, AdminReply) and reply.correlation_id in (
                            message.correlation_id,
                            -1,
                        ):
                            done = reply.correlation_id != -1
                            return reply
        except trio.TooSlowError:
            raise BackupLinkError(f"no reply within {self.timeout:g}s") from None
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise BackupLinkError(f"{exc.__class__.__name__}: {exc}") from None
        except ProtocolError as exc:
            raise BackupLinkError(f"bad reply: {exc}") from None
        finally:
            if not done:
                await self.aclose()

    async def aclose(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)


class Pull:
    """What a backup reads from one member (see the module docstring)."""

    def __init__(self, link: Link) -> None:
        self.link = link

    @property
    def member_id(self) -> int:
        return self.link.member.member_id

    async def _ok(self, command: str, args: dict[str, str] | None = None) -> AdminReply:
        reply = await self.link.request(command, args)
        if not reply.ok:
            raise BackupLinkError(f"member {self.member_id}: {reply.message}")
        return reply

    async def query(self) -> dict[str, Any]:
        body = decode_body((await self._ok("backup-query")).body)
        if not isinstance(body, dict):
            raise BackupLinkError(f"member {self.member_id}: backup-query answered no document")
        return body

    async def snapshot(self, entry: dict[str, Any], into: Path) -> None:
        """Write the snapshot ``entry`` (from :meth:`query`) to ``into``, whole and
        checked (every record's CRC, every message decoded)."""
        size = int(entry["size"])
        parts: list[bytes] = []
        offset = 0
        while offset < size:
            reply = await self._ok("backup-read", {
                "kind": "snapshot",
                "position": str(entry["log_position"]),
                "term": str(entry["leadership_term_id"]),
                "offset": str(offset),
            })  # fmt: skip
            if not reply.body:
                raise BackupLinkError(f"member {self.member_id}: snapshot shorter than {size}")
            parts.append(reply.body)
            offset += len(reply.body)
        problem = _write_checked(into, b"".join(parts))
        if problem:
            raise SnapshotDamaged(
                f"member {self.member_id}: the snapshot at log position "
                f"{entry['log_position']} fails its check: {problem}"
            )

    async def log(self, start: int, stop: int) -> AsyncIterator[bytes]:
        """The log ``[start, stop)`` in chunks of whole records, each CRC-checked."""
        position = start
        while position < stop:
            reply = await self._ok(
                "backup-read", {"kind": "log", "from": str(position), "stop": str(stop)}
            )
            data = reply.body
            if not data:
                raise BackupLinkError(
                    f"member {self.member_id}: no log at {position} (it holds to {stop}?)"
                )
            try:
                for _ in iter_records(data):
                    pass
            except RecordError as exc:
                raise BackupLinkError(
                    f"member {self.member_id}: the record at log position "
                    f"{position + exc.offset} fails its check ({exc.reason})"
                ) from None
            position += len(data)
            yield data
