"""What the console's panels show, as Rich text: pure functions of the model's rows (no
widgets here, so the app only places them)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.text import Text

from cluster.tool.render import duration
from cluster.transport.tls import is_tls_problem

from .events import Event
from .graph import bars, fmt_rate, nice_scale
from .headline import fmt_int, tls_state
from .model import ClusterModel, MemberRow, SessionRow
from .source import ADMIN_RESPONSE_CODES, ActionResult
from .timings import timing_text

__all__ = [
    "HEALTH_COLUMNS",
    "MEMBER_COLUMNS",
    "REDIRECT_COLUMNS",
    "SESSION_COLUMNS",
    "Cell",
    "action_text",
    "banner_text",
    "cell_key",
    "clock_text",
    "event_line",
    "fmt_bytes",
    "fmt_duration",
    "graph_text",
    "health_values",
    "member_values",
    "session_values",
    "snapshot_text",
]

Cell = str | Text

MEMBER_COLUMNS = (
    ("member", "id"),
    ("status", "status"),
    ("role", "role"),
    ("term", "term"),
    ("commit", "commit"),
    ("append", "append"),
    ("snapshot", "last snapshot"),
    ("lag", "lag B"),
    ("lag_s", "lag s"),
    ("election", "election"),
    ("module", "module"),
    ("sessions", "sess"),
    ("heartbeat", "heard / error"),
)
HEALTH_COLUMNS = (
    ("member", "id"),
    ("version", "version"),
    ("uptime", "uptime"),
    ("archive", "archive"),
    ("fsync", "fsync"),
    ("cycle", "duty cycle"),
    ("commit_repl", "commit (L) / repl (F)"),
    ("changes", "ldr chg"),
    ("admin", "admin port"),
)
SESSION_COLUMNS = (
    ("id", "session"),
    ("state", "state"),
    ("channel", "response channel"),
    ("activity", "last activity"),
    ("reason", "close reason"),
)
REDIRECT_COLUMNS = (("member", "member"), ("count", "client redirects"))

SEVERITY_STYLE = {"information": "", "warning": "yellow", "error": "bold red"}
KIND_STYLE = {
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
TONE_STYLE = {
    "ok": "bold black on green",
    "info": "bold black on cyan",
    "warn": "bold black on yellow",
    "bad": "bold white on red",
}
GRAPH_HEIGHT = 5
AXIS_WIDTH = 11


def cell_key(value: Cell) -> object:
    """What a cell is compared by, to skip updates that change nothing."""
    if isinstance(value, Text):
        return (value.plain, str(value.style), tuple(value.spans))
    return value


def fmt_ms(ms: int | None) -> str:
    if ms is None:
        return "-"
    return f"{ms} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def fmt_bytes(value: int | None) -> str:
    if value is None:
        return "-"
    return fmt_rate(float(value), "B")


def fmt_duration(seconds: float | None) -> str:
    """``42s``, ``3m12s``, ``5h03m``, ``2d04h`` (as ``cluster-tool`` writes them)."""
    return "-" if seconds is None else duration(seconds)


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def clock_text(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def event_line(event: Event) -> Text:
    line = Text()
    line.append(clock_text(event.at) + " ", style="dim")
    line.append(f"{event.kind:<8} ", style=KIND_STYLE.get(event.kind, ""))
    line.append(event.text, style=SEVERITY_STYLE[event.severity])
    return line


def banner_text(model: ClusterModel) -> Text:
    verdict = model.headline
    text = Text()
    text.append(f" {verdict.state} ", style=TONE_STYLE[verdict.tone])
    text.append(f"  {verdict.detail}")
    total = len(model.members)
    up = model.up_count
    if model.stopped_at is not None:
        style = "dim"
    else:
        style = "green" if up == total else ("yellow" if up * 2 > total else "bold red")
    text.append(f"  {up}/{total} members up", style=style)
    for row in model.disk_trouble:
        text.append("  ")
        text.append(f" {row.disk.upper()}: member {row.member_id} ", style="bold white on red")
    return text


def status_cell(row: MemberRow, now: float) -> Text:
    if not row.known:
        return Text("...", style="dim")
    if row.up and row.disk:
        return Text(f"up, {row.disk.upper()}", style="bold red")
    if row.up:
        return Text("up", style="green")
    if row.stopped == "shut down":
        return Text("SHUT DOWN", style="cyan")
    if row.stopped:
        return Text("STOPPED", style="yellow")
    if is_tls_problem(row.error):
        return Text(tls_state(row.error), style="bold red")
    if row.last_up is None:
        return Text("UNREACHABLE", style="bold red")
    since = f" {now - row.changed_at:.0f}s" if row.changed_at is not None else ""
    return Text(f"DOWN{since}", style="bold red")


def member_values(row: MemberRow, now: float) -> list[tuple[str, Cell]]:
    if row.role == "LEADER":
        style = "bold black on green" if row.module == "ACTIVE" else "bold black on yellow"
        role = Text(" LEADER ", style=style)
    elif row.role == "CANDIDATE":
        role = Text("CANDIDATE", style="bold yellow")
    elif row.catching_up and row.up:
        role = Text(f"{row.role} (catching up)", style="bold yellow")
    else:
        role = Text(row.role, style="" if row.up else "dim")
    stale = "dim" if not row.up else ""
    module = Text(row.module, style="bold yellow" if row.module not in ("ACTIVE", "-") else stale)
    heartbeat = "self" if row.role == "LEADER" else fmt_ms(row.heartbeat_ms)
    lag_s = "-" if row.lag_s is None or not row.up else f"{row.lag_s:.3f}"
    return [
        ("member", str(row.member_id)),
        ("status", status_cell(row, now)),
        ("role", role),
        ("term", Text(fmt_int(row.term), style=stale)),
        ("commit", Text(fmt_int(row.commit), style=stale)),
        ("append", Text(fmt_int(row.append), style=stale)),
        ("snapshot", Text(snapshot_text(row), style=stale)),
        ("lag", fmt_int(row.lag) if row.up else "-"),
        ("lag_s", lag_s),
        ("election", Text(row.election, style=stale)),
        ("module", module),
        ("sessions", Text(fmt_int(row.sessions), style=stale)),
        ("heartbeat", heartbeat if row.up else Text(clip(row.error, 20), style="red")),
    ]


def snapshot_text(row: MemberRow) -> str:
    """A member's last snapshot: its log position and age (``22,389 · 3m02s ago``)."""
    if row.snapshot_position is None:
        return "-"
    if row.snapshot_age_s is None:
        return fmt_int(row.snapshot_position)
    return f"{fmt_int(row.snapshot_position)} · {fmt_duration(row.snapshot_age_s)} ago"


