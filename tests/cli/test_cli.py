"""The `seglogfs` command line, run as a real process."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.engine.partitioner import partition_for_key
from tests.cli.support import Holder as holder
from tests.conftest import NOW_MS, REPO, assert_log_dir_valid, kafka_fixtures

SEGLOGFS = [sys.executable, "-m", "seglogfs.mount_tools.cli"]


def run(*args: str, stdin: bytes = b"", check: bool = True) -> subprocess.CompletedProcess[bytes]:
    result = subprocess.run([*SEGLOGFS, *args], input=stdin, capture_output=True, cwd=REPO, timeout=120, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"seglogfs {' '.join(args)} exited {result.returncode}: {result.stderr.decode()}")
    return result


def digest(log_dir: Path) -> str:
    """A hash of every segment file's bytes: what "nothing stored was lost or changed" means."""
    h = hashlib.sha256()
    for path in sorted(log_dir.glob("*/*.log")):
        h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()


@pytest.fixture
def filled(log_dir: Path) -> Path:
    run("produce", str(log_dir), "--topic", "t", stdin=b"alpha\nbeta\ngamma\n")
    return log_dir


def test_produce_then_consume_text(log_dir: Path) -> None:
    run(
        "produce",
        str(log_dir),
        "--topic",
        "t",
        "--property",
        "parse.key=true",
        "--property",
        "key.separator=:",
        stdin=b"k1:one\nk2:two\n:empty-key\nk3:\nlast-without-newline:x",
    )
    result = run(
        "consume",
        str(log_dir),
        "--topic",
        "t",
        "--from-beginning",
        "--property",
        "print.key=true",
        "--property",
        "print.offset=true",
        "--property",
        "key.separator=|",
    )
    assert result.stdout.splitlines() == [
        b"Offset:0|k1|one",
        b"Offset:1|k2|two",
        b"Offset:2||empty-key",
        b"Offset:3|k3|",
        b"Offset:4|last-without-newline|x",
    ]
    assert b"Processed a total of 5 messages" in result.stderr
    assert_log_dir_valid(log_dir)


def test_console_consumer_field_order_and_null_literal(log_dir: Path) -> None:
    run("produce", str(log_dir), "--topic", "t", "--property", "null.marker=NULL", stdin=b"NULL\nv\n")
    result = run(
        "consume",
        str(log_dir),
        "--topic",
        "t",
        "--from-beginning",
        "--property",
        "print.timestamp=true",
        "--property",
        "print.partition=true",
        "--property",
        "print.headers=true",
        "--property",
        "print.key=true",
        "--property",
        "null.literal=<none>",
    )
    first, second = result.stdout.splitlines()
    fields = first.split(b"\t")
    assert fields[0].startswith(b"CreateTime:") and fields[1:] == [b"Partition:0", b"NO_HEADERS", b"<none>", b"<none>"]
    assert second.endswith(b"\t<none>\tv")


def test_consume_defaults_to_the_log_end_like_kafka(filled: Path) -> None:
    result = run("consume", str(filled), "--topic", "t")
    assert result.stdout == b"" and b"Processed a total of 0 messages" in result.stderr


def test_consume_from_offset_and_timestamp(filled: Path) -> None:
    assert run("consume", str(filled), "--topic", "t", "--offset", "1").stdout == b"beta\ngamma\n"
    assert run("consume", str(filled), "--topic", "t", "--offset", "3").stdout == b""
    assert run("consume", str(filled), "--topic", "t", "--timestamp", "2000-01-01T00:00:00Z").stdout.count(b"\n") == 3
    assert run("consume", str(filled), "--topic", "t", "--timestamp", "2999-01-01").stdout == b""
    assert (
        run("consume", str(filled), "--topic", "t", "--from-beginning", "--max-messages", "2").stdout
        == b"alpha\nbeta\n"
    )


def test_jsonl_round_trips_binary_keys_values_and_headers(log_dir: Path) -> None:
    lines = [
        {"key": "k", "value": "text", "headers": [{"key": "h", "value": "x"}], "timestamp": 1_700_000_000_000},
        {
            "key": None,
            "value": {"base64": "AP8Q"},
            "headers": [{"key": "bin", "value": {"base64": "gA=="}}, {"key": "nul", "value": None}],
        },
        {"key": {"base64": "/w=="}, "value": None, "topic": "ignored", "offset": 99},
    ]
    stdin = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    run("produce", str(log_dir), "--topic", "j", "--format", "jsonl", stdin=stdin)
    out = [
        json.loads(line)
        for line in run(
            "consume", str(log_dir), "--topic", "j", "--from-beginning", "--format", "jsonl"
        ).stdout.splitlines()
    ]
    assert [(o["key"], o["value"], o["headers"]) for o in out] == [
        ("k", "text", [{"key": "h", "value": "x"}]),
        (None, {"base64": "AP8Q"}, [{"key": "bin", "value": {"base64": "gA=="}}, {"key": "nul", "value": None}]),
        ({"base64": "/w=="}, None, []),
    ]
    assert out[0]["timestamp"] == 1_700_000_000_000 and out[0]["timestampType"] == "CreateTime"
    assert [o["offset"] for o in out] == [0, 1, 2] and {o["topic"] for o in out} == {"j"}


