"""Types of the engine's compiled core (engine/core/*.c, the extension `seglogfs.engine._core`)."""

from typing import overload

import numpy as np
from typing_extensions import Buffer

# What a batch split weighs a record at beyond its key's and value's bytes (its varints).
ESTIMATED_RECORD_VARINTS: int

def record_fields(section: Buffer | np.ndarray, count: int, out: Buffer | np.ndarray, /) -> None: ...
@overload
def encode_records(
    values: list[bytes | None],
    keys: list[bytes | None] | None,
    header_blobs: list[bytes] | None,
    timestamp_deltas: int | list[int],
    offset_deltas: list[int] | None,
    /,
) -> bytes: ...
@overload
def encode_records(
    values: list[bytes | None],
    keys: list[bytes | None] | None,
    header_blobs: list[bytes] | None,
    timestamp_deltas: int | list[int],
    offset_deltas: list[int] | None,
    room: int,
    /,
) -> bytes | bytearray: ...
def encode_value_run(
    values: list[bytes | None], start: int, stop: int, room: int, most: int, /
) -> tuple[bytes | bytearray, int]: ...
def encode_columns(
    n: int,
    value_data: Buffer | np.ndarray,
    value_starts: Buffer | np.ndarray,
    value_lengths: Buffer | np.ndarray,
    key_data: Buffer | np.ndarray | None,
    key_starts: Buffer | np.ndarray | None,
    key_lengths: Buffer | np.ndarray | None,
    timestamp_delta: int,
    batch_firsts: Buffer | np.ndarray,
    ends: Buffer | np.ndarray,
    /,
) -> bytes: ...
def json_text_sizes(
    section: Buffer | np.ndarray, starts: Buffer | np.ndarray, lengths: Buffer | np.ndarray, out: Buffer | np.ndarray, /
) -> None: ...
def render_text_section(
    section: Buffer | np.ndarray,
    count: int,
    base_offset: int,
    base_timestamp: int,
    log_append_time: int | None,
    min_offset: int,
    timestamp_label: bytes | None,
    partition_field: bytes | None,
    print_offset: bool,
    print_key: bool,
    print_value: bool,
    separator: bytes,
    line_end: bytes,
    null: bytes,
    offsets: np.ndarray,
    ends: np.ndarray,
    /,
) -> tuple[bytes, int]: ...
def render_text_range(
    fd: int,
    start: int,
    end: int,
    size: int,
    create_label: bytes | None,
    append_label: bytes | None,
    partition_field: bytes | None,
    print_offset: bool,
    print_key: bool,
    print_value: bool,
    separator: bytes,
    line_end: bytes,
    null: bytes,
    small_batch_records: int,
    nowait: bool = False,
    /,
) -> bytes | None: ...
def render_json_range(
    fd: int,
    start: int,
    end: int,
    size: int,
    prefix: bytes,
    create_kind: bytes,
    append_kind: bytes,
    nowait: bool = False,
    /,
) -> bytes | None: ...
def render_json_section(
    section: Buffer | np.ndarray,
    count: int,
    base_offset: int,
    base_timestamp: int,
    log_append_time: int | None,
    min_offset: int,
    prefix: bytes,
    timestamp_type: bytes,
    offsets: np.ndarray,
    ends: np.ndarray,
    /,
) -> tuple[bytes, int] | None: ...
def crc32c(data: Buffer | np.ndarray, /) -> int: ...
def crc32c_without_hardware(data: Buffer | np.ndarray, /) -> int: ...
def crc32c_without_folding(data: Buffer | np.ndarray, /) -> int: ...
def crc32c_folding() -> bool: ...
def keep_freed_memory(most: int, /) -> bool: ...
def allocates_ahead(fd: int, /) -> bool: ...
def allocate_ahead(fd: int, offset: int, length: int, /) -> int: ...
def blob_lengths(blobs: list[bytes | bytearray | None], out: Buffer | np.ndarray, /) -> None: ...
def murmur2(
    data: Buffer | np.ndarray, starts: Buffer | np.ndarray, lengths: Buffer | np.ndarray, out: Buffer | np.ndarray, /
) -> None: ...
def gather(
    section: Buffer | np.ndarray,
    starts: Buffer | np.ndarray,
    lengths: Buffer | np.ndarray,
    out: Buffer | np.ndarray,
    out_offsets: Buffer | np.ndarray,
    /,
) -> None: ...
