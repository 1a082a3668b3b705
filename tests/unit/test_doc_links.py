"""The documentation's links and commands hold (issue 41).

- Every relative link in ``README.md``, ``ARCHITECTURE.md``, ``CHANGELOG.md`` and
  ``docs/**/*.md`` names a file or folder that exists, and a ``#fragment`` names a
  heading of that file (as GitHub makes its anchors).
- Every command line the docs show in a shell block (```` ```sh ````, ``bash``,
  ``console``) that runs one of the project's programs (``cluster-node``,
  ``cluster-tool``, ``cluster-local``, ``cluster-backup``, ``cluster-pipeline``,
  ``cluster-tui``, their ``python -m`` forms, ``scripts/dev.py`` and ``scripts/*.py``)
  is parsed by that program's own argument parser: a flag or a command renamed in the
  code and not in the docs fails here, naming the file and the line.  What needs no
  cluster runs for real (``--help``, ``--version``: the parser prints and exits 0).
- ``docs/README.md``, the index, links every page under ``docs/`` (a new page left out
  of it fails here), and ``README.md`` links the index: the landing page reaches every
  doc.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cluster.backup.main import build_parser as backup_parser
from cluster.config import ConfigError, load_config
from cluster.config import build_parser as node_parser
from cluster.examples.kv_cli import build_parser as kv_parser
from cluster.local import build_parser as local_parser
from cluster.pipeline.__main__ import parser as pipeline_parser
from cluster.tool.cli import build_parser as tool_parser
from tui.app import build_parser as tui_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted(
    [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "CHANGELOG.md"]
    + [p for p in (ROOT / "docs").rglob("*.md") if "api" not in p.relative_to(ROOT).parts]
)
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
IMAGE = re.compile(r"!\[[^\]]*\]\((?P<target>[^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(?P<text>.+?)\s*#*\s*$", re.M)
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```", re.S | re.M)
SHELL = {"sh", "bash", "console", "shell"}
VARIABLES = {  # what the docs' shell variables stand for, to parse their commands
    "MEMBERS": "0=127.0.0.1:9010:9020:9030,1=127.0.0.1:9011:9021:9031",
    "DRILL_MEMBERS": "0=127.0.0.1:9110:9120:9130",
    "CLUSTER_MEMBERS": "0=127.0.0.1:9010:9020:9030",
    "VENV": "/opt/triarch/.venv",
    "n": "0",
}

Parser = Callable[[], argparse.ArgumentParser]
PROGRAMS: dict[str, Parser] = {
    "cluster-node": node_parser,
    "cluster.node": node_parser,
    "cluster.launch": node_parser,
    "cluster-tool": tool_parser,
    "cluster.tool": tool_parser,
    "cluster-local": local_parser,
    "cluster.local": local_parser,
    "cluster-backup": backup_parser,
    "cluster.backup": backup_parser,
    "cluster-pipeline": pipeline_parser,
    "cluster.pipeline": pipeline_parser,
    "cluster-tui": tui_parser,
    "tui.app": tui_parser,
    "cluster-kv": kv_parser,
    "cluster.examples.kv": kv_parser,
}
DEV_COMMANDS = ("demo", "test", "bench", "floor")


def _without_code(text: str) -> str:
    """``text`` with its fenced blocks blanked (a ``#`` in a shell block is no heading,
    a ``[x](y)`` in a code sample no link), line numbers kept."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, links reduced to their text,
    punctuation dropped (``-`` and ``_`` kept), spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for m in HEADING.finditer(_without_code(path.read_text())):
        base = slug(m["text"])
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    result.update(re.findall(r'<a (?:name|id)="([^"]+)"', path.read_text()))
    return result


def links() -> Iterator[tuple[str, Path, str]]:
    for doc in DOCS:
        text = _without_code(doc.read_text())
        for number, line in enumerate(text.splitlines(), 1):
            for m in (*LINK.finditer(line), *IMAGE.finditer(line)):
                target = m["target"]
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                    continue
                yield f"{doc.relative_to(ROOT)}:{number}", doc, target


def test_every_relative_link_and_anchor_resolves() -> None:
    broken = []
    checked = 0
    for where, doc, target in links():
        checked += 1
        path, _, fragment = target.partition("#")
        resolved = (doc.parent / path).resolve() if path else doc
        if not resolved.exists():
            broken.append(f"{where}: {target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{where}: {target}: no heading #{fragment} in {resolved.name}")
    assert checked >= 10  # the docs do link to each other: the pattern finds them
    assert not broken, "\n".join(broken)


INDEX = ROOT / "docs" / "README.md"


def linked_files(doc: Path) -> set[Path]:
    """The files ``doc``'s relative links name (fragments dropped), resolved."""
    found = set()
    for _, source, target in links():
        path = target.partition("#")[0]
        if source == doc and path:
            found.add((doc.parent / path).resolve())
    return found


