"""Object storage as a place for data dirs, named by URI: `s3://bucket/prefix` (and `gs://`,
`abfs://`, `hdfs://`, which pyarrow's file systems reach when they are built with them).

Credentials and endpoints come the way the AWS tools take them, for S3 and S3-compatible stores:

* keys: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, then `AWS_PROFILE` and
  `~/.aws/`, then the instance's role (the SDK's chain);
* region: `AWS_REGION` or `AWS_DEFAULT_REGION`;
* endpoint of an S3-compatible server: `AWS_ENDPOINT_URL_S3`, else `AWS_ENDPOINT_URL`
  (`http://host:9000`: the scheme says whether TLS is used).

Per command or per query the URI's query string sets pyarrow's S3 options, which win over the
environment: `s3://bucket/prefix?endpoint_override=host:9000&scheme=http&region=eu-west-1`, and
`connect_timeout`, `request_timeout` (seconds without a byte before a request is given up: a
stalled server) and `retries`. Keys may be given as `access_key` and `secret_key` too, but the
environment is the place for them: a URI is written into shell histories and Spark plans.

Secrets are never printed: messages name objects by `ObjectStore.name`, the URI's scheme,
bucket and key without its query or user info. Every failure of the store is an
`ObjectStoreError` naming the object and what was being done, with the store's own reason.

Thread-safe: an `ObjectStore` may be used by several threads at once (pyarrow's file systems
are). It holds a file system and so the credentials: it is not pickled; a Spark task opens its own
from the URI (`open_object_store`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import parse_qsl, urlsplit

from seglogfs.engine.errors import EngineError

if TYPE_CHECKING:
    import pyarrow.fs as pafs

SCHEMES = ("s3", "gs", "gcs", "abfs", "abfss", "hdfs")

_S3_OPTIONS = {
    "endpoint_override": str,
    "scheme": str,
    "region": str,
    "access_key": str,
    "secret_key": str,
    "session_token": str,
    "anonymous": bool,
    "connect_timeout": float,
    "request_timeout": float,
    "force_virtual_addressing": bool,
    "tls_ca_file_path": str,
}

CONNECT_TIMEOUT_S = 5.0

REQUEST_TIMEOUT_S = 10.0  # a request with no byte for this long is given up (then retried)

ATTEMPTS = 3


class ObjectStoreError(EngineError):
    """The object store refused or failed a request (or could not be reached): names the object."""


def is_object_store_uri(text: str) -> bool:
    """Whether `text` names a place in object storage rather than a local path."""
    scheme, separator, _ = text.partition("://")
    return bool(separator) and scheme.lower() in SCHEMES


@dataclass(frozen=True)
class ObjectLocation:
    """A parsed URI: the store (`scheme`, `bucket`), the `prefix` (no leading or trailing `/`)
    and the options of its query. `display` is what messages show (no query, no user info)."""

    scheme: str
    bucket: str
    prefix: str
    options: Mapping[str, str]

    @property
    def display(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/")

    def __repr__(self) -> str:  # (never the options: they may hold a key)
        return f"ObjectLocation({self.display!r})"


def parse_location(uri: str) -> ObjectLocation:
    """`scheme://bucket/prefix?options`; ValueError (naming the place without its query, which
    may hold a key) when it is not one."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    shown = f"{parts.scheme}://{parts.hostname or ''}{parts.path}"
    if scheme not in SCHEMES:
        raise ValueError(f"{shown}: not an object store URI (schemes: {', '.join(s + '://' for s in SCHEMES)})")
    bucket = parts.hostname or ""
    if not bucket:
        raise ValueError(f"{shown}: no bucket in the URI")
    segments = [segment for segment in parts.path.split("/") if segment]
    if any(segment in (".", "..") for segment in segments):
        raise ValueError(f"{shown}: '.' and '..' are not names in a bucket")
    options = dict(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False))
    if parts.username is not None:  # s3://KEY:SECRET@bucket/…, as pyarrow's from_uri takes it
        options.setdefault("access_key", parts.username)
        options.setdefault("secret_key", parts.password or "")
    if scheme == "s3":
        unknown = sorted(set(options) - set(_S3_OPTIONS) - {"retries"})
        if unknown:
            raise ValueError(
                f"{shown}: unknown option {unknown[0]!r} in the URI (options: {', '.join(_S3_OPTIONS)}, retries)"
            )
    location = ObjectLocation(scheme, bucket, "/".join(segments), options)
    for name, value in options.items():  # (numbers checked here: a bad one is the command line's fault)
        if name == "retries":
            _number(location, name, value, int)
        elif _S3_OPTIONS.get(name) is float:
            _number(location, name, value, float)
    return location


