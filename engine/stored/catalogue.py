"""A backup in object storage as readers see it: the catalogue of a complete run (every file
of the copy: its pieces, size, CRC-32 and attributes; every directory), and a stored file's bytes
read back from its pieces.

`seglogfs backup SRC s3://bucket/prefix` writes these (mount_tools.object_backup: the layout in
the bucket, how runs keep what the last complete one shows); restore, the readers of a data dir
over a URI and Spark read them (engine.stored.local_copy). The newest catalogue is the copy: an
object is never changed once a catalogue names it.
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass, field

from seglogfs.engine.fetched_files import SegmentSummary
from seglogfs.engine.log.naming import LOG_SUFFIX, parse_segment_file_name
from seglogfs.engine.object_store import ObjectReader, ObjectStore, ObjectStoreError
from seglogfs.engine.record.records import (
    BATCH_HEADER,
    BATCH_OVERHEAD_BYTES,
    CONTROL_FLAG_MASK,
    CURRENT_MAGIC,
    LOG_OVERHEAD_BYTES,
    MAGIC_OFFSET,
    NO_TIMESTAMP,
    TRANSACTIONAL_FLAG_MASK,
)

CATALOGUE_DIR = ".seglogfs-backup"

CATALOGUE_FORMAT = "seglogfs-backup-catalogue"

CATALOGUE_VERSION = 1

READ_BLOCK_BYTES = 8 << 20  # what a read in order fetches at once (one request)

CATALOGUE_MAX_BYTES = 256 << 20  # (a catalogue, or a run's other documents, read whole)

CATALOGUE_NAME = re.compile(r"^(\d{20})\.json$")


@dataclass
class FileAttributes:
    """What a copy gives a file or directory besides its bytes."""

    mode: int  # permission bits
    mtime_ns: int
    owner: tuple[int, int] | None  # (uid, gid), applied when running as root


@dataclass
class StoredFile:
    """A file of the copy: its bytes are its pieces' objects, in order; a `.log`'s summary of
    its batches when the backup could make one (`SegmentSummarizer`)."""

    pieces: list[tuple[str, int]]  # (key, size)
    size: int
    crc32: int
    attributes: FileAttributes
    summary: SegmentSummary | None = None

    def as_json(self) -> dict[str, object]:
        document: dict[str, object] = {
            "pieces": [[key, size] for key, size in self.pieces],
            "size": self.size,
            "crc32": self.crc32,
            **_attributes_json(self.attributes),
        }
        if self.summary is not None:
            document["segment"] = {
                "nextOffset": self.summary.next_offset,
                "maxTimestamp": self.summary.max_timestamp,
                "maxTimestampOffset": self.summary.max_timestamp_offset,
                "transactional": self.summary.transactional,
            }
        return document

    @classmethod
    def of_json(cls, document: dict[str, object]) -> StoredFile:
        pieces = [(str(key), int(size)) for key, size in document["pieces"]]  # type: ignore[attr-defined]
        for key, _ in pieces:  # (an object outside the prefix is never read for it)
            _check_path(key)
        size = int(document["size"])  # type: ignore[call-overload]
        if sum(piece_size for _, piece_size in pieces) != size or any(s < 0 for _, s in pieces):
            raise ValueError("its pieces' sizes do not add up to its size")
        summary = None
        segment = document.get("segment")
        if isinstance(segment, dict):  # (a catalogue written before summaries has none: readers scan)
            summary = SegmentSummary(
                size,
                int(segment["nextOffset"]),
                int(segment["maxTimestamp"]),
                int(segment["maxTimestampOffset"]),
                bool(segment["transactional"]),
            )
        return cls(pieces, size, int(document["crc32"]), _attributes_of(document), summary)  # type: ignore[call-overload]


class SegmentSummarizer:
    """A stored `.log`'s `SegmentSummary`, made from its bytes as a backup sends them (in order,
    in chunks of any size) by walking the batch headers across the chunks' bounds; for a `.log`
    that grew, from the summary of the part already stored and its new bytes. `summary()` is
    None — readers then scan the segment, as they do a data dir — for bytes that do not end with
    a whole batch, or that hold anything but v2 batches (a legacy message set: its timestamps
    are inside its messages)."""

    def __init__(self, base_offset: int, before: SegmentSummary | None = None) -> None:
        self._valid = True
        self._position = 0
        self._next_offset = base_offset
        self._max = (NO_TIMESTAMP, base_offset)  # (timestamp, last offset of the first batch with it)
        self._transactional = False
        if before is not None:
            self._position = before.size
            self._next_offset = before.next_offset
            self._max = (before.max_timestamp, before.max_timestamp_offset)
            self._transactional = before.transactional
        self._header = bytearray()  # the header of the batch the bytes are in, as far as it came
        self._skip = 0  # bytes of that batch after its header still to come

    def feed(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        at, end = 0, len(view)
        while self._valid and at < end:
            if self._skip:  # (the rest of a batch whose header came)
                taken = min(self._skip, end - at)
                self._skip -= taken
                at += taken
            elif self._header or end - at < BATCH_OVERHEAD_BYTES:  # (a header across two chunks)
                taken = min(BATCH_OVERHEAD_BYTES - len(self._header), end - at)
                self._header += view[at : at + taken]
                at += taken
                if len(self._header) == BATCH_OVERHEAD_BYTES:
                    size = self._batch(bytes(self._header), 0)
                    self._header.clear()
                    self._skip = max(size - BATCH_OVERHEAD_BYTES, 0)
            else:  # (headers read where they are in the chunk: no copy, no object a batch)
                size = self._batch(view, at)
                if at + size <= end:
                    at += size
                else:
                    self._skip, at = at + size - end, end
        self._position += end

    def _batch(self, buf: bytes | memoryview, at: int) -> int:
        """Take in the header at `at` of `buf` (61 bytes there): the batch's size in bytes."""
        if buf[at + MAGIC_OFFSET] != CURRENT_MAGIC:
            self._valid = False
            return 0
        base_offset, batch_length, _, _, _, attributes, last_offset_delta, _, max_timestamp, *_ = (
            BATCH_HEADER.unpack_from(buf, at)
        )
        size = LOG_OVERHEAD_BYTES + batch_length
        if size < BATCH_OVERHEAD_BYTES or base_offset < self._next_offset:
            self._valid = False
            return 0
        self._next_offset = base_offset + last_offset_delta + 1
        if max_timestamp > self._max[0]:
            self._max = (max_timestamp, base_offset + last_offset_delta)
        if attributes & (TRANSACTIONAL_FLAG_MASK | CONTROL_FLAG_MASK):
            self._transactional = True
        return size

    def summary(self) -> SegmentSummary | None:
        if not self._valid or self._header or self._skip:
            return None
        return SegmentSummary(self._position, self._next_offset, self._max[0], self._max[1], self._transactional)