def health_values(row: MemberRow, model: ClusterModel) -> list[tuple[str, Cell]]:
    stale = "dim" if not row.up else ""
    if row.role == "LEADER":
        commit_repl = Text(timing_text(row.commit_time), style=stale)
    elif row.up and model.leader_id is not None:
        commit_repl = Text(timing_text(model.replication_time(row.member_id)))
    else:
        commit_repl = Text("-", style=stale)
    return [
        ("member", str(row.member_id)),
        ("version", Text(row.version or "-", style=stale)),
        ("uptime", Text(fmt_duration(row.uptime_s) if row.up else "-", style=stale)),
        ("archive", Text(fmt_bytes(row.archive_bytes), style=stale)),
        ("fsync", Text(timing_text(row.fsync) if row.up else "-", style=stale)),
        ("cycle", Text(timing_text(row.cycle) if row.up else "-", style=stale)),
        ("commit_repl", commit_repl),
        ("changes", Text(fmt_int(row.leader_changes), style=stale)),
        ("admin", Text(row.endpoint, style=stale)),
    ]


def session_values(row: SessionRow, now: float) -> list[tuple[str, Cell]]:
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
        activity = Text(f"{fmt_ms(ms)} ago" if ms is not None else "-")
        reason = Text(row.close_reason or ("(before the console)" if row.existing else "-"))
        if row.existing and not row.close_reason:
            reason.stylize("dim")
    return [
        ("id", Text(str(row.session_id), style=style)),
        ("state", state),
        ("channel", Text(row.response_channel, style=style)),
        ("activity", activity),
        ("reason", reason),
    ]


def scale_text(scale: float) -> str:
    return fmt_rate(scale, "B/s").replace(".0 ", " ")


def graph_text(samples: Sequence[float], width: int, height: int = GRAPH_HEIGHT) -> Text:
    """The throughput bars with their scale: the full height's value at the top, 0 at
    the bottom (see :mod:`tui.graph`)."""
    width = max(8, width - AXIS_WIDTH)
    scale = nice_scale(samples[-width:])
    rows = bars(samples, scale, height, width)
    text = Text()
    for i, row in enumerate(rows):
        if i == 0:
            label = scale_text(scale)
        elif i == height - 1:
            label = "0"
        else:
            label = ""
        tick = "┤" if label else "│"
        text.append(f"{label:>{AXIS_WIDTH - 1}}{tick}", style="dim")
        text.append(row, style="green")
        if i < height - 1:
            text.append("\n")
    return text


def action_text(result: ActionResult) -> str:
    """The events log's line for an action's outcome: an AdminResponse is named only when
    there was one."""
    where = f" (member {result.member_id})" if result.member_id is not None else ""
    if result.code == "REFUSED":
        return f"{result.action} refused{where}: {result.message}"
    if result.action == "snapshot":
        if result.code in ADMIN_RESPONSE_CODES:
            return f"snapshot: AdminResponse {result.code}{where}: {result.message}"
        return f"snapshot failed, no AdminResponse{where}: {result.message}"
    return f"{result.action}: {result.code}{where}: {result.message}"
