"""``cluster-tui``: the live operator console of a Triarch cluster (Textual).

::

    cluster-tui --members 0=host:ingress:consensus:admin,1=...,2=...

It polls every member's admin port (``describe`` every ``--interval``, 250 ms by
default, and ``errors`` every fourth round) from one Textual worker, and shows
(``docs/console.md`` has the whole tour):

- a banner: the leader and its term, or what the leader's module is doing (SUSPENDED,
  SNAPSHOT, SHUTTING DOWN), or why there is no leader (election, nobody answering, the
  cluster STOPPED / SHUT DOWN);
- the members: role, term, commit and append positions, the last snapshot (its log
  position and age), lag behind the leader (bytes
  and seconds), election and module state, up / DOWN / SHUT DOWN / STOPPED, the
  leader's last word from each follower; and their health: version, uptime, archive
  size, fsync, duty-cycle and commit (leader) or replication (followers) times;
- the ClusterSessions the leader knows, with closed ones kept (dimmed) for a minute;
- the committed bytes/s on a printed scale, client redirects per member, and a
  scrollable, filterable events log.

Keys: ``s`` asks the leader for a snapshot through the client library (an
``AdminRequest`` SNAPSHOT in a session opened at the leader only; without a leader
nothing is sent), ``p`` / ``r`` suspend / resume the cluster through the leader's admin
port after a confirmation, ``f`` cycles the events filter, ``c`` saves an SVG
screenshot under ``--screenshot-dir`` (and says where, or why not), ``q`` quits.

The data comes from a :class:`~tui.source.ClusterSource`: :class:`~tui.source.LiveSource`
normally, a recorded one in the snapshot tests.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Label, RichLog, Static

from cluster.admin_client import use_certs
from cluster.cli import (
    CLIENT_CERTS_VARIABLE,
    UsageParser,
    add_members,
    add_version,
    duration_seconds,
)
from cluster.transport.tls import TlsError

from .events import FILTERS, Event, Severity
from .graph import fmt_rate
from .messages import ActionDone, ClusterPolled
from .model import ClusterModel
from .render import (
    HEALTH_COLUMNS,
    MEMBER_COLUMNS,
    REDIRECT_COLUMNS,
    SESSION_COLUMNS,
    Cell,
    action_text,
    banner_text,
    cell_key,
    clock_text,
    event_line,
    graph_text,
    health_values,
    member_values,
    session_values,
)
from .screens import ConfirmScreen
from .shots import save_screenshot
from .source import ActionResult, ClusterSource, LiveSource, MemberPoll, SourceError

__all__ = ["ClusterConsole", "main"]

ERRORS_EVERY = 4  # rounds between two ``errors`` fetches
ERRORS_LIMIT = 50
EVENTS_KEPT = 5000  # lines of the events log kept (and scrollable)
OWN_SESSION_GRACE = 30.0  # seconds a redirect may still be the console's own session's


class ClusterConsole(App[None]):
    """The console (see the module docstring)."""

    CSS_PATH = "app.tcss"
    TITLE = "Triarch cluster console"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "snapshot", "Snapshot"),
        Binding("p", "suspend", "Suspend"),
        Binding("r", "resume", "Resume"),
        Binding("f", "filter", "Filter events"),
        Binding("c", "screenshot", "Screenshot"),
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
        screenshot_dir: str | Path | None = None,
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
        self.events: deque[Event] = deque(maxlen=EVENTS_KEPT)
        self.event_filter = 0  # index into FILTERS
        self.screenshot_dir = Path(screenshot_dir) if screenshot_dir is not None else Path.cwd()
        self.screenshots: list[Path] = []
        self.action_results: list[ActionResult] = []
        self._cells: dict[tuple[str, str, str], object] = {}
        self._busy: str | None = None
        self.sub_title = f"{len(source.members)} members, polled every {interval * 1000:.0f} ms"

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="banner")
        with Vertical(id="tables"):
            yield DataTable(id="members", cursor_type="none", zebra_stripes=True)
            yield DataTable(id="health", cursor_type="none", zebra_stripes=True)
        with Horizontal(id="middle"):
            with Vertical(id="left"):
                with Vertical(id="sessions-panel"):
                    yield Label("ClusterSessions (leader's view; closed ones stay dimmed)")
                    yield DataTable(id="sessions", cursor_type="none")
                yield RichLog(id="events", max_lines=EVENTS_KEPT, wrap=True, min_width=20)
            with Vertical(id="side"):
                yield Label("Committed bytes/s (leader)")
                yield Static(id="graph")
                yield Static("waiting for samples", id="rates")
                yield Label("Redirects of clients")
                yield DataTable(id="redirect-counts", cursor_type="none")
                yield Static("none yet", id="recent-redirects")
        yield Footer()

    def on_mount(self) -> None:
        members = self.query_one("#members", DataTable)
        for key, label in MEMBER_COLUMNS:
            members.add_column(label, key=key)
        members.border_title = "Members"
        health = self.query_one("#health", DataTable)
        for key, label in HEALTH_COLUMNS:
            health.add_column(label, key=key)
        health.border_title = "Health (times: p99 bucket bound and mean over the last 5 s)"
        sessions = self.query_one("#sessions", DataTable)
        for key, label in SESSION_COLUMNS:
            sessions.add_column(label, key=key)
        redirects = self.query_one("#redirect-counts", DataTable)
        for key, label in REDIRECT_COLUMNS:
            redirects.add_column(label, key=key)
        self._title_events()
        self._render_all()
        self.query_one("#events", RichLog).focus()
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
            events = self.model.apply_round([poll for poll, _ in message.polls])
            for poll, records in message.polls:
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
        keep = FILTERS[self.event_filter].keep
        for event in events:
            self.events.append(event)
            if keep(event):
                log.write(event_line(event))
        self._title_events()

    def _title_events(self) -> None:
        chosen = FILTERS[self.event_filter]
        shown = sum(1 for e in self.events if chosen.keep(e))
        self.query_one(
            "#events", RichLog
        ).border_title = (
            f"Events: {chosen.name} ({shown} of {len(self.events)}) · f: filter · ↑↓ PgUp: scroll"
        )

    def action_filter(self) -> None:
        """Show the next filter's events (all, warnings and errors, errors, cluster,
        sessions and redirects, console actions)."""
        self.event_filter = (self.event_filter + 1) % len(FILTERS)
        chosen = FILTERS[self.event_filter]
        log = self.query_one("#events", RichLog)
        log.clear()
        for event in self.events:
            if chosen.keep(event):
                log.write(event_line(event))
        self._title_events()

    def _set_cell(self, table: DataTable[Any], row: str, column: str, value: Cell) -> None:
        key = (str(table.id), row, column)
        cached = cell_key(value)
        if self._cells.get(key) != cached:
            self._cells[key] = cached
            table.update_cell(row, column, value, update_width=True)

    def _set_row(self, table: DataTable[Any], row: str, values: Sequence[tuple[str, Cell]]) -> None:
        if row not in table.rows:
            table.add_row(*(v for _, v in values), key=row)
            for column, value in values:
                self._cells[(str(table.id), row, column)] = cell_key(value)
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
        self._set_static("#banner", banner_text(self.model))

    def _render_members(self) -> None:
        members = self.query_one("#members", DataTable)
        health = self.query_one("#health", DataTable)
        now = self.clock()
        for row in self.model.members.values():
            self._set_row(members, str(row.member_id), member_values(row, now))
            self._set_row(health, str(row.member_id), health_values(row, self.model))

    def _render_sessions(self) -> None:
        table = self.query_one("#sessions", DataTable)
        shown = {str(sid) for sid in self.model.sessions}
        for key in [str(k.value) for k in table.rows if k.value not in shown]:
            self._remove_row(table, key)
        for sid in sorted(self.model.sessions):
            self._set_row(table, str(sid), session_values(self.model.sessions[sid], self.clock()))

    def _render_side(self) -> None:
        model = self.model
        graph = self.query_one("#graph", Static)
        width = graph.size.width or 34
        samples = list(model.bytes_per_s)
        self._set_static("#graph", graph_text(samples, width))
        if model.bytes_per_s:
            msgs = f"{model.messages_rate:,.0f} msg/s" if model.messages_rate is not None else "-"
            peak = max(model.bytes_per_s)
            rates = (
                f"now {fmt_rate(model.bytes_rate, 'B/s')} · peak {fmt_rate(peak, 'B/s')}\n"
                f"leader ingress {msgs} · bar ≈ 1 s"
            )
        else:
            rates = "waiting for a leader and two samples"
        self._set_static("#rates", rates)
        counts = self.query_one("#redirect-counts", DataTable)
        for row in model.members.values():
            self._set_row(
                counts, str(row.member_id), [("member", str(row.member_id)),
                                             ("count", f"{row.client_redirects:,}")]
            )  # fmt: skip
        recent = Text()
        for r in list(model.redirects)[:3]:
            to = f"leader {r.leader_id}" if r.leader_id is not None else "no leader"
            recent.append(f"{clock_text(r.at)} member {r.member_id} -> {to} x{r.count}\n")
        if not model.redirects:
            recent.append("none since the console started\n")
        recent.append("(since each member started; which client: not reported)", style="dim")
        self._set_static("#recent-redirects", recent)

    def _set_static(self, selector: str, content: Cell) -> None:
        key = ("static", selector, "")
        cached = cell_key(content)
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
        target, why = self.model.snapshot_target()
        if target is None:
            self._refuse("snapshot", why)
            return
        self._busy = "snapshot"
        self.model.expect_own_session(target, self.clock() + OWN_SESSION_GRACE)
        self._record(
            [
                self.model.event(
                    "action", f"snapshot requested (AdminRequest SNAPSHOT to leader {target})"
                )
            ]
        )
        self.send_action("snapshot", target)

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
            assert member_id is not None
            if action == "snapshot":
                result = await self.source.snapshot(member_id)
                # unknown (no session): a redirect there may still be the console's
                redirected = bool(result.details.get("redirected", True))
                self.model.own_session_done(member_id, redirected, self.clock())
            else:
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
        text = action_text(result)
        severity: Severity = "information" if result.ok else "error"
        self._record([self.model.event("action", text, severity)])
        self.notify(text, title=result.action, severity=severity)

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        """The palette's commands, its "Screenshot" saving where ``c`` does."""
        for command in super().get_system_commands(screen):
            if command.title == "Screenshot":
                yield SystemCommand(
                    "Screenshot",
                    f"Save an SVG of the screen in {self.screenshot_dir} (c)",
                    lambda: self.set_timer(0.1, self.action_screenshot),
                )
            else:
                yield command

    def action_screenshot(self, filename: str | None = None, path: str | None = None) -> None:
        """Save an SVG of the screen under ``--screenshot-dir`` (the command palette's
        "Save screenshot" too), and say where, or why not."""
        directory = Path(path) if path is not None else self.screenshot_dir
        try:
            saved = save_screenshot(self.export_screenshot(), directory, filename)
        except OSError as exc:
            why = exc.strerror or str(exc)
            where = exc.filename or directory
            text = f"screenshot not saved: {where}: {why}"
            self._record([self.model.event("action", text, "error")])
            self.notify(text, title="screenshot", severity="error")
            return
        self.screenshots.append(saved)
        self._record([self.model.event("action", f"screenshot saved to {saved}")])
        self.notify(str(saved), title="screenshot saved")