def _arrow_fs() -> ModuleType:
    """pyarrow's file systems, imported on first use: pyarrow is optional (the `objectstore`
    extra), and its import would cost every command that never touches a store."""
    try:
        import pyarrow.fs  # noqa: PLC0415 (see the docstring)
    except ImportError:
        raise ObjectStoreError("object storage needs pyarrow (pip install 'seglogfs[objectstore]')") from None
    return pyarrow.fs


def _s3_file_system(location: ObjectLocation) -> pafs.FileSystem:
    pafs = _arrow_fs()
    settings: dict[str, Any] = {
        "connect_timeout": CONNECT_TIMEOUT_S,
        "request_timeout": REQUEST_TIMEOUT_S,
    }
    # (pyarrow's constructor takes the keys from the environment itself, but not the endpoint,
    # which only `from_uri` reads, without the timeouts; the region is given as the AWS tools take it.)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        settings["region"] = region
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        split = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        settings["endpoint_override"] = split.netloc
        settings["scheme"] = split.scheme
    attempts = ATTEMPTS
    for name, value in location.options.items():
        if name == "retries":
            attempts = 1 + _number(location, name, value, int)
            continue
        kind = _S3_OPTIONS[name]
        if kind is bool:
            settings[name] = value.lower() in ("1", "true", "yes")
        elif kind is float:
            settings[name] = _number(location, name, value, float)
        else:
            settings[name] = value
    if "endpoint_override" in location.options and "://" in settings["endpoint_override"]:
        split = urlsplit(settings["endpoint_override"])
        settings["endpoint_override"] = split.netloc
        if "scheme" not in location.options:  # (the URI's endpoint says its scheme, over the environment's)
            settings["scheme"] = split.scheme
    settings["retry_strategy"] = pafs.AwsStandardS3RetryStrategy(max_attempts=attempts)
    return pafs.S3FileSystem(**settings)


def _number(location: ObjectLocation, name: str, value: str, kind: type) -> Any:
    try:
        number = kind(value)
    except ValueError:
        raise ValueError(f"{location.display}: option {name}={value!r} is not a number") from None
    if not number >= 0:  # (negative, or NaN)
        raise ValueError(f"{location.display}: option {name}={value!r} is negative")
    return number


def open_file_system(location: ObjectLocation) -> pafs.FileSystem:
    """pyarrow's file system for the location's store (ObjectStoreError when pyarrow is missing
    or refuses the options)."""
    pafs = _arrow_fs()
    try:
        if location.scheme == "s3":
            return _s3_file_system(location)
        file_system, _ = pafs.FileSystem.from_uri(f"{location.scheme}://{location.bucket}/{location.prefix}")
        return file_system
    except (OSError, ValueError, TypeError) as error:  # (pyarrow's ArrowInvalid is a ValueError)
        raise ObjectStoreError(f"{location.display}: {_reason(error)}") from None


_NOISE = re.compile(r"^(When|After) [^:]*: ")


def _reason(error: BaseException) -> str:
    """The store's reason for a failure, in one line (pyarrow's messages start with what it was
    doing, which the caller says better)."""
    text = " ".join(str(error).split())
    return _NOISE.sub("", text) or type(error).__name__


@dataclass(frozen=True)
class ObjectInfo:
    """An object found by a listing: its key below the store's prefix, and its size."""

    key: str
    size: int