def test_keyed_records_go_where_kafkas_partitioner_sends_them(log_dir: Path) -> None:
    keys = [f"user-{i}" for i in range(40)]
    run(
        "produce",
        str(log_dir),
        "--topic",
        "p",
        "--override",
        "num.partitions=4",
        "--property",
        "parse.key=true",
        "--property",
        "key.separator=:",
        stdin="".join(f"{k}:v-{k}\n" for k in keys).encode(),
    )
    for partition in range(4):
        result = run(
            "consume",
            str(log_dir),
            "--topic",
            "p",
            "--partition",
            str(partition),
            "--from-beginning",
            "--format",
            "jsonl",
        )
        got = [json.loads(line)["key"] for line in result.stdout.splitlines()]
        assert got == [k for k in keys if partition_for_key(k.encode(), 4) == partition]


def test_dump_prints_kafka_dump_log_lines(filled: Path) -> None:
    segment = filled / "t-0" / "00000000000000000000.log"
    out = run("dump", "--print-data-log", str(segment)).stdout.decode().splitlines()
    assert out[0] == f"Dumping {segment}" and out[1] == "Log starting offset: 0"
    assert out[2].startswith(
        "baseOffset: 0 lastOffset: 2 count: 3 baseSequence: -1 lastSequence: -1 producerId: -1 "
        "producerEpoch: -1 partitionLeaderEpoch: 0 isTransactional: false isControl: false "
        "deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: "
    )
    assert out[2].endswith(
        "magic: 2 compresscodec: none crc: " + out[2].split("crc: ")[1].split()[0] + " isvalid: true"
    )
    assert out[3].startswith("| offset: 0 CreateTime: ") and out[3].endswith(
        "keySize: -1 valueSize: 5 sequence: -1 headerKeys: [] payload: alpha"
    )
    batches_only = run("dump", str(segment)).stdout.decode().splitlines()
    assert len(batches_only) == 3
    timeindex = run("dump", str(segment.with_suffix(".timeindex"))).stdout.decode().splitlines()
    # (A time index entry names its batch's last offset, as Kafka's do.)
    assert timeindex[1].startswith("timestamp: ") and timeindex[1].endswith(" offset: 2")


def test_dump_of_index_entries(log_dir: Path) -> None:
    # Index entries come within one session (the byte count since the last entry restarts at each
    # open, as in Kafka), so the batches are appended in-process.
    config = BrokerConfig.load(overrides=["log.index.interval.bytes=1"], log_dirs=[log_dir])
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        log = data_dir.partition_for_append("i", 0, now_ms=NOW_MS)[0]
        for i in range(4):
            log.append_records([b"line-%d" % i], now_ms=NOW_MS + i)
    index = log_dir / "i-0" / "00000000000000000000.index"
    out = run("dump", str(index)).stdout.decode().splitlines()
    assert out[0] == f"Dumping {index}"
    assert out[1:] == ["offset: 1 position: 74", "offset: 2 position: 148", "offset: 3 position: 222"]
    assert run("dump", "--verify-index-only", str(index)).stdout.decode().splitlines() == [f"Dumping {index}"]
    assert (
        run("dump", "--index-sanity-check", str(index)).stdout.decode().splitlines()[1]
        == f"{index} passed sanity check."
    )


def test_consume_reads_a_dir_another_process_holds(filled: Path) -> None:
    with holder(filled) as pid:
        result = run("consume", str(filled), "--topic", "t", "--from-beginning")
        assert result.stdout == b"alpha\nbeta\ngamma\n"
        locked = run("produce", str(filled), "--topic", "t", stdin=b"more\n", check=False)
        assert locked.returncode == 3
        assert f"in use by process {pid}".encode() in locked.stderr
        checked = run("check", str(filled), check=False)
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_consume_and_dump_work_on_a_read_only_copy(filled: Path, tmp_path: Path) -> None:
    target = tmp_path / "ro"
    target.mkdir()
    subprocess.run(["mount", "--bind", str(filled), str(target)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(target)], check=True)
        before = sorted(p.name for p in target.rglob("*"))
        assert run("consume", str(target), "--topic", "t", "--from-beginning").stdout == b"alpha\nbeta\ngamma\n"
        assert b"isvalid: true" in run("dump", str(target / "t-0" / "00000000000000000000.log")).stdout
        assert sorted(p.name for p in target.rglob("*")) == before
    finally:
        subprocess.run(["umount", str(target)], check=True)