def _attributes_json(attributes: FileAttributes) -> dict[str, object]:
    return {"mode": attributes.mode, "mtimeNs": attributes.mtime_ns, "owner": attributes.owner}


def _attributes_of(document: dict[str, object]) -> FileAttributes:
    owner = document.get("owner")
    return FileAttributes(
        int(document["mode"]) & 0o7777,  # type: ignore[call-overload]
        int(document["mtimeNs"]),  # type: ignore[call-overload]
        (int(owner[0]), int(owner[1])) if isinstance(owner, list) and len(owner) == 2 else None,
    )


@dataclass
class Catalogue:
    """What one complete run stored: every file and directory of the copy (paths relative to the
    prefix, `/`-separated; the root directory is "")."""

    run: int
    source: str
    source_kind: str
    log_dirs: int
    started_ms: int
    finished_ms: int = 0
    files: dict[str, StoredFile] = field(default_factory=dict)
    directories: dict[str, FileAttributes] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)

    def keys(self) -> set[str]:
        return {key for stored in self.files.values() for key, _ in stored.pieces}

    def as_json(self) -> dict[str, object]:
        return {
            "format": CATALOGUE_FORMAT,
            "version": CATALOGUE_VERSION,
            "run": self.run,
            "source": self.source,
            "sourceKind": self.source_kind,
            "logDirs": self.log_dirs,
            "startedMs": self.started_ms,
            "finishedMs": self.finished_ms,
            "directories": {path: _attributes_json(a) for path, a in sorted(self.directories.items())},
            "files": {path: stored.as_json() for path, stored in sorted(self.files.items())},
            "stats": self.stats,
            "refused": self.refused,
        }

    @classmethod
    def of_json(cls, document: object) -> Catalogue:
        if not isinstance(document, dict) or document.get("format") != CATALOGUE_FORMAT:
            raise ValueError("not a seglogfs backup catalogue")
        if document.get("version") != CATALOGUE_VERSION:
            raise ValueError(f"catalogue version {document.get('version')!r} (this seglogfs reads {CATALOGUE_VERSION})")
        catalogue = cls(
            int(document["run"]),
            str(document["source"]),
            str(document["sourceKind"]),
            int(document["logDirs"]),
            int(document["startedMs"]),
            int(document["finishedMs"]),
            stats=dict(document.get("stats") or {}),
            refused=[str(name) for name in document.get("refused") or []],
        )
        for path, entry in document["files"].items():
            _check_path(path)
            catalogue.files[path] = stored = StoredFile.of_json(entry)
            if stored.summary is not None:
                _check_summary(path, stored.summary)
        for path, entry in document["directories"].items():
            if path:
                _check_path(path)
            catalogue.directories[path] = _attributes_of(entry)
        if catalogue.log_dirs < 1:
            raise ValueError(f"bad logDirs {catalogue.log_dirs}")
        return catalogue


