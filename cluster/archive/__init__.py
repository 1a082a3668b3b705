"""The persisted log of a member and its recording log.

* :mod:`.record`: record framing ``u32 length | u32 crc32(body) | body``.
* :mod:`.segments`: :class:`Archive`, the log as contiguous segment files
  ``log-{base_position:020d}.seg`` with torn-tail recovery, and :func:`read_log`.
* :mod:`.recording_log`: :class:`RecordingLog`, the ``recording.log`` index of terms and
  snapshots (64-byte CRC-checked entries).
"""

from . import errors as errors
from .errors import ArchiveCorruptionError as ArchiveCorruptionError
from .errors import ArchiveError as ArchiveError
from .errors import ArchiveWriteError as ArchiveWriteError
from .record import RecordError as RecordError
from .record import append_record as append_record
from .record import encode_record as encode_record
from .record import iter_records as iter_records
from .recording_log import Entry as Entry
from .recording_log import RecordingLog as RecordingLog
from .segments import Archive as Archive
from .segments import FsyncPolicy as FsyncPolicy
from .segments import SegmentInfo as SegmentInfo
from .segments import read_log as read_log

__all__ = [
    "Archive",
    "ArchiveCorruptionError",
    "ArchiveError",
    "ArchiveWriteError",
    "Entry",
    "FsyncPolicy",
    "RecordError",
    "RecordingLog",
    "SegmentInfo",
    "append_record",
    "encode_record",
    "errors",
    "iter_records",
    "read_log",
]
