"""Locations through Spark's Hadoop file system: local paths and URIs alike.

Every archive and output location of the job is a *Hadoop path*: a plain path (absolute
or relative to the working directory) or a URI whose scheme names a Hadoop file system
(``file:///data/cluster``, ``hdfs://namenode:8020/triarch``, ``s3a://bucket/prefix``
given the ``hadoop-aws`` jars and credentials).  As everywhere in Spark, a URI is written
unescaped: ``file:///data/my archives``, not ``%20``.

:class:`HadoopFS` does the driver's file work (listing directories, small writes,
deletes, renames) through the JVM's ``org.apache.hadoop.fs.FileSystem`` of the Spark
session, with the session's Hadoop configuration (``spark.hadoop.*`` settings), so
whatever Spark can read, the job can list.  File contents are read by Spark itself
(the ``binaryFile`` data source) and tables written by DataFrame writers.

Locations are kept as qualified Hadoop path strings (``file:/data/cluster``);
:func:`display` shows a local one as a plain path.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

__all__ = ["FileInfo", "HadoopFS", "display", "glob_escape", "local_path"]

_GLOB = re.compile(r"([\\\[\]{}*?])")


@dataclass(frozen=True, slots=True)
class FileInfo:
    """A listed file or directory: ``location`` is its qualified Hadoop path."""

    location: str
    name: str
    size: int
    is_dir: bool


def local_path(location: str) -> str | None:
    """The local path of a ``file:`` location (None for any other scheme)."""
    if location.startswith("file:"):
        rest = location[len("file:") :]
        if rest.startswith("//"):  # file://host/path or file:///path
            rest = "/" + rest[2:].partition("/")[2]
        return rest
    return None


def display(location: str) -> str:
    """``location`` as shown to people: a plain path for local files, else the URI."""
    path = local_path(location)
    return location if path is None else path


def glob_escape(location: str) -> str:
    """``location`` with Hadoop glob characters escaped, for readers that glob their
    paths (``spark.read.load``): a directory named ``run[1]`` is then taken literally."""
    return _GLOB.sub(r"\\\1", location)


class HadoopFS:
    """The Hadoop file systems of a Spark session (one per scheme and authority)."""

    def __init__(self, spark: SparkSession) -> None:
        jvm: Any = getattr(spark, "_jvm", None)
        if jvm is None:  # Spark Connect: no JVM in this process
            raise RuntimeError(
                "cluster-pipeline needs a classic Spark session (with a JVM on the driver); "
                "Spark Connect is not supported"
            )
        self._spark = spark
        self._jvm = jvm
        self._conf = spark._jsc.hadoopConfiguration()

    def _resolve(self, location: str) -> tuple[Any, Any]:
        """(file system, qualified path) of ``location``."""
        path = self._jvm.org.apache.hadoop.fs.Path(location)
        fs = path.getFileSystem(self._conf)
        return fs, fs.makeQualified(path)

    def _raw(self, fs: Any) -> Any:
        """The file system under its filters: the local one without the ``.crc`` side
        files of ``ChecksumFileSystem`` (for our own small writes)."""
        filtered = self._jvm.java.lang.Class.forName("org.apache.hadoop.fs.FilterFileSystem")
        for _ in range(4):  # e.g. Hive's ProxyLocalFileSystem over LocalFileSystem
            if not filtered.isInstance(fs):
                break
            fs = fs.getRawFileSystem()
        return fs

    def qualify(self, location: str) -> str:
        """``location`` as a qualified Hadoop path (``dir`` -> ``file:/cwd/dir``)."""
        return str(self._resolve(location)[1].toString())

    def child(self, parent: str, name: str) -> str:
        return str(self._jvm.org.apache.hadoop.fs.Path(parent, name).toString())

    def parent(self, location: str) -> str | None:
        parent = self._jvm.org.apache.hadoop.fs.Path(location).getParent()
        return None if parent is None else str(parent.toString())

    def name(self, location: str) -> str:
        return str(self._jvm.org.apache.hadoop.fs.Path(location).getName())

    def _info(self, status: Any) -> FileInfo:
        path = status.getPath()
        return FileInfo(
            str(path.toString()), str(path.getName()), int(status.getLen()), status.isDirectory()
        )

    def status(self, location: str) -> FileInfo | None:
        """What is at ``location``, or None when nothing is."""
        fs, path = self._resolve(location)
        if not fs.exists(path):
            return None
        return self._info(fs.getFileStatus(path))

    def listdir(self, location: str) -> list[FileInfo]:
        """The entries of the directory ``location``, by name."""
        fs, path = self._resolve(location)
        return sorted((self._info(s) for s in fs.listStatus(path)), key=lambda f: f.name)

    def exists(self, location: str) -> bool:
        fs, path = self._resolve(location)
        return bool(fs.exists(path))

    def delete(self, location: str) -> None:
        """Remove ``location`` (a directory with everything in it); nothing there is fine."""
        fs, path = self._resolve(location)
        if fs.exists(path):
            fs.delete(path, True)

    def mkdirs(self, location: str) -> None:
        fs, path = self._resolve(location)
        if not fs.mkdirs(path):
            raise OSError(f"{display(location)}: cannot create the directory")

    def rename(self, source: str, target: str) -> None:
        fs, src = self._resolve(source)
        _, dst = self._resolve(target)
        if not fs.rename(src, dst):
            raise OSError(f"cannot rename {display(source)} to {display(target)}")

    def write_bytes(self, location: str, data: bytes) -> None:
        """Write a small file: to ``<location>.tmp``, then renamed over ``location``."""
        fs, path = self._resolve(location)
        fs = self._raw(fs)
        tmp = self._jvm.org.apache.hadoop.fs.Path(path.getParent(), path.getName() + ".tmp")
        stream = fs.create(tmp, True)
        try:
            stream.write(bytearray(data))
        finally:
            stream.close()
        if fs.exists(path):
            fs.delete(path, False)
        if not fs.rename(tmp, path):
            raise OSError(f"cannot rename {display(str(tmp.toString()))} to {display(location)}")

    def read_files(self, locations: Sequence[str]) -> dict[str, bytes]:
        """The contents of small files, read by Spark (``binaryFile``), by location."""
        if not locations:
            return {}
        rows = (
            self._spark.read.format("binaryFile")
            .load([glob_escape(location) for location in locations])
            .select("path", "content")
            .collect()
        )
        return {str(row["path"]): bytes(row["content"]) for row in rows}