def _check_path(path: str) -> None:
    """A path of the copy must stay below the target (a catalogue is read from a store others
    may write)."""
    parts = path.split("/")
    if not path or any(part in ("", ".", "..") or "\0" in part for part in parts):
        raise ValueError(f"bad path {path!r}")


def _check_summary(path: str, summary: SegmentSummary) -> None:
    """A summary must be a `.log`'s and fit its offsets (readers take its end for the log's)."""
    parsed = parse_segment_file_name(path.rsplit("/", 1)[-1])
    if parsed is None or parsed[1] != LOG_SUFFIX or parsed[2]:
        raise ValueError(f"{path}: a segment summary for a file that is no segment's .log")
    base = parsed[0]
    at = summary.max_timestamp_offset
    if (
        summary.next_offset < base
        or (summary.size == 0 and summary.next_offset != base)
        or not (at == base or base <= at < summary.next_offset)
    ):
        raise ValueError(f"{path}: its segment summary does not fit its offsets")


def catalogue_key(run: int) -> str:
    return f"{CATALOGUE_DIR}/{run:020d}.json"


def catalogue_runs(store: ObjectStore) -> list[int]:
    """The runs whose catalogue the store holds, oldest first."""
    runs = []
    for info in store.list(CATALOGUE_DIR):
        match = CATALOGUE_NAME.match(info.key.removeprefix(CATALOGUE_DIR + "/"))
        if match:
            runs.append(int(match.group(1)))
    return sorted(runs)


def read_catalogue(store: ObjectStore, run: int) -> Catalogue:
    key = catalogue_key(run)
    try:
        catalogue = Catalogue.of_json(json.loads(store.read_whole(key, CATALOGUE_MAX_BYTES)))
    except FileNotFoundError:
        raise ObjectStoreError(f"{store.name(key)}: gone (a newer backup run removed it)") from None
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ObjectStoreError(f"{store.name(key)}: unreadable backup catalogue: {error}") from None
    if catalogue.run != run:
        raise ObjectStoreError(f"{store.name(key)}: names run {catalogue.run}")
    return catalogue


def latest_catalogue(store: ObjectStore) -> Catalogue | None:
    """The newest complete run's catalogue, None when no run completed."""
    runs = catalogue_runs(store)
    return read_catalogue(store, runs[-1]) if runs else None


class StoredFileReader:
    """A stored file's bytes, read from the pieces that hold them: each piece opened once, and
    reads in order fetched READ_BLOCK_BYTES at a time (one ranged GET each). When the reads have
    run in order from the start to the end, the file's CRC-32 is compared with the catalogue's
    (ObjectStoreError on a difference)."""

    def __init__(self, store: ObjectStore, path: str, stored: StoredFile, *, read_ahead: bool = True) -> None:
        self.store = store
        self.path = path
        self.stored = stored
        self.read_ahead = read_ahead  # (off: each read fetches what it asks for, as a look at a few bytes)
        self._readers: dict[int, ObjectReader] = {}
        self._block = b""
        self._block_at = 0
        self._crc = 0
        self._checked_to = 0  # how far reads in order have gone (-1: not in order)

    def read(self, position: int, length: int) -> bytes:
        end = min(position + length, self.stored.size)
        if position >= end:
            return b""
        if not (self._block_at <= position and end <= self._block_at + len(self._block)):
            in_order = self.read_ahead and position == self._checked_to
            fetch = max(end - position, READ_BLOCK_BYTES) if in_order else end - position
            self._block = self._fetch(position, min(fetch, self.stored.size - position))
            self._block_at = position
        data = self._block[position - self._block_at : end - self._block_at]
        self._check(position, data)
        return data

    def _fetch(self, position: int, length: int) -> bytes:
        out = []
        start = 0
        end = position + length
        for index, (key, size) in enumerate(self.stored.pieces):
            low, high = max(position, start), min(end, start + size)
            if low < high:
                reader = self._readers.get(index)
                if reader is None:
                    try:
                        reader = self._readers[index] = self.store.open(key)
                    except FileNotFoundError:
                        raise ObjectStoreError(
                            f"{self.store.name(key)}: no such object (the backup's catalogue names it)"
                        ) from None
                    if reader.size != size:
                        raise ObjectStoreError(
                            f"{self.store.name(key)}: {reader.size} bytes, the backup's catalogue says {size}"
                        )
                out.append(reader.read(low - start, high - low))
            start += size
            if start >= end:
                break
        return b"".join(out)

    def _check(self, position: int, data: bytes) -> None:
        if position != self._checked_to:
            if self._checked_to != self.stored.size:
                self._checked_to = -1
            return
        self._crc = zlib.crc32(data, self._crc)
        self._checked_to += len(data)
        if self._checked_to == self.stored.size and self._crc != self.stored.crc32:
            raise ObjectStoreError(
                f"{self.store.name(self.path)}: its bytes in the store differ from what the backup stored "
                f"(CRC-32 {self._crc:#010x}, the catalogue says {self.stored.crc32:#010x})"
            )

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