class ObjectStore:
    """The objects below a location's prefix, named by keys relative to it (`topic-0/0.log`)."""

    def __init__(self, location: ObjectLocation, file_system: pafs.FileSystem | None = None) -> None:
        self.location = location
        self.file_system = file_system if file_system is not None else open_file_system(location)
        self._root = f"{location.bucket}/{location.prefix}".rstrip("/")

    def path(self, key: str) -> str:
        """The file system's path of an object (`bucket/prefix/key`)."""
        return f"{self._root}/{key}" if key else self._root

    def name(self, key: str = "") -> str:
        """The object as messages name it: `s3://bucket/prefix/key`."""
        return f"{self.location.display}/{key}" if key else self.location.display

    @contextmanager
    def _failing_as(self, key: str, doing: str) -> Iterator[None]:
        try:
            yield
        except FileNotFoundError:
            raise
        except OSError as error:
            raise ObjectStoreError(f"{self.name(key)}: {doing} failed: {_reason(error)}") from None

    def list(self, key: str = "") -> list[ObjectInfo]:
        """Every object below `key` (a directory's key, or "" for the whole prefix), by key."""
        pafs = _arrow_fs()
        base = self.path(key)
        with self._failing_as(key, "listing"):
            found = self.file_system.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        start = len(self._root) + 1 if self._root else 0
        return sorted(
            (ObjectInfo(info.path[start:], info.size) for info in found if info.type == pafs.FileType.File),
            key=lambda info: info.key,
        )

    def size(self, key: str) -> int | None:
        """The object's size, None when there is none."""
        pafs = _arrow_fs()
        with self._failing_as(key, "looking up"):
            info = self.file_system.get_file_info(self.path(key))
        return info.size if info.type == pafs.FileType.File else None

    def open(self, key: str) -> ObjectReader:
        """The object open for reads at any offset (one request to learn its size)."""
        with self._failing_as(key, "opening"):
            return ObjectReader(self, key, self.file_system.open_input_file(self.path(key)))

    def read(self, key: str, offset: int, length: int) -> bytes:
        """`length` bytes from `offset` (fewer at the object's end)."""
        with self.open(key) as reader:
            return reader.read(offset, length)

    def read_whole(self, key: str, max_bytes: int) -> bytes:
        """A small object whole; ObjectStoreError when it is larger than `max_bytes`."""
        with self._failing_as(key, "reading"), self.file_system.open_input_stream(self.path(key)) as stream:
            data = stream.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise ObjectStoreError(f"{self.name(key)}: larger than {max_bytes} bytes")
        return bytes(data)

    @contextmanager
    def writer(self, key: str, metadata: Mapping[str, str] | None = None) -> Iterator[ObjectWriter]:
        """An object written as a stream (multipart for a big one, its parts uploaded in the
        background), whole once the block ends. A block that raises may still leave an object
        of what was written (pyarrow completes an upload it closes): callers write to keys that
        nothing names until the upload has succeeded."""
        with self._failing_as(key, "writing"):
            stream = self.file_system.open_output_stream(self.path(key), metadata=dict(metadata or {}))
        try:
            yield ObjectWriter(self, key, stream)
        finally:
            with self._failing_as(key, "writing"):
                stream.close()

    def put(self, key: str, data: bytes, metadata: Mapping[str, str] | None = None) -> None:
        with self.writer(key, metadata) as stream:
            stream.write(data)

    def metadata(self, key: str) -> dict[str, str]:
        """The user metadata the object was written with (`writer`'s)."""
        with self._failing_as(key, "looking up"), self.file_system.open_input_stream(self.path(key)) as stream:
            return {
                (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                for k, v in stream.metadata().items()
            }

    def delete(self, key: str) -> None:
        with self._failing_as(key, "deleting"), suppress(FileNotFoundError):
            self.file_system.delete_file(self.path(key))


class ObjectReader:
    """An object open for reads (`ObjectStore.open`): each read is one ranged GET."""

    def __init__(self, store: ObjectStore, key: str, file: Any) -> None:
        self._store = store
        self.key = key
        self._file = file
        self.size: int = file.size()

    def read(self, offset: int, length: int) -> bytes:
        if length <= 0 or offset >= self.size:
            return b""
        with self._store._failing_as(self.key, f"reading bytes {offset}-{offset + length - 1}"):
            return bytes(self._file.read_at(min(length, self.size - offset), offset))

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> ObjectReader:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class ObjectWriter:
    """An object being written (`ObjectStore.writer`): its store's failures are ObjectStoreErrors."""

    def __init__(self, store: ObjectStore, key: str, stream: BinaryIO) -> None:
        self._store = store
        self._key = key
        self._stream = stream

    def write(self, data: bytes | memoryview) -> None:
        with self._store._failing_as(self._key, "writing"):
            self._stream.write(data)


def open_object_store(uri: str) -> ObjectStore:
    """The store a URI names (ValueError for a malformed URI, ObjectStoreError when the store
    cannot be opened)."""
    return ObjectStore(parse_location(uri))