def test_the_docs_index_links_every_page() -> None:
    pages = {p.resolve() for p in DOCS if ROOT / "docs" in p.parents and p != INDEX}
    assert len(pages) >= 10  # the pages are found
    missing = sorted(str(p.relative_to(ROOT)) for p in pages - linked_files(INDEX))
    assert not missing, f"docs/README.md does not link: {', '.join(missing)}"


def test_the_readme_links_the_docs_index() -> None:
    assert INDEX.resolve() in linked_files(ROOT / "README.md")


# ---------------------------------------------------------------------- commands


def commands() -> Iterator[tuple[str, str]]:
    """``(where, command line)`` of every line in the docs' shell blocks, continuation
    lines joined and a ``$ `` prompt dropped."""
    for doc in DOCS:
        text = doc.read_text()
        for m in FENCE.finditer(text):
            if m["lang"] not in SHELL:
                continue
            first = text.count("\n", 0, m.start("body")) + 1
            lines = m["body"].splitlines()
            index = 0
            while index < len(lines):
                number = first + index
                line = lines[index]
                while line.endswith("\\") and index + 1 < len(lines):
                    index += 1
                    line = line[:-1] + " " + lines[index].strip()
                index += 1
                line = line.strip().removeprefix("$ ")
                if line and not line.startswith("#"):
                    yield f"{doc.relative_to(ROOT)}:{number}", line


def _expand(line: str) -> str:
    line = re.sub(r"\$\(date [^)]*\)", "2026-12-07", line)
    return re.sub(
        r"\$\{?(\w+)\}?",
        lambda m: VARIABLES.get(m[1], m[0]),
        line,
    )


def _program(words: list[str]) -> tuple[str, list[str]] | None:
    """The project program a command runs and its arguments, or None (``curl``, ``pip``,
    a shell keyword...)."""
    while words and re.match(r"^\w+=", words[0]):  # VAR=value before the command
        words = words[1:]
    if not words:
        return None
    head = Path(words[0]).name
    if head in PROGRAMS:
        return head, words[1:]
    if re.fullmatch(r"python3?(\.\d+)?", head) and len(words) >= 2:
        if words[1] == "-m" and len(words) >= 3:
            return (words[2], words[3:]) if words[2] in PROGRAMS else None
        if words[1].startswith("scripts/"):
            return words[1], words[2:]
    return None


def _parse(parser: argparse.ArgumentParser, args: list[str]) -> str:
    """ "" if ``args`` parse (``--help`` and ``--version`` print, run for real), else
    the parser's complaint."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            parser.parse_args(args)
        except SystemExit as exc:
            if exc.code not in (0, None):
                return err.getvalue().strip().splitlines()[-1]
            assert out.getvalue().strip(), "--help or --version printed nothing"
    return ""


def _node(args: list[str]) -> str:
    """A node's command line: parsed, and its values checked as the node checks them
    (durations, sizes, policies, ``--members``), with no environment or config file."""
    complaint = _parse(node_parser(), args)
    if complaint or "--config" in args or "--help" in args or "--version" in args:
        return complaint
    try:
        load_config(args, environ={})
    except ConfigError as exc:
        return str(exc)
    return ""


def test_every_command_the_docs_show_parses() -> None:
    failures = []
    checked = 0
    for where, line in commands():
        expanded = _expand(line)
        if "$" in expanded or expanded.split()[0] in ("for", "do", "done"):
            continue  # a shell construct or an unknown variable: not a command to parse
        try:
            words = shlex.split(expanded, comments=True)
        except ValueError as exc:
            failures.append(f"{where}: {line}: {exc}")
            continue
        found = _program(words)
        if found is None:
            continue
        program, args = found
        checked += 1
        if program.startswith("scripts/"):
            script = ROOT / program
            if not script.exists():
                failures.append(f"{where}: {line}: no such script {program}")
            elif script.name == "dev.py" and (not args or args[0] not in DEV_COMMANDS):
                failures.append(f"{where}: {line}: dev.py has no command {args[:1]}")
            continue
        if program in ("cluster-local", "cluster.local"):
            known, node_args = local_parser().parse_known_args(args)
            complaint = _node([*node_args, "--service", known.service])
        elif PROGRAMS[program] is node_parser:
            complaint = _node(args)
        else:
            complaint = _parse(PROGRAMS[program](), args)
        if complaint:
            failures.append(f"{where}: {line}: {complaint}")
    assert checked >= 20  # the docs do show commands: the blocks are found
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(
    ("link", "expected"),
    [
        ("Quick start", "quick-start"),
        ("`cluster-tool` commands", "cluster-tool-commands"),
        ("Backup and disaster recovery", "backup-and-disaster-recovery"),
        ("What `--fsync` means (and costs)", "what---fsync-means-and-costs"),
    ],
)
def test_slugs_are_github_s(link: str, expected: str) -> None:
    assert slug(link) == expected