# -- bad input: one clear line, a non-zero exit, nothing stored lost ------------------------------------
def corrupt_segment(log_dir: Path) -> None:
    path = log_dir / "t-0" / "00000000000000000000.log"
    data = bytearray(path.read_bytes())
    data[70] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate_index(log_dir: Path) -> None:
    path = log_dir / "t-0" / "00000000000000000000.timeindex"
    path.write_bytes(path.read_bytes()[:-3])


BAD_INPUTS = [
    # (name, damage, args, stdin, exit code, message on stderr (or stdout for check))
    (
        "corrupt segment",
        corrupt_segment,
        ["consume", "{d}", "--topic", "t", "--from-beginning"],
        b"",
        1,
        "00000000000000000000.log: corrupt record batch at position 0: CRC-32C mismatch",
    ),
    (
        "corrupt segment, check",
        corrupt_segment,
        ["check", "{d}"],
        b"",
        4,
        "00000000000000000000.log: invalid batch at position 0",
    ),
    (
        "truncated index, check",
        truncate_index,
        ["check", "{d}"],
        b"",
        4,
        "00000000000000000000.timeindex: 9 bytes is not a whole number of 12-byte entries",
    ),
    (
        "offset out of range",
        None,
        ["consume", "{d}", "--topic", "t", "--offset", "999"],
        b"",
        1,
        "offset 999 is out of range (log start offset 0, log end offset 3)",
    ),
    (
        "negative offset",
        None,
        ["consume", "{d}", "--topic", "t", "--offset", "-1"],
        b"",
        1,
        "offset -1 is out of range",
    ),
    (
        "unparseable timestamp",
        None,
        ["consume", "{d}", "--topic", "t", "--timestamp", "yesterday"],
        b"",
        1,
        "timestamp 'yesterday' is neither epoch milliseconds nor ISO-8601",
    ),
    (
        "malformed JSON line",
        None,
        ["produce", "{d}", "--topic", "t", "--format", "jsonl"],
        b'{"value": "ok"}\n{"value": oops}\n',
        1,
        "stdin line 2, column 11: malformed JSON",
    ),
    (
        "JSON without value",
        None,
        ["produce", "{d}", "--topic", "t", "--format", "jsonl"],
        b'{"key": "k"}\n',
        1,
        'stdin line 1: the record has no "value" field',
    ),
    (
        "bad base64",
        None,
        ["produce", "{d}", "--topic", "t", "--format", "jsonl"],
        b'{"value": {"base64": "!"}}\n',
        1,
        "stdin line 1: value has invalid base64",
    ),
    (
        "oversized record",
        None,
        ["produce", "{d}", "--topic", "t", "--override", "message.max.bytes=200"],
        b"fine\n" + b"x" * 300 + b"\n",
        1,
        "over max.message.bytes=200",
    ),
    (
        "missing key separator",
        None,
        ["produce", "{d}", "--topic", "t", "--property", "parse.key=true"],
        b"k\tv\nno-separator\n",
        1,
        "stdin line 2: no key separator",
    ),
    ("unknown topic", None, ["consume", "{d}", "--topic", "nope", "--from-beginning"], b"", 1, "unknown topic 'nope'"),
    (
        "unknown partition",
        None,
        ["consume", "{d}", "--topic", "t", "--partition", "7"],
        b"",
        1,
        "topic 't' has no partition 7",
    ),
    (
        "invalid topic name",
        None,
        ["produce", "{d}", "--topic", "../evil"],
        b"x\n",
        1,
        "topic name '../evil' has characters other than",
    ),
    (
        "bad override",
        None,
        ["consume", "{d}", "--topic", "t", "--override", "log.segment.bytes=big"],
        b"",
        1,
        "--override log.segment.bytes: invalid value 'big'",
    ),
    (
        "unknown property",
        None,
        ["consume", "{d}", "--topic", "t", "--property", "print.everything=true"],
        b"",
        1,
        "unknown formatter property 'print.everything'",
    ),
    (
        "two start points",
        None,
        ["consume", "{d}", "--topic", "t", "--offset", "1", "--from-beginning"],
        b"",
        2,
        "give one of --from-beginning, --offset and --timestamp",
    ),
    (
        "missing config file",
        None,
        ["consume", "{d}", "--topic", "t", "-c", "/nonexistent/server.properties"],
        b"",
        1,
        "cannot read /nonexistent/server.properties",
    ),
]


