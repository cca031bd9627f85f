"""Backups in object storage: `seglogfs backup SRC s3://bucket/prefix` and `seglogfs restore
s3://bucket/prefix DATADIR`, with what `backup` promises locally (mount_tools.backup): the
copy is the data dir's mirror, incremental, consistent while a writer goes on, and a run cut
short never replaces what the last complete run shows.

The layout in the bucket, below the prefix, is the data dir's (a broker's tools and a person
browsing the bucket find Kafka's names):

    <prefix>/meta.properties, recovery-point-offset-checkpoint, …
    <prefix>/<topic>-<partition>/00000000000000000000.log, .index, .timeindex, …
    <prefix>/0/…, <prefix>/1/…          (a backup of several log dirs, as `.logdir` shows them)
    <prefix>/.seglogfs-backup/00000000000000000007.json      the catalogue of each complete run
    <prefix>/.seglogfs-backup/started.json    the run that started last (written before it uploads)
    <prefix>/.seglogfs-backup/journal.json    the uploads of the run under way, or cut short

An object is never changed once a catalogue names it. A file that changed since the last run
(a checkpoint rewritten, a segment compacted) is uploaded to a new key, its name with the run's
number after a `~` (`00000000000000000000.log~8`); a `.log` that only grew (the active segment,
its first 4 KiB and last 64 KiB of the part already stored unchanged) has only its new bytes
uploaded, as another object (up to MAX_PIECES pieces; then it is uploaded whole again). The
catalogue lists each file of the copy with its pieces (key and size, in order), its size and
CRC-32, mode, owner and mtime; a `.log` with its summary (engine.stored.catalogue.SegmentSummarizer,
fed the bytes as they are sent: a grown one's continues the summary of its stored part), which
saves readers the scans of its tail.

The catalogue is written last, as one object, after every upload of the run completed: readers
(restore, and everything that reads a backup from the store) go by the newest catalogue, so a run
that did not complete — an error, a signal, `kill -9`, a stalled server — changes nothing they
see; the next run uploads again what it had not finished. Once a run's catalogue is written,
objects named by neither it nor the catalogue before it are deleted, and older catalogues
(a reader that began before the last run keeps what it reads; one that outlasts two runs may find
an object gone, and says so). Two backups into one prefix at the same time are not supported: a
run finding that another completed meanwhile fails without writing its catalogue.

A run journals the uploads it completed (`.seglogfs-backup/journal.json`: after each large one,
and every few seconds): the next run, if the one before was cut short, keeps an object the journal
names when it holds what is to be sent (the same part of a file of that size and mtime) and is
there whole, instead of sending it again. Objects no catalogue names that are not kept so are
deleted by the next complete run; a multipart upload cut short by `kill -9` is for the store's
lifecycle rule (`AbortIncompleteMultipartUpload`) to remove.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace

from seglogfs.engine.errors import UnsafeFileError
from seglogfs.engine.log.naming import LOG_SUFFIX, parse_segment_file_name
from seglogfs.engine.object_store import ObjectStore, ObjectStoreError
from seglogfs.engine.stored.catalogue import (
    CATALOGUE_DIR,
    CATALOGUE_MAX_BYTES,
    CATALOGUE_NAME,
    Catalogue,
    FileAttributes,
    SegmentSummarizer,
    StoredFile,
    StoredFileReader,
    catalogue_key,
)
from seglogfs.mount_tools.copier import (
    HEAD_BYTES,
    TAIL_BYTES,
    CopyStats,
    Source,
    SourceFile,
    orphan_index,
    segment_kind,
)
from seglogfs.mount_tools.progress import Progress

STARTED_KEY = f"{CATALOGUE_DIR}/started.json"  # the run that started last (complete or not)

MAX_PIECES = 16  # pieces of one grown `.log` before it is uploaded whole again

UPLOADS_AT_ONCE = 4

JOURNAL_KEY = f"{CATALOGUE_DIR}/journal.json"  # the uploads of the run under way (or cut short)

JOURNAL_INTERVAL_S = 5.0  # the journal is written at most this long after an upload completed,

JOURNAL_AFTER_BYTES = 8 << 20  # and at once after an upload of this many bytes


@dataclass(frozen=True)
class Upload:
    """An object a run uploaded: `size` bytes of a file from `start`, the file's mtime then, and
    the file's CRC-32 from its start to the object's end (`crc32`), continued from `after`."""

    size: int
    mtime_ns: int
    start: int
    after: int
    crc32: int


def read_journal(store: ObjectStore, run: int) -> dict[str, Upload]:
    """The uploads a run of number `run` journaled before it was cut short (none when the
    journal is of another run, or unreadable: its uploads are sent again)."""
    try:
        document = json.loads(store.read_whole(JOURNAL_KEY, CATALOGUE_MAX_BYTES))
        if document.get("run") != run:
            return {}
        return {str(key): Upload(**{k: int(v) for k, v in entry.items()}) for key, entry in document["uploads"].items()}
    except FileNotFoundError:
        return {}
    except (ValueError, TypeError, KeyError, AttributeError):
        return {}


_SMALL_FILE_BYTES = 1 << 20  # a file other than a segment's up to this size is compared byte for byte


def read_started(store: ObjectStore) -> dict[str, object] | None:
    """What the last run to start wrote as it began (`STARTED_KEY`): None when no run did."""
    try:
        document = json.loads(store.read_whole(STARTED_KEY, CATALOGUE_MAX_BYTES))
    except FileNotFoundError:
        return None
    except ValueError as error:
        raise ObjectStoreError(f"{store.name(STARTED_KEY)}: unreadable: {error}") from None
    return document if isinstance(document, dict) else {}


def write_started(store: ObjectStore, catalogue: Catalogue) -> None:
    """Said before a run uploads anything: the prefix is a backup's, even before a run completes."""
    document = {"run": catalogue.run, "startedMs": catalogue.started_ms, "source": catalogue.source}
    store.put(STARTED_KEY, json.dumps(document).encode())


