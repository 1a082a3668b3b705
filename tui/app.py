"""``cluster-tui``: the live operator console of a Triarch cluster (Textual).

::

    cluster-tui --members 0=host:ingress:consensus:admin,1=...,2=...

It polls every member's admin port (``describe`` every ``--interval``, 250 ms by
default, and ``errors`` every fourth round) from one Textual worker, and shows:

- the members: role (the leader highlighted), term, commit and append positions, lag
  behind the leader, election and module state, up/down, the leader's last word from
  each follower;
- the ClusterSessions the leader knows, with closed ones kept (dimmed) for a minute;
- redirects per member and the recent ones, the committed bytes/s and messages/s, and
  an events log (elections, leader changes, snapshots, sessions, errors).

Keys: ``s`` asks for a snapshot through the client library (an ``AdminRequest``
SNAPSHOT; the ``AdminResponse`` is logged and notified), ``p`` / ``r`` suspend / resume
the cluster through the leader's admin port after a confirmation, ``q`` quits.  A member
that does not answer is shown as down and asked again every round.

The data comes from a :class:`~tui.source.ClusterSource`: :class:`~tui.source.LiveSource`
normally, a recorded one in the snapshot tests.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.widgets import DataTable, Footer, Header, Label, RichLog, Sparkline, Static

from cluster.admin_client import use_certs
from cluster.config import UsageParser, add_version, duration_seconds
from cluster.transport.tls import TlsError

from .messages import ActionDone, ClusterPolled
from .model import ClusterModel, Event, MemberRow, SessionRow, Severity
from .screens import ConfirmScreen
from .source import ActionResult, ClusterSource, LiveSource, MemberPoll, SourceError

__all__ = ["ClusterConsole", "main"]

ERRORS_EVERY = 4  # rounds between two ``errors`` fetches
ERRORS_LIMIT = 50

MEMBER_COLUMNS = (
    ("member", "id"),
    ("admin", "admin port"),
    ("status", "status"),
    ("role", "role"),
    ("term", "term"),
    ("commit", "commit"),
    ("append", "append"),
    ("lag", "lag B"),
    ("election", "election"),
    ("module", "module"),
    ("sessions", "sess"),
    ("heartbeat", "heard / error"),
)
SESSION_COLUMNS = (
    ("id", "session"),
    ("state", "state"),
    ("channel", "response channel"),
    ("activity", "last activity"),
    ("reason", "close reason"),
)
REDIRECT_COLUMNS = (("member", "member"), ("count", "redirects"))

_SEVERITY_STYLE = {"information": "", "warning": "yellow", "error": "bold red"}
_KIND_STYLE = {
    "leader": "bold magenta",
    "election": "magenta",
    "member": "cyan",
    "snapshot": "green",
    "session": "blue",
    "redirect": "bright_blue",
    "error": "red",
    "action": "bold green",
    "console": "red",
    "disk": "bold red",
}


def _fmt_int(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _fmt_rate(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    for prefix in ("", "Ki", "Mi", "Gi"):
        if value < 1024 or prefix == "Gi":
            return f"{value:,.0f} {prefix}{unit}" if not prefix else f"{value:.1f} {prefix}{unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _fmt_ms(ms: int | None) -> str:
    if ms is None:
        return "-"
    return f"{ms} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _cell_key(value: str | Text) -> object:
    if isinstance(value, Text):
        return (value.plain, str(value.style), tuple(value.spans))
    return value


def _clock_text(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


class ClusterConsole(App[None]):
    """The console (see the module docstring)."""

    CSS_PATH = "app.tcss"
    TITLE = "Triarch cluster console"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "snapshot", "Snapshot"),
        Binding("p", "suspend", "Suspend"),
        Binding("r", "resume", "Resume"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        source: ClusterSource,
        *,
        interval: float = 0.25,
        round_wait: float | None = None,
        closed_retention: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self.source = source
        self.interval = interval
        # how long a round waits for slow members before showing the others
        self.round_wait = interval if round_wait is None else round_wait
        self.clock = clock
        self.model = ClusterModel(
            source.members, closed_retention=closed_retention, wall_clock=wall_clock
        )
        self.rounds = 0
        self.events: list[Event] = []
        self.action_results: list[ActionResult] = []
        self._cells: dict[tuple[str, str, str], object] = {}
        self._busy: str | None = None
        self.sub_title = f"{len(source.members)} members, polled every {interval * 1000:.0f} ms"

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="banner")
        yield DataTable(id="members", cursor_type="none", zebra_stripes=True)
        with Horizontal(id="middle"):
            with Vertical(id="sessions-panel"):
                yield Label("ClusterSessions (leader's view; closed ones stay dimmed)")
                yield DataTable(id="sessions", cursor_type="none")
            with Vertical(id="side"):
                yield Label("Committed bytes/s (leader)")
                yield Sparkline([0.0], id="throughput")
                yield Static("waiting for samples", id="rates")
                yield Label("Redirects")
                yield DataTable(id="redirect-counts", cursor_type="none")
                yield Static("none yet", id="recent-redirects")
        yield RichLog(id="events", max_lines=2000, wrap=False)
        yield Footer()

    def on_mount(self) -> None:
        members = self.query_one("#members", DataTable)
        for key, label in MEMBER_COLUMNS:
            members.add_column(label, key=key)
        sessions = self.query_one("#sessions", DataTable)
        for key, label in SESSION_COLUMNS:
            sessions.add_column(label, key=key)
        redirects = self.query_one("#redirect-counts", DataTable)
        for key, label in REDIRECT_COLUMNS:
            redirects.add_column(label, key=key)
        self._render_all()
        self.poll_cluster()

    async def on_unmount(self) -> None:
        try:
            await self.source.aclose()
        except Exception:
            pass

    # ------------------------------------------------------------------ polling

    async def _poll_one(
        self, member_id: int, with_errors: bool
    ) -> tuple[MemberPoll, list[dict[str, Any]] | None]:
        try:
            body = await self.source.describe(member_id)
        except SourceError as exc:
            return MemberPoll(member_id, self.clock(), None, str(exc) or "no answer"), None
        except Exception as exc:
            return MemberPoll(member_id, self.clock(), None, f"{type(exc).__name__}: {exc}"), None
        poll = MemberPoll(member_id, self.clock(), body)
        records = None
        if with_errors:
            try:
                records = await self.source.errors(member_id, ERRORS_LIMIT)
            except Exception:
                records = None  # the next describe will tell whether it is down
        return poll, records

    @work(exclusive=True, group="poll")
    async def poll_cluster(self) -> None:
        """Poll every member each round; a slow member's answer joins a later round."""
        pending: dict[int, asyncio.Task[tuple[MemberPoll, list[dict[str, Any]] | None]]] = {}
        ids = [m.member_id for m in self.source.members]
        round_no = 0
        loop = asyncio.get_running_loop()
        try:
            while True:
                started = loop.time()
                with_errors = round_no % ERRORS_EVERY == 0
                for member_id in ids:
                    if member_id not in pending:
                        pending[member_id] = asyncio.ensure_future(
                            self._poll_one(member_id, with_errors)
                        )
                await asyncio.wait(pending.values(), timeout=self.round_wait)
                done = [(mid, pending.pop(mid)) for mid in ids if pending[mid].done()]
                results = []
                for mid, task in done:
                    try:
                        results.append(task.result())
                    except Exception as exc:
                        poll = MemberPoll(mid, self.clock(), None, f"{type(exc).__name__}: {exc}")
                        results.append((poll, None))
                if results:
                    self.post_message(ClusterPolled(results))
                round_no += 1
                await asyncio.sleep(max(0.0, self.interval - (loop.time() - started)))
        finally:
            for task in pending.values():
                task.cancel()

    @on(ClusterPolled)
    def _polled(self, message: ClusterPolled) -> None:
        try:
            events: list[Event] = []
            for poll, records in message.polls:
                events += self.model.apply(poll)
                if records is not None:
                    events += self.model.apply_errors(poll.member_id, records)
            self.model.expire(self.clock())
            self.rounds += 1
            self._record(events)
            self._render_all()
        except NoMatches:
            pass  # a round that ended while the app shuts down: its widgets are gone
        except Exception as exc:  # never a traceback on the operator's screen
            with suppress(NoMatches):
                self._record([self.model.event("console", f"console error: {exc!r}", "error")])

    # ------------------------------------------------------------------ rendering

    def _record(self, events: Sequence[Event]) -> None:
        if not events:
            return
        log = self.query_one("#events", RichLog)
        for event in events:
            self.events.append(event)
            line = Text()
            line.append(_clock_text(event.at) + " ", style="dim")
            line.append(f"{event.kind:<8} ", style=_KIND_STYLE.get(event.kind, ""))
            line.append(event.text, style=_SEVERITY_STYLE[event.severity])
            log.write(line)

    def _set_cell(self, table: DataTable[Any], row: str, column: str, value: str | Text) -> None:
        key = (str(table.id), row, column)
        cached = _cell_key(value)
        if self._cells.get(key) != cached:
            self._cells[key] = cached
            table.update_cell(row, column, value, update_width=True)

    def _set_row(
        self, table: DataTable[Any], row: str, values: Sequence[tuple[str, str | Text]]
    ) -> None:
        if row not in table.rows:
            table.add_row(*(v for _, v in values), key=row)
            for column, value in values:
                self._cells[(str(table.id), row, column)] = _cell_key(value)
            return
        for column, value in values:
            self._set_cell(table, row, column, value)

    def _remove_row(self, table: DataTable[Any], row: str) -> None:
        if row in table.rows:
            table.remove_row(row)
        for key in [k for k in self._cells if k[0] == table.id and k[1] == row]:
            del self._cells[key]

    def _render_all(self) -> None:
        self._render_banner()
        self._render_members()
        self._render_sessions()
        self._render_side()

    def _render_banner(self) -> None:
        model = self.model
        total = len(model.members)
        text = Text()
        if model.leader_id is not None:
            text.append(f" LEADER member {model.leader_id} ", style="bold black on green")
            text.append(f"  term {model.leader_term}")
            text.append(f"  commit position {_fmt_int(model.leader_commit)}")
        elif not any(m.known for m in model.members.values()):
            text.append(" connecting to the admin ports... ", style="bold black on yellow")
        else:
            text.append(" NO LEADER ", style="bold white on red")
            text.append("  election in progress or no quorum")
        up = model.up_count
        style = "green" if up == total else ("yellow" if up * 2 > total else "bold red")
        text.append(f"  {up}/{total} members up", style=style)
        for row in model.disk_trouble:
            text.append("  ")
            text.append(f" {row.disk.upper()}: member {row.member_id} ", style="bold white on red")
        self._set_static("#banner", text)

    def _member_values(self, row: MemberRow) -> list[tuple[str, str | Text]]:
        now = self.clock()
        if not row.known:
            status = Text("...", style="dim")
        elif row.up and row.disk:
            status = Text(f"up, {row.disk.upper()}", style="bold red")
        elif row.up:
            status = Text("up", style="green")
        elif row.last_up is None:
            status = Text("UNREACHABLE", style="bold red")
        else:
            since = f" {now - row.changed_at:.0f}s" if row.changed_at is not None else ""
            status = Text(f"DOWN{since}", style="bold red")
        if row.role == "LEADER":
            role = Text(" LEADER ", style="bold black on green")
        elif row.role == "CANDIDATE":
            role = Text("CANDIDATE", style="bold yellow")
        else:
            role = Text(row.role, style="" if row.up else "dim")
        stale = "dim" if not row.up else ""
        module = Text(row.module, style="yellow" if row.module not in ("ACTIVE", "-") else stale)
        heartbeat = "self" if row.role == "LEADER" else _fmt_ms(row.heartbeat_ms)
        return [
            ("member", str(row.member_id)),
            ("admin", row.endpoint),
            ("status", status),
            ("role", role),
            ("term", Text(_fmt_int(row.term), style=stale)),
            ("commit", Text(_fmt_int(row.commit), style=stale)),
            ("append", Text(_fmt_int(row.append), style=stale)),
            ("lag", _fmt_int(row.lag) if row.up else "-"),
            ("election", Text(row.election, style=stale)),
            ("module", module),
            ("sessions", Text(_fmt_int(row.sessions), style=stale)),
            ("heartbeat", heartbeat if row.up else Text(_clip(row.error, 20), style="red")),
        ]

    def _render_members(self) -> None:
        table = self.query_one("#members", DataTable)
        for row in self.model.members.values():
            self._set_row(table, str(row.member_id), self._member_values(row))

    def _session_values(self, row: SessionRow) -> list[tuple[str, str | Text]]:
        now = self.clock()
        if row.closed_at is not None:
            style = "dim"
            state = Text("CLOSED", style="dim red")
            activity = Text(f"closed {now - row.closed_at:.0f}s ago", style=style)
            reason_style = "dim yellow" if row.close_reason == "TIMEOUT" else style
            reason = Text(row.close_reason or "-", style=reason_style)
        else:
            style = ""
            state = Text(row.state, style="green" if row.state == "OPEN" else "yellow")
            ms = row.last_activity_ms
            activity = Text(f"{_fmt_ms(ms)} ago" if ms is not None else "-")
            reason = Text(row.close_reason or "-")
        return [
            ("id", Text(str(row.session_id), style=style)),
            ("state", state),
            ("channel", Text(row.response_channel, style=style)),
            ("activity", activity),
            ("reason", reason),
        ]

    def _render_sessions(self) -> None:
        table = self.query_one("#sessions", DataTable)
        shown = {str(sid) for sid in self.model.sessions}
        for key in [str(k.value) for k in table.rows if k.value not in shown]:
            self._remove_row(table, key)
        for sid in sorted(self.model.sessions):
            self._set_row(table, str(sid), self._session_values(self.model.sessions[sid]))

    def _render_side(self) -> None:
        model = self.model
        sparkline = self.query_one("#throughput", Sparkline)
        # a fixed window with zeros before the first sample; Sparkline scales from the
        # smallest value, so a 0 keeps the bars proportional to the rate
        samples = list(model.bytes_per_s)
        data = [0.0] * (model.history - len(samples)) + samples
        if min(data) > 0:
            data.insert(0, 0.0)
        if list(sparkline.data or []) != data:
            sparkline.data = data
        if model.bytes_per_s:
            msgs = f"{model.messages_rate:,.0f} msg/s" if model.messages_rate is not None else "-"
            peak = max(model.bytes_per_s)
            rates = (
                f"now {_fmt_rate(model.bytes_rate, 'B/s')} · peak {_fmt_rate(peak, 'B/s')}\n"
                f"leader ingress {msgs} · last {model.history} s"
            )
        else:
            rates = "waiting for a leader and two samples"
        self._set_static("#rates", rates)
        counts = self.query_one("#redirect-counts", DataTable)
        for row in model.members.values():
            self._set_row(
                counts, str(row.member_id), [("member", str(row.member_id)),
                                             ("count", _fmt_int(row.redirects))]
            )  # fmt: skip
        recent = Text()
        for r in list(model.redirects)[:3]:
            to = f"leader {r.leader_id}" if r.leader_id is not None else "no leader"
            recent.append(f"{_clock_text(r.at)} member {r.member_id} -> {to} x{r.count}\n")
        if not model.redirects:
            recent.append("none since the console started\n")
        recent.append("(which client: not reported)", style="dim")
        self._set_static("#recent-redirects", recent)

    def _set_static(self, selector: str, content: str | Text) -> None:
        key = ("static", selector, "")
        cached = _cell_key(content)
        if self._cells.get(key) != cached:
            self._cells[key] = cached
            self.query_one(selector, Static).update(content)

    # ------------------------------------------------------------------ actions

    def _refuse(self, action: str, why: str) -> None:
        self._record([self.model.event("action", f"{action} refused: {why}", "warning")])
        self.notify(f"{action} refused: {why}", title=action, severity="warning")

    def action_snapshot(self) -> None:
        if self._busy is not None:
            self._refuse("snapshot", f"{self._busy} still in progress")
            return
        self._busy = "snapshot"
        self._record([self.model.event("action", "snapshot requested (AdminRequest SNAPSHOT)")])
        self.send_action("snapshot", None)

    def action_suspend(self) -> None:
        self._confirm(
            "suspend",
            "Suspend the cluster?",
            "The leader stops accepting ingress until resumed (r).",
        )

    def action_resume(self) -> None:
        self._confirm("resume", "Resume the cluster?", "The leader accepts ingress again.")

    def _confirm(self, action: str, question: str, detail: str) -> None:
        if self._busy is not None:
            self._refuse(action, f"{self._busy} still in progress")
            return

        def answered(yes: bool | None) -> None:
            if not yes:
                self._record([self.model.event("action", f"{action} cancelled")])
                return
            leader = self.model.leader_id
            if leader is None:
                self._refuse(action, "no leader to send it to")
                return
            if self._busy is not None:
                self._refuse(action, f"{self._busy} still in progress")
                return
            self._busy = action
            self._record([self.model.event("action", f"{action} sent to leader {leader}")])
            self.send_action(action, leader)

        self.push_screen(ConfirmScreen(question, detail), answered)

    @work(group="action")
    async def send_action(self, action: str, member_id: int | None) -> None:
        try:
            if action == "snapshot":
                result = await self.source.snapshot()
            else:
                assert member_id is not None
                result = await self.source.admin_action(member_id, action)
        except Exception as exc:
            result = ActionResult(action, False, "FAILED", f"{type(exc).__name__}: {exc}")
        self.post_message(ActionDone(result))

    @on(ActionDone)
    def _action_done(self, message: ActionDone) -> None:
        with suppress(NoMatches):  # NoMatches: the app is shutting down
            self._report(message.result)

    def _report(self, result: ActionResult) -> None:
        self._busy = None
        self.action_results.append(result)
        where = f" (member {result.member_id})" if result.member_id is not None else ""
        if result.action == "snapshot":
            text = f"snapshot: AdminResponse {result.code}{where}: {result.message}"
        else:
            text = f"{result.action}: {result.code}{where}: {result.message}"
        if not result.ok and result.code == "REFUSED":
            text = f"{result.action} refused{where}: {result.message}"
        severity: Severity = "information" if result.ok else "error"
        self._record([self.model.event("action", text, severity)])
        self.notify(text, title=result.action, severity=severity)


