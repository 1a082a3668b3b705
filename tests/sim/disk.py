"""The simulator's disk: what a member wrote but has not made durable, and power cuts.

A :class:`DiskModel` keeps, for every file and directory under a simulated member's data
directory (a *root*), its **current** state (what the process sees: the real files on
disk, mirrored here) and its **durable** state (what a power cut leaves):

* a file's durable bytes are its bytes as of its last ``fsync``/``fdatasync`` (empty
  for a file never synced); a write or a truncation changes only the current bytes;
* a directory's durable entries are its entries as of its last ``fsync`` (of a
  descriptor opened on the directory itself); a creation, ``mkdir``, rename, link or
  unlink changes only the current entries.  A root made by the member itself is
  durable once the directory holding it is fsynced: until then a power cut takes it
  whole.  A directory's entries name objects, so a
  file renamed over another since the last sync of its directory is, after a power cut,
  the other file again, with that file's durable bytes.

The node writes through ``os`` (``open``, ``write``, ``pwrite``, ``ftruncate``,
``fsync``, ``fdatasync``, ``rename``, ``replace``, ``link``, ``unlink``, ``mkdir``,
``rmdir``, and ``shutil.rmtree``, which uses them with ``dir_fd``), never through the
built-in ``open`` for its data directory (checked: :meth:`DiskModel.installed` makes a
built-in ``open`` for writing under a root fail).  So :meth:`DiskModel.installed` wraps
those ``os`` functions for the time of a run: a call on a path (or a descriptor opened)
under a root is done for real and mirrored into the model; a sync is *not* done for
real (durability is tracked, not performed: that is what makes real syncs cheap in the
simulator); every other call is passed through untouched.

:meth:`DiskModel.power_cut` first checks that the real files are exactly what the
model says they are (nothing wrote around it), then puts the durable state on disk:
entries created or renamed since their directory's last sync are forgotten, removed
ones come back, and each file goes back to its durable bytes, except that its first
page (4 KiB) with unsynced bytes may be **torn** (seeded: for half the files, each
512-byte sector of it from the new bytes or the old, the file as long as the last new
sector kept).
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import io
import os
import random
import shutil
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

PAGE = 4096
SECTOR = 512

_real = {
    name: getattr(os, name)
    for name in (
        "open",
        "close",
        "write",
        "pwrite",
        "ftruncate",
        "truncate",
        "fsync",
        "fdatasync",
        "rename",
        "replace",
        "link",
        "unlink",
        "remove",
        "mkdir",
        "rmdir",
        "symlink",
    )
}
_real_open = builtins.open
_UNMODELLED = tuple(
    name
    for name in ("writev", "pwritev", "posix_fallocate", "sendfile", "copy_file_range")
    if hasattr(os, name)
)
"""Writes the node does not make: refused on a modelled descriptor, so that a new one
cannot slip past the model."""
_real.update({name: getattr(os, name) for name in _UNMODELLED})


class DiskModelError(AssertionError):
    """Something wrote under a modelled data directory around the model, or in a way
    it does not model: its power cuts would not be the truth."""


@dataclass(eq=False)
class File:
    current: bytearray = field(default_factory=bytearray)
    durable: bytearray = field(default_factory=bytearray)
    dirty_from: int | None = None
    """The lowest offset where ``current`` may differ from ``durable`` (None: equal)."""

    def _dirty(self, offset: int) -> None:
        if self.dirty_from is None or offset < self.dirty_from:
            self.dirty_from = offset

    def write(self, offset: int, data: bytes) -> None:
        size = len(self.current)
        if offset > size:
            self._dirty(size)
            self.current.extend(bytes(offset - size))
        else:
            self._dirty(offset)
        self.current[offset : offset + len(data)] = data

    def truncate(self, length: int) -> None:
        size = len(self.current)
        if length < size:
            self._dirty(length)
            del self.current[length:]
        elif length > size:
            self._dirty(size)
            self.current.extend(bytes(length - size))

    def sync(self) -> None:
        at = self.dirty_from
        if at is not None:
            del self.durable[at:]
            self.durable += self.current[at:]
            self.dirty_from = None

    def after_power_cut(self, rng: random.Random | None) -> bytearray:
        """The bytes a power cut leaves (the first unsynced page torn when ``rng``)."""
        kept = bytearray(self.durable)
        at = self.dirty_from
        if rng is None or at is None or rng.random() < 0.5:
            return kept
        page = at - at % PAGE
        new, end = self.current, len(self.durable)
        for sector in range(page, min(page + PAGE, len(new)), SECTOR):
            if rng.random() < 0.5:
                stop = min(sector + SECTOR, len(new))
                if stop > len(kept):
                    kept.extend(bytes(stop - len(kept)))
                kept[sector:stop] = new[sector:stop]
                end = max(end, stop)
        del kept[end:]
        return kept


@dataclass(eq=False)
class Dir:
    current: dict[str, File | Dir] = field(default_factory=dict)
    durable: dict[str, File | Dir] = field(default_factory=dict)

    def sync(self) -> None:
        self.durable = dict(self.current)


Node = File | Dir


@dataclass
class Root:
    path: str
    dir: Dir = field(default_factory=Dir)
    durable: bool = False
    """The root's own entry in its parent is durable: its parent was fsynced since the
    root was made (a root not made durably vanishes whole in a power cut)."""
    countdown: int | None = None
    """Armed (:meth:`DiskModel.arm`): the power goes before this many more changes."""
    dead: bool = False
    """The power went (mid-operation): every change fails until the power cut."""


@dataclass
class CutReport:
    """What one power cut threw away."""

    files_reverted: int = 0
    bytes_lost: int = 0
    torn: int = 0
    entries_forgotten: int = 0
    entries_restored: int = 0

    def __str__(self) -> str:
        return (
            f"{self.files_reverted} files reverted ({self.bytes_lost} bytes lost, "
            f"{self.torn} torn), {self.entries_forgotten} entries forgotten, "
            f"{self.entries_restored} restored"
        )


class DiskModel:
    """The durable and current state of the files under the registered roots."""

    def __init__(self) -> None:
        self.roots: dict[str, Root] = {}
        self.fds: dict[int, tuple[Root, Node]] = {}
        self.parent_fds: dict[int, list[Root]] = {}
        """Descriptors opened on the directory holding roots: its fsync makes them durable."""
        self.stats = {
            "syncs": 0,
            "directory_syncs": 0,
            "power_cuts": 0,
            "power_lost_mid_operation": 0,
        }
        self.on_power_lost: Callable[[str], None] | None = None
        """Told a root's path when its power goes mid-operation (:meth:`arm`)."""
        self.slow: dict[str, Callable[[], float]] = {}
        """Roots whose disk is slow (:meth:`set_slow`): each sync's seconds, drawn."""
        self.on_slow_sync: Callable[[str, float], None] | None = None
        """Told a slow root's path and how long each sync there takes (virtual seconds:
        the caller makes the sync return that late; the model cannot block)."""
        self._saved: dict[str, Any] | None = None
        """The real functions while :meth:`installed`."""

    # -- roots and paths -------------------------------------------------------------

    def add_root(self, path: str | os.PathLike[str]) -> None:
        """Model ``path`` (a member's data directory, empty or missing: a new disk)."""
        key = os.path.abspath(os.fspath(path))
        if os.path.exists(key) and os.listdir(key):
            raise DiskModelError(f"{key}: a modelled directory must begin empty")
        self.roots[key] = Root(key, durable=os.path.isdir(key))

    def _root_of(self, path: str) -> tuple[Root, list[str]] | None:
        for key, root in self.roots.items():
            if path == key:
                return root, []
            if path.startswith(key) and path[len(key)] == os.sep:
                return root, path[len(key) + 1 :].split(os.sep)
        return None

    def _locate(self, path: Any, dir_fd: int | None = None) -> tuple[Root, Dir, str] | None:
        """The root, parent directory and name of ``path`` if it is under a root (the
        root itself has no parent: ``(root, root.dir, "")``); None otherwise.  A path
        whose parent the model does not hold raises :class:`DiskModelError` (call it
        after the real call succeeded: where the parent is missing, that fails first)."""
        if isinstance(path, int):
            raise DiskModelError("a path given as a descriptor")
        text = os.fsdecode(os.fspath(path))
        if dir_fd is not None and not os.path.isabs(text):
            opened = self.fds.get(dir_fd)
            if opened is None:
                return None
            root, parent = opened
            if not isinstance(parent, Dir):
                raise DiskModelError(f"dir_fd {dir_fd} is not a directory")
            parts = os.path.normpath(text).split(os.sep)
        else:
            found = self._root_of(os.path.abspath(text))
            if found is None:
                return None
            root, parts = found
            if not parts:
                return root, root.dir, ""
            parent = root.dir
        for part in parts[:-1]:
            child = parent.current.get(part)
            if not isinstance(child, Dir):
                raise DiskModelError(f"{text}: {part} is not a directory the model knows")
            parent = child
        return root, parent, parts[-1]

    def _node(self, path: Any, dir_fd: int | None = None) -> tuple[Root, Node] | None:
        where = self._locate(path, dir_fd)  # after the real call
        if where is None:
            return None
        root, parent, name = where
        if not name:
            return root, root.dir
        node = parent.current.get(name)
        if node is None:
            raise DiskModelError(f"{os.fspath(path)!r}: not in the model")
        return root, node

    # -- the wrapped os functions ----------------------------------------------------

    def _open(self, path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        under = self._under(path, dir_fd)
        existed = under and self._exists(path, dir_fd)
        fd: int = _real["open"](path, flags, mode, dir_fd=dir_fd)
        if not under:
            self._note_parent(fd, path, dir_fd)
            return fd
        try:
            where = self._locate(path, dir_fd)
        except BaseException:
            _real["close"](fd)
            raise
        if where is None:
            return fd
        root, parent, name = where
        if not name:
            node: Node = root.dir
        else:
            found = parent.current.get(name)
            if found is None:
                if not flags & os.O_CREAT or existed:
                    _real["close"](fd)
                    raise DiskModelError(f"{os.fspath(path)!r} opened, but not in the model")
                found = parent.current[name] = File()
            node = found
        if isinstance(node, File) and flags & os.O_TRUNC and flags & (os.O_WRONLY | os.O_RDWR):
            node.truncate(0)
        self.fds[fd] = (root, node)
        return fd

    def _under(self, path: Any, dir_fd: int | None) -> bool:
        """Is ``path`` under a root (the root itself included)?  Cheap: no system call;
        a change there counts towards an armed power cut (:meth:`arm`)."""
        if isinstance(path, int):
            return False
        text = os.fsdecode(os.fspath(path))
        if dir_fd is not None and not os.path.isabs(text):
            opened = self.fds.get(dir_fd)
            root = opened[0] if opened is not None else None
        else:
            found = self._root_of(os.path.abspath(text))
            root = found[0] if found is not None else None
        if root is None:
            return False
        self._tick(root)
        return True

    def _tick(self, root: Root) -> None:
        """A change under ``root``: refused once its power went (mid-operation)."""
        if root.countdown is not None:
            root.countdown -= 1
            if root.countdown <= 0:
                root.countdown, root.dead = None, True
                self.stats["power_lost_mid_operation"] += 1
                if self.on_power_lost is not None:
                    self.on_power_lost(root.path)
        if root.dead:
            raise OSError(errno.EIO, "the power is off (simulated)")

    def arm(self, path: str | os.PathLike[str], changes: int) -> None:
        """Let the power go under root ``path`` just before its ``changes``-th next
        change (a write, a sync, a creation, a rename...): that one and every later one
        fail with EIO, nothing more becomes durable, until :meth:`power_cut`."""
        self.roots[os.path.abspath(os.fspath(path))].countdown = changes

    def is_dead(self, path: str | os.PathLike[str]) -> bool:
        return self.roots[os.path.abspath(os.fspath(path))].dead

    def _fd_tick(self, *fds: int) -> None:
        for fd in fds:
            opened = self.fds.get(fd)
            if opened is not None:
                self._tick(opened[0])

    def _note_parent(self, fd: int, path: Any, dir_fd: int | None) -> None:
        """Remember ``fd`` if it is the directory holding roots (its fsync names them)."""
        if dir_fd is None and not isinstance(path, int):
            holder = os.path.abspath(os.fsdecode(os.fspath(path)))
            held = [r for r in self.roots.values() if os.path.dirname(r.path) == holder]
            if held:
                self.parent_fds[fd] = held

    def _exists(self, path: Any, dir_fd: int | None) -> bool:
        try:
            os.stat(path, dir_fd=dir_fd)
        except OSError:
            return False
        return True

    def _close(self, fd: int) -> None:
        self.fds.pop(fd, None)
        self.parent_fds.pop(fd, None)
        _real["close"](fd)

    def _file(self, fd: int) -> File | None:
        opened = self.fds.get(fd)
        if opened is None:
            return None
        node = opened[1]
        if not isinstance(node, File):
            raise DiskModelError(f"descriptor {fd}: a write to a directory")
        return node

    def _write(self, fd: int, data: Any) -> int:
        self._fd_tick(fd)
        n: int = _real["write"](fd, data)
        file = self._file(fd)
        if file is not None and n > 0:
            end = os.lseek(fd, 0, os.SEEK_CUR)
            file.write(end - n, bytes(memoryview(data).cast("B")[:n]))
        return n

    def _pwrite(self, fd: int, data: Any, offset: int) -> int:
        self._fd_tick(fd)
        n: int = _real["pwrite"](fd, data, offset)
        file = self._file(fd)
        if file is not None and n > 0:
            file.write(offset, bytes(memoryview(data).cast("B")[:n]))
        return n

    def _ftruncate(self, fd: int, length: int) -> None:
        self._fd_tick(fd)
        _real["ftruncate"](fd, length)
        file = self._file(fd)
        if file is not None:
            file.truncate(length)

    def _truncate(self, path: Any, length: int) -> None:
        if isinstance(path, int):
            self._ftruncate(path, length)
            return
        self._under(path, None)
        _real["truncate"](path, length)
        found = self._node(path)
        if found is not None:
            node = found[1]
            if not isinstance(node, File):
                raise DiskModelError(f"{path!r}: truncate of a directory")
            node.truncate(length)

    def _sync(self, fd: int, real: str) -> None:
        self._fd_tick(fd)
        opened = self.fds.get(fd)
        if opened is not None and self.slow:
            self._slow_sync(opened[0])
        if opened is None:
            held = self.parent_fds.get(fd)
            if held is None:
                _real[real](fd)
                return
            for root in held:  # their entries in their parent are durable now
                root.durable = os.path.isdir(root.path)
            self.stats["directory_syncs"] += 1
            return
        node = opened[1]
        node.sync()  # durability is tracked here, not performed
        if isinstance(node, Dir):
            self.stats["directory_syncs"] += 1
        else:
            self.stats["syncs"] += 1

    def _fsync(self, fd: Any) -> None:
        self._sync(fd if isinstance(fd, int) else fd.fileno(), "fsync")

    def _fdatasync(self, fd: Any) -> None:
        self._sync(fd if isinstance(fd, int) else fd.fileno(), "fdatasync")

    def _move(
        self,
        real: str,
        src: Any,
        dst: Any,
        *,
        src_dir_fd: int | None = None,
        dst_dir_fd: int | None = None,
    ) -> None:
        self._under(src, src_dir_fd) or self._under(dst, dst_dir_fd)
        a = self._locate(src, src_dir_fd) if self._exists(src, src_dir_fd) else None
        _real[real](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        b = self._locate(dst, dst_dir_fd)
        if a is None and b is not None:
            a = self._locate(src, src_dir_fd)  # renamed from under a root: not modelled
        if a is None and b is None:
            return
        if a is None or b is None or not a[2] or not b[2] or a[0] is not b[0]:
            raise DiskModelError(f"rename {src!r} -> {dst!r} crosses a modelled root")
        node = a[1].current.pop(a[2], None)
        if node is None:
            raise DiskModelError(f"{src!r} renamed, but not in the model")
        b[1].current[b[2]] = node

    def _rename(self, src: Any, dst: Any, **kw: Any) -> None:
        self._move("rename", src, dst, **kw)

    def _replace(self, src: Any, dst: Any, **kw: Any) -> None:
        self._move("replace", src, dst, **kw)

    def _link(
        self,
        src: Any,
        dst: Any,
        *,
        src_dir_fd: int | None = None,
        dst_dir_fd: int | None = None,
        follow_symlinks: bool = True,
    ) -> None:
        self._under(dst, dst_dir_fd)
        _real["link"](
            src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd, follow_symlinks=follow_symlinks
        )
        a = self._locate(src, src_dir_fd)
        b = self._locate(dst, dst_dir_fd)
        if a is None and b is None:
            return
        if a is None or b is None or not a[2] or not b[2] or a[0] is not b[0]:
            raise DiskModelError(f"link {src!r} -> {dst!r} crosses a modelled root")
        node = a[1].current.get(a[2])
        if not isinstance(node, File):
            raise DiskModelError(f"{src!r} linked, but not a file in the model")
        b[1].current[b[2]] = node

    def _remove_entry(self, real: str, path: Any, dir_fd: int | None) -> None:
        self._under(path, dir_fd)
        where = self._locate(path, dir_fd) if self._exists(path, dir_fd) else None
        _real[real](path, dir_fd=dir_fd)
        if where is None:
            if self._locate(path, dir_fd) is not None:
                raise DiskModelError(f"{os.fspath(path)!r} removed, but not in the model")
            return
        root, parent, name = where
        if not name:  # the root itself: a new, empty disk from now on
            root.dir = Dir()
            root.durable = False
            return
        if parent.current.pop(name, None) is None:
            raise DiskModelError(f"{os.fspath(path)!r} removed, but not in the model")

    def _unlink(self, path: Any, *, dir_fd: int | None = None) -> None:
        self._remove_entry("unlink", path, dir_fd)

    def _remove(self, path: Any, *, dir_fd: int | None = None) -> None:
        self._remove_entry("remove", path, dir_fd)

    def _rmdir(self, path: Any, *, dir_fd: int | None = None) -> None:
        self._remove_entry("rmdir", path, dir_fd)

    def _mkdir(self, path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        self._under(path, dir_fd)
        _real["mkdir"](path, mode, dir_fd=dir_fd)
        where = self._locate(path, dir_fd)
        if where is None:
            return
        _, parent, name = where
        if name:
            parent.current[name] = Dir()

    def _symlink(self, src: Any, dst: Any, *args: Any, dir_fd: int | None = None) -> None:
        if self._locate(dst, dir_fd) is not None:
            raise DiskModelError(f"symlink {dst!r}: links are not modelled")
        _real["symlink"](src, dst, *args, dir_fd=dir_fd)

    def _unmodelled(self, name: str) -> Any:
        real = _real[name]

        def refuse(*args: Any, **kw: Any) -> Any:
            if any(isinstance(a, int) and a in self.fds for a in args[:2]):
                raise DiskModelError(f"os.{name} on a modelled file: not modelled")
            return real(*args, **kw)

        return refuse

    def _builtin_open(self, file: Any, mode: str = "r", *args: Any, **kw: Any) -> Any:
        if set(mode) & set("wax+") and (
            file in self.fds if isinstance(file, int) else self._under(file, None)
        ):
            raise DiskModelError(
                f"built-in open({file!r}, {mode!r}) under a modelled directory: "
                "write through os, which the model sees"
            )
        return _real_open(file, mode, *args, **kw)

    @contextlib.contextmanager
    def installed(self) -> Iterator[DiskModel]:
        """Route the process's ``os`` file calls through the model meanwhile."""
        wrappers = {
            "open": self._open,
            "close": self._close,
            "write": self._write,
            "pwrite": self._pwrite,
            "ftruncate": self._ftruncate,
            "truncate": self._truncate,
            "fsync": self._fsync,
            "fdatasync": self._fdatasync,
            "rename": self._rename,
            "replace": self._replace,
            "link": self._link,
            "unlink": self._unlink,
            "remove": self._remove,
            "mkdir": self._mkdir,
            "rmdir": self._rmdir,
            "symlink": self._symlink,
        } | {name: self._unmodelled(name) for name in _UNMODELLED}
        if self._saved is not None:
            raise DiskModelError("the disk model is installed already")
        saved = {name: getattr(os, name) for name in wrappers}
        saved_open = (builtins.open, io.open)
        try:
            for name, wrapper in wrappers.items():
                setattr(os, name, wrapper)
            builtins.open = io.open = self._builtin_open
            self._saved = saved
            yield self
        finally:
            self._saved = None
            for name, function in saved.items():
                setattr(os, name, function)
            builtins.open, io.open = saved_open

    @contextlib.contextmanager
    def _suspended(self) -> Iterator[None]:
        """The real functions meanwhile (the model's own work on disk)."""
        saved = self._saved
        if saved is None:
            yield
            return
        wrappers = {name: getattr(os, name) for name in saved}
        try:
            for name, function in saved.items():
                setattr(os, name, function)
            builtins.open = io.open = _real_open
            yield
        finally:
            for name, wrapper in wrappers.items():
                setattr(os, name, wrapper)
            builtins.open = io.open = self._builtin_open

    # -- slow and lying disks (issue 44, item 4) ---------------------------------------

    def set_slow(self, path: str | os.PathLike[str], seconds: Callable[[], float] | None) -> None:
        """Make every sync under root ``path`` take ``seconds()`` (None: fast again).
        The sync is tracked at once; :attr:`on_slow_sync` is told how late it returns."""
        key = os.path.abspath(os.fspath(path))
        if key not in self.roots:
            raise DiskModelError(f"{key}: not a modelled root")
        if seconds is None:
            self.slow.pop(key, None)
        else:
            self.slow[key] = seconds
        self.stats.setdefault("slow_syncs", 0)

    def _slow_sync(self, root: Root) -> None:
        draw = self.slow.get(root.path)
        if draw is None:
            return
        delay = draw()
        self.stats["slow_syncs"] = self.stats.get("slow_syncs", 0) + 1
        if self.on_slow_sync is not None:
            self.on_slow_sync(root.path, delay)

    def durable_extent(self, path: str | os.PathLike[str]) -> int:
        """How many leading bytes of the file at ``path`` are durable and current alike
        (what a read returns, and a power cut keeps)."""
        found = self._node(os.path.abspath(os.fspath(path)))
        if found is None or not isinstance(found[1], File):
            raise DiskModelError(f"{path}: not a modelled file")
        file = found[1]
        extent = min(len(file.durable), len(file.current))
        if file.dirty_from is not None:
            extent = min(extent, file.dirty_from)
        return extent

    def rot(self, path: str | os.PathLike[str], offset: int, data: bytes) -> bytes:
        """Bit rot, or a misdirected write: the durable bytes at ``offset`` of the file
        at ``path`` become ``data`` (on disk, and in the model's current and durable
        state alike: nothing the node did, so nothing it can know of but by reading).
        Returns the bytes they were."""
        key = os.path.abspath(os.fspath(path))
        found = self._node(key)
        if found is None or not isinstance(found[1], File):
            raise DiskModelError(f"{path}: not a modelled file")
        file = found[1]
        end = offset + len(data)
        if end > self.durable_extent(key):
            raise DiskModelError(f"{path}: [{offset}, {end}) is not durable")
        was = bytes(file.current[offset:end])
        with self._suspended():
            fd = _real["open"](key, os.O_WRONLY)
            try:
                _real["pwrite"](fd, data, offset)
            finally:
                _real["close"](fd)
        file.current[offset:end] = data
        file.durable[offset:end] = data
        self.stats["rotted"] = self.stats.get("rotted", 0) + 1
        return was

    # -- checks and power cuts -------------------------------------------------------

    def verify(self, path: str | os.PathLike[str]) -> None:
        """The real files under root ``path`` are the model's current state exactly."""
        root = self.roots[os.path.abspath(os.fspath(path))]
        if not os.path.isdir(root.path):
            if root.dir.current:
                raise DiskModelError(f"{root.path}: missing, the model holds files in it")
            return
        self._verify_dir(root.path, root.dir)

    def _verify_dir(self, path: str, model: Dir) -> None:
        real = {}
        with os.scandir(path) as entries:
            for entry in entries:
                real[entry.name] = entry
        if set(real) != set(model.current):
            raise DiskModelError(
                f"{path}: holds {sorted(real)}, the model {sorted(model.current)} "
                "(something wrote around the model)"
            )
        for name, node in model.current.items():
            child = os.path.join(path, name)
            info = real[name].stat(follow_symlinks=False)
            if isinstance(node, Dir):
                if not stat.S_ISDIR(info.st_mode):
                    raise DiskModelError(f"{child}: not the directory the model holds")
                self._verify_dir(child, node)
                continue
            if not stat.S_ISREG(info.st_mode):
                raise DiskModelError(f"{child}: not the regular file the model holds")
            with _real_open(child, "rb") as f:
                data = f.read()
            if data != node.current:
                raise DiskModelError(
                    f"{child}: {len(data)} bytes differ from the model's {len(node.current)} "
                    "(something wrote around the model)"
                )

    def power_cut(self, path: str | os.PathLike[str], rng: random.Random | None) -> CutReport:
        """Lose what root ``path`` did not make durable (``rng``: tear the first unsynced
        page of each file at random; None: no tearing), on disk and in the model.  The
        member using it must be stopped."""
        root = self.roots[os.path.abspath(os.fspath(path))]
        root.countdown, root.dead = None, False
        self.verify(path)
        for fd, (owner, _) in list(self.fds.items()):
            if owner is root:  # left open by a stopped member: gone with the power
                del self.fds[fd]
        report = CutReport()
        self._count_forgotten(root.dir, report, set())
        with self._suspended():
            if os.path.isdir(root.path):
                shutil.rmtree(root.path)
            if not root.durable:  # made, but never named durably: gone, all of it
                report.entries_forgotten += 1
                root.dir = Dir()
            else:
                os.makedirs(root.path, exist_ok=True)
                self._restore(root.path, root.dir, rng, {}, {}, report)
        self.stats["power_cuts"] += 1
        return report

    def _count_forgotten(self, directory: Dir, report: CutReport, seen: set[int]) -> None:
        if id(directory) in seen:
            return
        seen.add(id(directory))
        for name, node in directory.current.items():
            if directory.durable.get(name) is not node:
                report.entries_forgotten += 1
        for name, node in directory.durable.items():
            if directory.current.get(name) is not node:
                report.entries_restored += 1
            if isinstance(node, Dir):
                self._count_forgotten(node, report, seen)

    def _restore(
        self,
        path: str,
        directory: Dir,
        rng: random.Random | None,
        contents: dict[int, bytearray],
        written: dict[int, str],
        report: CutReport,
    ) -> None:
        """Write the durable tree of ``directory`` at ``path`` (with the real functions)
        and make it current."""
        directory.current = dict(directory.durable)
        for name, node in directory.durable.items():
            child = os.path.join(path, name)
            if isinstance(node, Dir):
                _real["mkdir"](child)
                self._restore(child, node, rng, contents, written, report)
                continue
            key = id(node)
            if key in written:  # a second link to the same file
                _real["link"](written[key], child)
                continue
            if key not in contents:
                data = node.after_power_cut(rng)
                if node.dirty_from is not None:
                    report.files_reverted += 1
                    report.bytes_lost += max(0, len(node.current) - node.dirty_from)
                    if data != node.durable:
                        report.torn += 1
                node.current = bytearray(data)
                node.durable = bytearray(data)
                node.dirty_from = None
                contents[key] = data
            with _real_open(child, "wb") as f:
                f.write(contents[key])
            written[key] = child