class ObjectBackup:
    """One run of a backup into a store: walks the source as the local copy does (in each
    directory, the files but the logs opened first, then the subdirectories, then the logs: an
    index or checkpoint is read before the log it describes), uploads what changed, several
    files at once, and writes the run's catalogue once every upload completed."""

    def __init__(
        self,
        source: Source,
        store: ObjectStore,
        *,
        previous: Catalogue | None,
        kept_keys: set[str],
        unnamed: dict[str, int] | None = None,
        journal: dict[str, Upload] | None = None,
        catalogue: Catalogue,
        progress: Progress,
        say: Callable[[str], None] | None,
        uploads: int = UPLOADS_AT_ONCE,
    ) -> None:
        self.source = source
        self.store = store
        self.previous = previous
        self.catalogue = catalogue
        self.progress = progress
        self.say = say
        self.stats = CopyStats()
        self._taken = kept_keys  # keys a catalogue still names: never written again
        self._unnamed = unnamed or {}  # objects no catalogue names (a cut-short run's), by key: their sizes
        self._journal = journal or {}  # what a cut-short run of this number uploaded
        self._done: dict[str, Upload] = dict(self._journal)  # this run's uploads (and those kept)
        self._journal_due = time.monotonic() + JOURNAL_INTERVAL_S
        self._pool = ThreadPoolExecutor(max_workers=uploads, thread_name_prefix="upload")
        self._slots = threading.BoundedSemaphore(uploads * 2)  # files open for upload at once
        self._pending: list[Future[None]] = []
        self._lock = threading.Lock()  # the stats, the progress line, -v's lines
        self._orphans: list[str] = []  # index files whose segment went while the logs were read
        self._said: list[str] = []  # -v's lines not yet written (`_say_now`)

    def run(self) -> None:
        try:
            self._directory(())
            self._wait(everything=True)
        except BaseException as error:
            self._pool.shutdown(wait=True, cancel_futures=True)
            if not isinstance(error, ObjectStoreError):  # (a store that failed is not asked again)
                with contextlib.suppress(Exception):  # (what completed is kept for the next run)
                    self.write_journal()
            raise
        self._pool.shutdown(wait=True)
        self._say_now()
        for path in self._orphans:  # (after their uploads: none adds one back)
            self.catalogue.files.pop(path, None)

    # -- the walk -----------------------------------------------------------------------------------
    def _directory(self, parts: tuple[str, ...]) -> bool:
        try:
            listed = self.source.names(parts)
            self.catalogue.directories["/".join(parts)] = self.source.directory(parts)
        except FileNotFoundError:
            return False
        files = [name for name, is_dir in listed if not is_dir]
        logs = [name for name in files if segment_kind(name) == LOG_SUFFIX]
        present: set[str] = set()
        for name in files:
            if name not in logs and self._file(parts, name):
                present.add(name)
        for name, is_dir in listed:
            if is_dir:
                self._directory((*parts, name))
        for name in logs:
            if self._file(parts, name):
                present.add(name)
        self._orphans += ["/".join((*parts, name)) for name in present if orphan_index(name, present)]
        return True

    def _file(self, parts: tuple[str, ...], name: str) -> bool:
        """Open one file and store it (now, or by an upload begun): whether the source had it."""
        self._wait(everything=False)  # (an upload that failed ends the run now)
        self._say_now()
        path = "/".join((*parts, name))
        try:
            item = self.source.open((*parts, name))
        except (FileNotFoundError, IsADirectoryError):
            return False
        except UnsafeFileError as error:
            self.catalogue.refused.append(error.path)
            _tell(f"{error} (not copied)")
            return False
        previous = self.previous.files.get(path) if self.previous is not None else None
        try:
            kind = segment_kind(name)
            if kind is None and item.size <= _SMALL_FILE_BYTES:
                self._small_file(path, item, previous)
            elif previous is not None and (previous.size, previous.attributes.mtime_ns) == (
                item.size,
                item.attributes.mtime_ns,
            ):
                self._keep(path, previous, item)
            elif kind == LOG_SUFFIX and previous is not None and self._grew(previous, item):
                if previous.size == item.size:
                    self._keep(path, previous, item)
                else:
                    self._upload(path, item, previous)
                    return True  # (the upload closes it)
            else:
                self._upload(path, item, None)
                return True
        except BaseException:
            item.close()
            raise
        item.close()
        return True

    def _small_file(self, path: str, item: SourceFile, previous: StoredFile | None) -> None:
        """A checkpoint, a snapshot, metadata: generated ones change without their mtime, so
        the bytes are compared (a larger one, a KRaft snapshot, goes by size and mtime)."""
        data = b"".join(item.chunks())
        crc = zlib.crc32(data)
        if previous is not None and (previous.size, previous.crc32) == (len(data), crc):
            self._keep(path, previous, item)
            return
        key = self._new_key(path)
        self.store.put(key, data)
        self.catalogue.files[path] = StoredFile([(key, len(data))], len(data), crc, item.attributes)
        self._sent(path, len(data), appended=False)
        self._advance(item.size)

    def _keep(self, path: str, previous: StoredFile, item: SourceFile) -> None:
        self.catalogue.files[path] = replace(previous, attributes=item.attributes)
        with self._lock:
            self.stats.files_skipped += 1
        self._advance(item.size)

    def _grew(self, previous: StoredFile, item: SourceFile) -> bool:
        """Whether the stored copy is the start of the file (first and last bytes compared, as
        the local copy does), and may be added to rather than uploaded whole."""
        if not 0 < previous.size <= item.size or len(previous.pieces) >= MAX_PIECES:
            return False
        tail = min(TAIL_BYTES, previous.size)
        stored = StoredFileReader(self.store, "", previous, read_ahead=False)  # (each piece opened once)
        try:
            for position, length in ((0, min(HEAD_BYTES, previous.size)), (previous.size - tail, tail)):
                if stored.read(position, length) != item.read(position, length):
                    return False
        finally:
            stored.close()
        return True

    def _new_key(self, path: str) -> str:
        key = path if path not in self._taken else f"{path}~{self.catalogue.run}"
        with self._lock:
            self._taken.add(key)
        return key

    def _upload(self, path: str, item: SourceFile, grown: StoredFile | None) -> None:
        """Upload the file (or, `grown`, its bytes past the stored copy) on the pool."""
        self._slots.acquire()
        try:
            key = self._new_key(path)
            start = grown.size if grown is not None else 0
            future = self._pool.submit(self._send, path, key, item, start, grown)
        except BaseException:
            self._slots.release()
            raise
        self._pending.append(future)

    def _send(self, path: str, key: str, item: SourceFile, start: int, grown: StoredFile | None) -> None:
        try:
            after = grown.crc32 if grown is not None else 0
            upload = Upload(
                size=item.size - start, mtime_ns=item.attributes.mtime_ns, start=start, after=after, crc32=0
            )
            summarizer = _summarizer(path, item, grown)
            done = self._left_by_a_cut_run(key, upload)
            if done is not None:  # (its bytes are the file's: stored as they are)
                crc, sent = done.crc32, done.size
                if summarizer is not None:  # (read here for its summary only)
                    for chunk in item.chunks(start):
                        summarizer.feed(chunk)
                self._advance(item.size)
            else:
                crc, sent = after, 0
                with self.store.writer(key) as writer:
                    for chunk in item.chunks(start):
                        writer.write(chunk)
                        crc = zlib.crc32(chunk, crc)
                        sent += len(chunk)
                        if summarizer is not None:
                            summarizer.feed(chunk)
                        self._advance(len(chunk))
                self._advance(start + (item.size - start - sent))  # (what was not sent counts as done)
                self._uploaded(key, replace(upload, size=sent, crc32=crc))
            pieces = [*(grown.pieces if grown is not None else ()), (key, sent)]
            summary = summarizer.summary() if summarizer is not None else None
            if summary is not None and summary.size != start + sent:
                summary = None
            stored = StoredFile(pieces, start + sent, crc, item.attributes, summary)
            with self._lock:
                self.catalogue.files[path] = stored
            if done is not None:
                self._kept_upload(path, sent)
            else:
                self._sent(path, sent, appended=grown is not None)
        finally:
            item.close()
            self._slots.release()

    def _left_by_a_cut_run(self, key: str, upload: Upload) -> Upload | None:
        """What a run that did not complete uploaded to `key`, when it holds what is to be sent:
        its journal says so (the same part of a file of that size and mtime) and the object is
        there, of that size."""
        done = self._journal.get(key)
        if done is None or self._unnamed.get(key) != upload.size:
            return None
        same = (done.size, done.mtime_ns, done.start, done.after) == (
            upload.size,
            upload.mtime_ns,
            upload.start,
            upload.after,
        )
        return done if same else None

    def _uploaded(self, key: str, upload: Upload) -> None:
        """An upload is in the run's journal, written out after a large upload and now and then:
        a run cut short leaves what it completed for the next (`_left_by_a_cut_run`)."""
        with self._lock:
            self._done[key] = upload
            due = upload.size >= JOURNAL_AFTER_BYTES or time.monotonic() >= self._journal_due
            if due:
                self._journal_due = time.monotonic() + JOURNAL_INTERVAL_S
        if due:
            self.write_journal()

    def write_journal(self) -> None:
        with self._lock:
            document = {
                "run": self.catalogue.run,
                "uploads": {key: dataclasses.asdict(upload) for key, upload in self._done.items()},
            }
        self.store.put(JOURNAL_KEY, json.dumps(document).encode())

    def _kept_upload(self, path: str, size: int) -> None:
        with self._lock:
            self.stats.files_skipped += 1
            self._said.append(f"kept {path} ({size} bytes, uploaded by a run that did not complete)")

    def _wait(self, *, everything: bool) -> None:
        """Raise the first failed upload's error (`everything`: after all have ended)."""
        if not self._pending:
            return
        if everything:
            wait(self._pending, return_when=FIRST_EXCEPTION)
        done = [future for future in self._pending if future.done()]
        self._pending = [future for future in self._pending if not future.done()]
        for future in done:
            future.result()
        if everything and self._pending:
            self._wait(everything=True)

    def _advance(self, amount: int) -> None:
        with self._lock:
            self.progress.advance(amount)

    def _sent(self, path: str, sent: int, *, appended: bool) -> None:
        with self._lock:
            self.stats.files_sent += 1
            self.stats.bytes_sent += sent
            if appended:
                self.stats.files_appended += 1
            self._said.append(f"appended {path} (+{sent} bytes)" if appended else f"sent {path} ({sent} bytes)")

    def _say_now(self) -> None:
        """-v's lines of what was stored, written by the walking thread only: a reader that stops
        reading holds it, never an upload (which a Ctrl-C then waits for)."""
        with self._lock:
            lines, self._said = self._said, []
        if self.say is not None:
            for line in lines:
                self.say(line)