# ---------------------------------------------------------------------- CLI


def build_parser() -> UsageParser:
    parser = UsageParser(
        prog="cluster-tui",
        description="Live operator console of a Triarch cluster (members' admin ports).",
        epilog="keys: s snapshot, p suspend, r resume (with a confirmation), q quit",
    )
    add_version(parser)
    parser.add_argument(
        "--members",
        default=os.environ.get("CLUSTER_MEMBERS", ""),
        help="0=host:ingress:consensus:admin,1=... (default: $CLUSTER_MEMBERS)",
    )
    parser.add_argument(
        "--interval", type=duration_seconds, default=0.25, help="polling interval (default 250ms)"
    )
    parser.add_argument(
        "--timeout",
        type=duration_seconds,
        default=1.0,
        help="per-member reply timeout (default 1s)",
    )
    parser.add_argument(
        "--closed-retention",
        type=duration_seconds,
        default=60.0,
        help="how long closed sessions stay listed (default 60s)",
    )
    parser.add_argument(
        "--credentials",
        default=os.environ.get("CLUSTER_CREDENTIALS"),
        help="credentials of the snapshot session, for clusters with an authenticator "
        "(default: $CLUSTER_CREDENTIALS)",
    )
    parser.add_argument(
        "--certs-dir",
        default=os.environ.get("CLUSTER_CERTS_DIR"),
        help="a client-<NAME> folder from `cluster-tool certs`, for a cluster with TLS "
        "(default: $CLUSTER_CERTS_DIR)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    members = parser.members(args.members)
    credentials = args.credentials.encode() if args.credentials else None
    try:
        use_certs(args.certs_dir)
    except TlsError as exc:
        parser.error(f"--certs-dir: {exc}")
    source = LiveSource(
        members, timeout=args.timeout, credentials=credentials, certs_dir=args.certs_dir
    )
    app = ClusterConsole(source, interval=args.interval, closed_retention=args.closed_retention)
    try:
        app.run()
    except KeyboardInterrupt:
        return 130
    return app.return_code or 0


if __name__ == "__main__":
    sys.exit(main())