@pytest.mark.parametrize(
    ("name", "damage", "args", "stdin", "code", "message"), BAD_INPUTS, ids=[case[0] for case in BAD_INPUTS]
)
def test_bad_input_gets_one_clear_line(
    filled: Path, name: str, damage, args: list[str], stdin: bytes, code: int, message: str
) -> None:
    if damage is not None:
        damage(filled)
    before = digest(filled)
    result = run(*[a.replace("{d}", str(filled)) for a in args], stdin=stdin, check=False)
    said = (result.stderr + result.stdout).decode()
    assert result.returncode == code, said
    assert message in said, said
    assert "Traceback" not in said
    error_lines = [line for line in result.stderr.decode().splitlines() if line.startswith("seglogfs:")]
    assert len(error_lines) <= 1, said
    # Nothing already stored is lost: the first three records are intact unless the test damaged them.
    after = digest(filled)
    if damage is None and args[0] == "consume":
        assert after == before
    if damage is None:
        records = run("consume", str(filled), "--topic", "t", "--from-beginning").stdout.splitlines()
        assert records[:3] == [b"alpha", b"beta", b"gamma"]


def test_check_repair_fixes_a_torn_tail_and_a_damaged_index(filled: Path) -> None:
    segment = filled / "t-0" / "00000000000000000000.log"
    with open(segment, "ab") as handle:
        handle.write(b"\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x01")  # a torn batch header
    truncate_index(filled)
    result = run("check", str(filled), check=False)
    assert result.returncode == 4
    assert b"11 bytes after the last whole batch" in result.stdout
    repaired = run("check", "--repair", str(filled), check=False)
    # The torn header is cut from the log and kept beside it: not "clean", exit 7 while it is.
    assert repaired.returncode == 7, repaired.stdout + repaired.stderr
    assert b"no problems, but 11 bytes (0 records in intact batches) are set aside" in repaired.stdout
    [kept] = filled.parent.glob(f"{filled.name}.seglogfs-set-aside/*/t-0/00000000000000000003.log")
    assert kept.read_bytes() == b"\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x01"
    assert run("consume", str(filled), "--topic", "t", "--from-beginning").stdout == b"alpha\nbeta\ngamma\n"
    run("produce", str(filled), "--topic", "t", stdin=b"delta\n")
    assert run("consume", str(filled), "--topic", "t", "--offset", "3").stdout == b"delta\n"