def collect_garbage(store: ObjectStore, catalogue: Catalogue, previous: Catalogue | None) -> int:
    """After a run's catalogue is written: delete the objects neither it nor the one before it
    names, and the catalogues before that one. Returns how many objects were deleted."""
    kept = catalogue.keys() | (previous.keys() if previous is not None else set())
    kept_catalogues = {catalogue_key(catalogue.run)} | ({catalogue_key(previous.run)} if previous else set())
    deleted = 0
    for info in store.list():
        if info.key.startswith(CATALOGUE_DIR + "/"):
            if info.key in kept_catalogues or not CATALOGUE_NAME.match(info.key[len(CATALOGUE_DIR) + 1 :]):
                continue
        elif info.key in kept:
            continue
        store.delete(info.key)
        deleted += 1
    return deleted


class StoredSource:
    """A complete run's copy read from the store, as the local copy reads a source (a `Source`):
    restore copies it into a data dir. Reads of a file from its start to its end check its
    CRC-32 against the catalogue's."""

    def __init__(self, store: ObjectStore, catalogue: Catalogue, root: tuple[str, ...] = ()) -> None:
        self.store = store
        self.catalogue = catalogue
        self.root = root  # (one log dir of a backup of several: ("0",), …)
        self._children: dict[tuple[str, ...], list[tuple[str, bool]]] = {}
        for path in catalogue.directories:
            if path:
                parts = tuple(path.split("/"))
                self._children.setdefault(parts[:-1], []).append((parts[-1], True))
        for path in catalogue.files:
            parts = tuple(path.split("/"))
            self._children.setdefault(parts[:-1], []).append((parts[-1], False))

    def names(self, parts: tuple[str, ...]) -> list[tuple[str, bool]]:
        key = (*self.root, *parts)
        if "/".join(key) not in self.catalogue.directories:
            raise FileNotFoundError("/".join(key))
        return sorted(self._children.get(key, []))

    def directory(self, parts: tuple[str, ...]) -> FileAttributes:
        try:
            return self.catalogue.directories["/".join((*self.root, *parts))]
        except KeyError:
            raise FileNotFoundError("/".join((*self.root, *parts))) from None

    def open(self, parts: tuple[str, ...]) -> SourceFile:
        path = "/".join((*self.root, *parts))
        stored = self.catalogue.files.get(path)
        if stored is None:
            raise FileNotFoundError(path)
        reader = StoredFileReader(self.store, path, stored)
        return SourceFile(self.store.name(path), stored.size, stored.attributes, reader.read, reader.close, exact=True)

    def total_bytes(self) -> int:
        prefix = "/".join(self.root) + "/" if self.root else ""
        return sum(stored.size for path, stored in self.catalogue.files.items() if path.startswith(prefix))


def _summarizer(path: str, item: SourceFile, grown: StoredFile | None) -> SegmentSummarizer | None:
    """The summarizer of a `.log` about to be sent (from byte `grown.size` when it grew), None
    for any other file. A grown `.log` stored without a summary (by an older seglogfs) has its
    stored part read here first, locally."""
    parsed = parse_segment_file_name(path.rsplit("/", 1)[-1])
    if parsed is None or parsed[1] != LOG_SUFFIX or parsed[2]:
        return None
    if grown is not None and grown.summary is not None:
        return SegmentSummarizer(parsed[0], grown.summary)
    summarizer = SegmentSummarizer(parsed[0])
    if grown is not None:
        position = 0
        while position < grown.size:
            data = item.read(position, min(1 << 20, grown.size - position))
            if not data:
                return None
            summarizer.feed(data)
            position += len(data)
    return summarizer


def _tell(line: str) -> None:
    with contextlib.suppress(OSError):
        print(f"seglogfs: {line}", file=sys.stderr, flush=True)