# ---------------------------------------------------------------------- CLI


def build_parser() -> UsageParser:
    parser = UsageParser(
        prog="cluster-tui",
        description="Live operator console of a Triarch cluster (members' admin ports).",
        epilog="keys: s snapshot, p suspend, r resume (with a confirmation), f filter the "
        "events, c save a screenshot, q quit",
    )
    add_version(parser)
    add_members(parser)
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
        default=os.environ.get(CLIENT_CERTS_VARIABLE),
        help="a client-<NAME> folder from `cluster-tool certs`, for a cluster with TLS "
        f"(default: ${CLIENT_CERTS_VARIABLE})",
    )
    parser.add_argument(
        "--screenshot-dir",
        default=os.environ.get("CLUSTER_TUI_SCREENSHOT_DIR", "."),
        help="where `c` saves screenshots, created if missing (default: "
        "$CLUSTER_TUI_SCREENSHOT_DIR, else the current directory)",
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
    app = ClusterConsole(
        source,
        interval=args.interval,
        closed_retention=args.closed_retention,
        screenshot_dir=Path(args.screenshot_dir).expanduser().absolute(),
    )
    try:
        app.run()
    except KeyboardInterrupt:
        return 130
    return app.return_code or 0


if __name__ == "__main__":
    sys.exit(main())