def test_data_dir_written_by_cli_opens_in_engine_after_copy(filled: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(filled, copy)
    os.unlink(copy / ".lock")
    with DataDir.open(BrokerConfig.load(log_dirs=[copy]), now_ms=NOW_MS) as data_dir:
        assert [r.value for r in data_dir.partition("t", 0).records(0)] == [b"alpha", b"beta", b"gamma"]


def test_legacy_message_data_is_read_and_never_cut(tmp_path: Path) -> None:
    """Magic 0/1 segments read as any: `consume` shows their records, `check` finds them clean,
    `produce` appends v2 batches after them, and nothing (not even `check --repair`) cuts them."""
    copy = tmp_path / "legacy"
    shutil.copytree(kafka_fixtures() / "kafkalite-magic0", copy)
    for path in [copy, *copy.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    segment = copy / "numbers-0" / "00000000000000000000.log"
    before = segment.read_bytes()
    consumed = run("consume", str(copy), "--topic", "numbers", "--offset", "11391").stdout
    assert consumed == b"11390\n11391\n11392\n"
    hamlet = run("consume", str(copy), "--topic", "hamlet-gzip", "--from-beginning", "--max-messages", "2").stdout
    assert hamlet == b"The Tragedy of Hamlet, Prince of Denmark\nShakespeare homepage | Hamlet | Entire play\n"
    said = run("check", "--repair", str(copy)).stdout.decode()
    assert "clean" in said, said
    run("produce", str(copy), "--topic", "numbers", stdin=b"new\n")
    assert segment.read_bytes()[: len(before)] == before
    after = run("consume", str(copy), "--topic", "numbers", "--offset", "11393", "--property", "print.offset=true")
    assert after.stdout == b"Offset:11393\t11392\nOffset:11394\tnew\n"
    assert_log_dir_valid(copy)


def test_dump_reports_undecodable_records_as_bad_data(tmp_path: Path) -> None:
    import struct

    from seglogfs.engine.record.builder import build_batch as build
    from seglogfs.engine.record.records import compute_crc

    batch = bytearray(build([b"one", b"two"], timestamps=NOW_MS))
    struct.pack_into(">i", batch, 57, 3)  # claims three records, holds two; CRC made to match
    struct.pack_into(">I", batch, 17, compute_crc(batch))
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(bytes(batch))
    result = run("dump", "--deep-iteration", str(segment), check=False)
    assert result.returncode == 1
    assert b"batch at position 0 has undecodable records" in result.stderr
    assert b"Traceback" not in result.stderr and b"internal error" not in result.stderr


@pytest.mark.parametrize("fmt", ["text", "jsonl"])
def test_consume_reports_undecodable_records_after_the_good_batches(tmp_path: Path, fmt: str) -> None:
    """A batch whose CRC holds but whose records section does not parse (it claims a record more
    than it holds) ends `consume` with status 1 and one line naming the file and the batch's
    position, after the batches before it were printed."""
    import struct

    from seglogfs.engine.record.records import compute_crc

    data = tmp_path / "data"
    run("produce", str(data), "--topic", "t", stdin=b"".join(b"first-%d\n" % i for i in range(20)))
    run("produce", str(data), "--topic", "t", stdin=b"".join(b"second-%d\n" % i for i in range(20)))
    segment = data / "t-0" / "00000000000000000000.log"
    content = bytearray(segment.read_bytes())
    second = 12 + struct.unpack_from(">i", content, 8)[0]  # where the second batch starts
    struct.pack_into(">i", content, second + 57, 21)  # 21 records claimed, 20 held; CRC made to match
    struct.pack_into(">I", content, second + 17, compute_crc(content[second:]))
    segment.write_bytes(bytes(content))
    result = run("consume", str(data), "--topic", "t", "--from-beginning", "--format", fmt, check=False)
    assert result.returncode == 1
    assert result.stdout.count(b"first-") == 20 and b"second-" not in result.stdout
    assert result.stderr.decode().splitlines() == [
        f"seglogfs: {segment}: corrupt record batch at position {second}: undecodable records: "
        "record 20: its length is not a varint"
    ]


@pytest.mark.parametrize("fmt", ["text", "jsonl"])
@pytest.mark.parametrize("pad", [200, 1000])
def test_consume_reports_a_damaged_batch_after_those_before_it_far_into_the_log(
    tmp_path: Path, fmt: str, pad: int
) -> None:
    """Batches are checked and rendered on several threads, runs of them at a time: a CRC
    failure megabytes in still comes after every record before it (those of its own run
    too), as one line naming the file and the batch's position."""
    from seglogfs.engine.record.records import compute_crc, iter_batch_headers

    data = tmp_path / "data"
    lines = [b"line-%06d %s\n" % (n, b"x" * pad) for n in range(6_000_000 // pad)]  # batches of up to 1 MB
    run("produce", str(data), "--topic", "t", stdin=b"".join(lines))
    segment = data / "t-0" / "00000000000000000000.log"
    content = bytearray(segment.read_bytes())
    damaged = next(h for h in iter_batch_headers(content) if h.position > 4 << 20)
    content[damaged.position + 100] ^= 0xFF  # a byte of its records: the CRC no longer holds
    segment.write_bytes(bytes(content))
    result = run("consume", str(data), "--topic", "t", "--from-beginning", "--format", fmt, check=False)
    assert result.returncode == 1
    printed = result.stdout.splitlines()
    assert len(printed) == damaged.base_offset
    assert (b"line-%06d" % (damaged.base_offset - 1)) in printed[-1]
    computed = compute_crc(content[damaged.position : damaged.next_position])
    assert result.stderr.decode().splitlines() == [
        f"seglogfs: {segment}: corrupt record batch at position {damaged.position}: "
        f"CRC-32C mismatch (stored {damaged.crc}, computed {computed})"
    ]


@pytest.mark.parametrize("fmt", ["text", "jsonl"])
def test_consume_stops_at_its_message_limit_before_a_damaged_batch(tmp_path: Path, fmt: str) -> None:
    """With `--max-messages`, a damaged batch past the last record printed is never looked at
    (Kafka's consumer checks a batch when it gets to its records): the batches read ahead are
    checked only where they are printed."""
    from seglogfs.engine.record.records import iter_batch_headers

    data = tmp_path / "data"
    for name in ("first", "second"):  # a batch each, of short records (checked ahead without a limit)
        run("produce", str(data), "--topic", "t", stdin=b"".join(b"%s-%d\n" % (name.encode(), n) for n in range(20)))
    segment = data / "t-0" / "00000000000000000000.log"
    content = bytearray(segment.read_bytes())
    second = list(iter_batch_headers(content))[1]
    content[second.position + 70] ^= 0xFF  # a byte of its records: the CRC no longer holds
    segment.write_bytes(bytes(content))
    args = ["consume", str(data), "--topic", "t", "--from-beginning", "--format", fmt]
    limited = run(*args, "--max-messages", "20")
    assert limited.stdout.count(b"first-") == 20 and b"second-" not in limited.stdout
    assert limited.stderr.decode().splitlines() == ["Processed a total of 20 messages"]
    whole = run(*args, check=False)
    assert whole.returncode == 1 and whole.stdout.count(b"first-") == 20
    assert f"{segment}: corrupt record batch at position {second.position}: CRC-32C mismatch" in whole.stderr.decode()


@pytest.mark.parametrize("fmt", ["text", "jsonl"])
def test_a_consume_that_fails_leaves_no_thread_reading(tmp_path: Path, fmt: str, capsysbinary, monkeypatch) -> None:
    """In a process that goes on (an in-process caller of the CLI), a consume that ends in an
    error has stopped its reading threads when it returns; they do not read on from a closed
    data dir until the garbage collector gets to the error's traceback."""
    import gc
    import threading

    from seglogfs.engine.record.records import iter_batch_headers
    from seglogfs.mount_tools import cli

    data = tmp_path / "data"
    lines = b"".join(b"line-%06d %s\n" % (n, b"x" * 200) for n in range(150_000))  # 30 MB: more than is read ahead
    run("produce", str(data), "--topic", "t", stdin=lines)
    segment = data / "t-0" / "00000000000000000000.log"
    whole = segment.read_bytes()
    content = bytearray(whole)
    early = next(h for h in iter_batch_headers(content) if h.next_position > len(content) // 10)
    content[early.position + 70] ^= 0xFF  # a byte of an early batch's records: it fails its CRC
    segment.write_bytes(bytes(content))
    read_end, write_end = os.pipe()
    os.close(read_end)
    closed_pipe = open(write_end, "w")  # noqa: SIM115 (closed at the end)
    gc.disable()  # (the traceback's cycle stays, as it may for a while in a busy process)
    try:
        status = cli.main(["consume", str(data), "--topic", "t", "--from-beginning", "--format", fmt])
        assert status == 1
        left = [t.name for t in threading.enumerate() if t.name == "read-ahead" or t.name.startswith("map-ahead")]
        assert left == []
        assert b"CRC-32C mismatch" in capsysbinary.readouterr().err

        # The reader goes away (`| head`): the write fails, and the threads stop likewise.
        monkeypatch.setattr(sys, "stdout", closed_pipe)
        segment.write_bytes(whole)  # (no damage now: only the pipe fails)
        status = cli.main(["consume", str(data), "--topic", "t", "--from-beginning", "--format", fmt])
        left = [t.name for t in threading.enumerate() if t.name == "read-ahead" or t.name.startswith("map-ahead")]
        assert status == 0 and left == []
    finally:
        gc.enable()
        closed_pipe.close()


def test_consume_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`consume | head -1` on a broker's partition: exit 0, nothing on stderr, as `cat` does (it
    said "corrupt record batch … Broken pipe" and exited 1: the write was inside the decoding's
    error handling)."""
    command = " ".join([*SEGLOGFS, "consume", str(kafka_fixtures() / "flink-on-prem-cp760"), "--topic orders"])
    err = tmp_path / "err.txt"
    done = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {command} --from-beginning 2>{err} | head -1 >/dev/null; echo $?"],
        cwd=REPO,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.stdout.strip() == b"0", done
    assert err.read_text() == ""


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    """A partition of three segments: runs of many small batches and a few large ones, with a
    gzip batch, a transaction's control batch, LogAppendTime-like varied times, null keys and
    values, bytes that are not UTF-8, and records with headers."""
    from seglogfs.engine import PartitionLog
    from seglogfs.engine.config import apply_topic_overrides
    from seglogfs.engine.record.builder import ProducerState, build_batch
    from seglogfs.engine.record.compression import CompressionType

    data = tmp_path / "data"
    data.mkdir()
    base = BrokerConfig.load(log_dirs=[data]).topic_defaults
    config = apply_topic_overrides(base, {"segment.bytes": str(3 << 20)})
    log = PartitionLog.create(data / "t-0", "t", 0, config, topic_id="AAAAAAAAAAAAAAAAAAAAAA", now_ms=NOW_MS)
    try:
        for n in range(400):  # small batches: thousands of records a run
            values = [b'v%d-%d \xff"\\' % (n, i) if i % 7 else None for i in range(1 + n % 50)]
            keys = [b"k%d" % i if i % 3 else None for i in range(len(values))]
            log.append_records(values, keys=keys, timestamps=NOW_MS + n, now_ms=NOW_MS)
        log.append_records([b"z" * 300] * 50, now_ms=NOW_MS, compression=CompressionType.GZIP)
        log.append_records([b"with headers"] * 20, headers=[[("h", b"\x00v")]] * 20, now_ms=NOW_MS)
        producer = ProducerState(5, 0, 0, is_transactional=True)
        log.append_records([b"in a transaction"] * 3, now_ms=NOW_MS, producer=producer)
        marker = build_batch(
            [b"\x00\x00\x00\x00\x00\x00"],
            keys=[b"\x00\x00\x00\x01"],
            timestamps=NOW_MS,
            is_control=True,
            producer=producer,
        )
        log.append_batches(bytes(marker), assign_offsets=True, now_ms=NOW_MS)
        for n in range(60):  # large batches: several a run, across segments; a transaction among them
            log.append_records([b"%d-%d-" % (n, i) + b"x" * 1000 for i in range(120)], timestamps=NOW_MS, now_ms=NOW_MS)
            if n == 30:
                log.append_records([b"in another"], now_ms=NOW_MS, producer=producer)
                log.append_batches(bytes(marker), assign_offsets=True, now_ms=NOW_MS)
        assert len(log.segments) >= 3
        log.flush()
    finally:
        log.close()
    return data


@pytest.mark.parametrize(
    "options",
    [
        ["--format", "jsonl"],
        [],
        ["--property", "print.key=true", "--property", "print.offset=true", "--property", "print.timestamp=true"],
        ["--property", "print.headers=true", "--property", "print.partition=true"],
    ],
)
def test_consume_to_the_log_end_prints_what_a_batch_at_a_time_prints(mixed: Path, options: list[str]) -> None:
    """Without a message limit, every record to the log end is rendered in runs of batches, a
    call of the core a run on several threads; with a limit, a batch at a time. The two print
    the same bytes and count the same records, from the log start, from inside a batch, and
    from a later segment; compressed, control and header-carrying batches included."""
    from seglogfs.mount_tools.consume import _runs

    with DataDir.open(BrokerConfig.load(log_dirs=[mixed]), read_only=True, now_ms=NOW_MS) as data_dir:
        log = data_dir.partition("t", 0)
        total, segment_bases = log.log_end_offset, [s.base_offset for s in log.segments]
        runs = list(_runs(log.batch_headers(0)))
        controls = [header.base_offset for _, header in log.batch_headers(0) if header.is_control]
    assert len(runs) > 5 and max(run.records for run in runs) > 1000  # (several runs; of many batches too)
    assert not all(run.plain for run in runs)  # (the gzip batch's run is rendered batch by batch)
    for start in ["earliest", "1234", str(segment_bases[2] + 5)]:
        args = ["consume", str(mixed), "--topic", "t", "--partition", "0", "--offset", start, *options]
        whole = run(*args)
        limited = run(*args, "--max-messages", str(total))  # (the batch-at-a-time path)
        assert whole.stdout == limited.stdout, start
        assert whole.stderr == limited.stderr
        first = 0 if start == "earliest" else int(start)
        printed = total - first - sum(first <= control for control in controls)  # (control batches print nothing)
        assert whole.stderr.decode().splitlines() == [f"Processed a total of {printed} messages"]


def _damage(segment: Path, which: str) -> None:
    """Damage the second of a segment's batches as `which` says (the CRC made to match but for
    "count"): "count", a record count of billions; "codec", a codec id no codec has; "stray",
    a byte after its first record's header count (a faulty producer's batch of three)."""
    import struct

    from seglogfs.engine.record.records import compute_crc, iter_batch_headers

    content = bytearray(segment.read_bytes())
    second = list(iter_batch_headers(content))[1]
    at = second.position
    if which == "count":
        struct.pack_into(">i", content, at + 57, 0x7F000014)
    elif which == "codec":
        content[at + 22] |= 5
    else:
        length = content[at + 61] >> 1
        content[at + 61] += 2
        content[at + 62 + length : at + 62 + length] = b"\x00"
        struct.pack_into(">i", content, at + 8, second.size_in_bytes + 1 - 12)
    if which != "count":
        end = at + struct.unpack_from(">i", content, at + 8)[0] + 12
        struct.pack_into(">I", content, at + 17, compute_crc(content[at:end]))
    segment.write_bytes(bytes(content))


@pytest.mark.parametrize("fmt", ["text", "jsonl"])
@pytest.mark.parametrize("which", ["count", "codec", "stray"])
def test_consume_to_the_log_end_reports_damage_as_a_batch_at_a_time_does(tmp_path: Path, fmt: str, which: str) -> None:
    """A batch the core refuses in a run is rendered batch by batch: the same lines, the same
    one-line error and exit status as with a message limit (a count of billions made consume
    ask for hundreds of GB and end in an internal error; a codec id no codec has ended it
    before the records before it; stray bytes in a small text batch were printed as records)."""
    data = tmp_path / "data"
    for name, count in (("first", 20), ("second", 3), ("third", 20)):
        run("produce", str(data), "--topic", "t", stdin=b"".join(b"%s-%d\n" % (name.encode(), n) for n in range(count)))
    _damage(data / "t-0" / "00000000000000000000.log", which)
    args = ["consume", str(data), "--topic", "t", "--from-beginning", "--format", fmt]
    whole, limited = run(*args, check=False), run(*args, "--max-messages", "1000", check=False)
    assert (whole.returncode, whole.stdout, whole.stderr) == (limited.returncode, limited.stdout, limited.stderr)
    assert whole.stdout.count(b"first-") == 20
    if which != "stray" or fmt == "text":  # (JSON Lines takes what the columnar decoder takes)
        assert whole.returncode == 1 and b"corrupt record batch at position" in whole.stderr
        assert b"internal error" not in whole.stderr and b"third-" not in whole.stdout


@pytest.mark.parametrize("fmt", ["text", "jsonl"])
def test_consume_prints_the_records_before_a_failing_scan(tmp_path: Path, fmt: str, capsysbinary, monkeypatch) -> None:
    """An error of the scan of batch headers (EIO on the second segment, injected) comes after
    every record before it, those of the run the scan was gathering too, as one line."""
    import errno

    from seglogfs.mount_tools import cli, consume

    data = tmp_path / "data"
    lines = b"".join(b"line-%06d\n" % n for n in range(60_000))
    run("produce", str(data), "--topic", "t", "--override", "log.segment.bytes=300000", stdin=lines)
    runs = consume._runs

    def failing_runs(headers):
        def scan():
            for segment, header in headers:
                if segment.base_offset > 0:
                    raise OSError(errno.EIO, "Input/output error")
                yield segment, header

        return runs(scan())

    monkeypatch.setattr(consume, "_runs", failing_runs)
    status = cli.main(["consume", str(data), "--topic", "t", "--from-beginning", "--format", fmt])
    printed, err = capsysbinary.readouterr()
    first_segment = sorted((data / "t-0").glob("*.log"))[1].name
    assert status == 1 and err.decode().splitlines() == ["seglogfs: Input/output error"]
    assert len(printed.splitlines()) == int(first_segment.removesuffix(".log"))


@pytest.mark.parametrize("fmt", ["text", "jsonl"])
@pytest.mark.parametrize("limit", [[], ["--max-messages", "100000"]], ids=["to-the-end", "limited"])
def test_consume_reports_a_damaged_batch_length_in_a_sealed_segment(tmp_path: Path, fmt: str, limit: list[str]) -> None:
    """A batch length field no batch can have, in a segment that is not the last: the records
    before it, then one line naming the file and position, exit 1 (it printed the records of
    the segments after it, having skipped the rest of its own without a word)."""
    from tests.engine.test_log import damage_batch_length

    data = tmp_path / "data"
    lines = b"".join(b"line-%06d %s\n" % (n, b"x" * 80) for n in range(20_000))
    run("produce", str(data), "--topic", "t", "--override", "log.segment.bytes=300000", stdin=lines)
    segments = sorted((data / "t-0").glob("*.log"))
    assert len(segments) > 3
    position = damage_batch_length(segments[1], 2, 10)
    result = run("consume", str(data), "--topic", "t", "--from-beginning", "--format", fmt, *limit, check=False)
    assert result.returncode == 1
    assert result.stderr.decode().splitlines() == [
        f"seglogfs: {segments[1]}: corrupt record batch at position {position}: a batch is cut short or has an "
        f"impossible length ({segments[1].stat().st_size - position} bytes to the segment's end)"
    ]
    printed = result.stdout.splitlines()
    assert b"line-%06d" % (len(printed) - 1) in printed[-1] and len(printed) > int(segments[1].stem)
