"""`seglogfs dump` and Kafka's own kafka-dump-log, byte for byte.

On every file of the broker fixtures and of a copy of the live broker's log dir, taken while it
runs, for each flag both tools have: each file's output is compared whole, and the reports printed
after the last file (on standard error, in the order of a Java HashMap) as a multiset. The biggest
segments (a few MB each) are dumped with the flags that read their records, and their indexes
are left out: Kafka checks a time index by reading its segment once per entry, minutes for them.
seglogfs follows the newest Kafka; each other version tested is run on the same files with the
same flags, and what it prints differently is listed here (`VERSION_DIFFERENCES`), and checked
to still be so."""

from __future__ import annotations

import hashlib
import random
import re
import shutil
import subprocess
import uuid
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from seglogfs.engine.record.builder import build_batch
from tests.cli.support import SEGLOGFS
from tests.cli.test_dump_parity import write_snapshot
from tests.conftest import NOW_MS, REPO, kafka_fixtures
from tests.interop.conftest import AFTER_FILES, NEWEST, STDERR, TRAILER, Broker, Kafka, Producers, split_dump

SUFFIXES = (".log", ".index", ".timeindex", ".snapshot", ".txnindex", ".checkpoint")
BIGGEST_SEGMENT = 200_000  # bytes: whose indexes are left out, and dumped only with the record flags

# What Kafka 4's kafka-dump-log prints that seglogfs does not, on purpose.
KNOWN = {
    # Kafka 4's DumpLogSegments starts each file's run of offsets at -1 (3.9's did not): a
    # segment whose first record is not offset 0 is reported "non-consecutive", wrongly.
    # (The "-1 is followed by" line is taken out, and its heading with it where no other line
    # follows: a compacted segment has gaps of its own.)
    "kafka-4-first-offset": re.compile(
        r"^  -1 is followed by \d+\n|^Non-consecutive offsets in \S+\n(?=  -1 is followed by \d+\n(?!  ))",
        re.MULTILINE,
    ),
}

# Where Kafka 3.9.2 prints otherwise than 4.4.0 (seglogfs prints as 4.4.0 does): each a pattern
# of the older's output, one of the newest's, what both are taken to before they are compared, and
# the flag without which there is no such difference (or None). The test fails when one is no
# longer met in what the older prints.
VERSION_DIFFERENCES = {
    # A legacy (magic 0/1) record's line: 3.9 ends its metadata with a stray "}".
    "legacy-record-brace": (
        re.compile(r"^(\| offset: .* isValid: true crc: \d+)\}", re.MULTILINE),
        re.compile(r"^(\| offset: .* isValid: true crc: \d+)", re.MULTILINE),
        r"\1",
        None,
    ),
    # A KRaft control record (LeaderChange, snapshot header and footer, voters): 3.9 names its
    # type; 4.4 decodes it.
    "kraft-control-record": (
        re.compile(r"controlType: \w+\(\d+\)$", re.MULTILINE),
        re.compile(r"(LeaderChange|SnapshotHeader|SnapshotFooter|KRaftVersion|KRaftVoters): \{.*\}$", re.MULTILINE),
        "(a KRaft control record)",
        None,
    ),
    # --skip-record-metadata: a record without a key is " payload: ..." in 3.9, "| payload: ..." in
    # 4.4 (a key's line is "| key: ..." in both; a line a key's newline began is " payload: ...").
    "payload-line-start": (
        re.compile(r"^ payload: ", re.MULTILINE),
        re.compile(r"^\| payload: ", re.MULTILINE),
        " payload: ",
        "--skip-record-metadata",
    ),
    # --transaction-log-decoder: 3.9 prints a transaction log record as text of its own
    # ("transaction_metadata::transactionalId=..." and "producerId:...,state=Ongoing,..."), 4.4 as
    # JSON of the record's key and value (the value's status named as 4.4 names it).
    "transaction-log-text": (
        re.compile(r"key: transaction_metadata::transactionalId=.*$", re.MULTILINE),
        re.compile(r'key: \{"type":"0","data":\{"transactionalId":.*$', re.MULTILINE),
        "key: (a transaction log record)",
        "--transaction-log-decoder",
    ),
    # The gaps of a segment's offsets (compaction's): 3.9 lists them last first, 4.4 in order
    # (met where a segment has two gaps or more: the made-up "gapped" one has).
    "gaps-last-first": (
        re.compile(r"^Non-consecutive offsets in \S+\n(?:  \d+ is followed by \d+\n){2,}", re.MULTILINE),
        re.compile(r"^Non-consecutive offsets in \S+\n(?:  \d+ is followed by \d+\n){2,}", re.MULTILINE),
        lambda block: "".join(_in_offset_order(block.group(0).splitlines(keepends=True))),
        None,
    ),
    # A producer snapshot's entry without a batch (a transactional producer's whose batches were
    # all removed): 3.9 ends its line with a space.
    "snapshot-entry-space": (
        re.compile(r"^(producerId: .* lastTimestamp: -?\d+) $", re.MULTILINE),
        re.compile(r"^(producerId: .* lastTimestamp: -?\d+)$", re.MULTILINE),
        r"\1",
        None,
    ),
    # A time index entry whose offset is not a batch's last: 3.9's report does not name the file.
    "unnamed-index-report": (
        re.compile(r"^The following indexed offsets are not found in the log\.$", re.MULTILINE),
        re.compile(r"^The following indexed offsets are not found in :\S+$", re.MULTILINE),
        "The following indexed offsets are not found in (a time index)",
        None,
    ),
}


def _in_offset_order(lines: list[str]) -> list[str]:
    """A "Non-consecutive offsets" report, its heading, then its gaps by offset."""
    return [lines[0], *sorted(lines[1:], key=lambda line: int(line.split()[0]))]


def without_version_differences(
    parts: dict[Path, str], flags: Sequence[str], older: bool, seen: set[str]
) -> dict[Path, str]:
    """Output of the older Kafka (or of the newest, or seglogfs) with each listed difference
    taken to the text both are compared in; the differences met in the older's are named in `seen`."""
    taken = {}
    for path, text in parts.items():
        for name, (old, new, common, flag) in VERSION_DIFFERENCES.items():
            if flag is not None and flag not in flags:
                continue
            text, count = (old if older else new).subn(common, text)
            if count and older:
                seen.add(name)
        taken[path] = text
    return taken


def big(path: Path) -> bool:
    return path.suffix == ".log" and path.stat().st_size > BIGGEST_SEGMENT


def files_of(root: Path) -> list[Path]:
    """Every file both tools dump under `root`, but the indexes of its biggest segments."""
    files = []
    for path in sorted(root.rglob("*")):
        if not (path.is_file() and path.name.endswith(SUFFIXES) and path.name[0].isdigit()):
            continue
        segment = path.with_name(path.name.split(".")[0] + ".log")
        if path.suffix in (".index", ".timeindex") and segment.exists() and big(segment):
            continue
        files.append(path.resolve())
    return files


# Keys and values that are not UTF-8: each tool prints them with its decoder's replacements.
MALFORMED = [
    b"\xed\xba\x69",  # a surrogate's lead and second byte, then ASCII
    b"\xed\xa0\x80",  # an encoded surrogate, whole
    b"\xe0\x80\x80",  # overlong
    b"\xf0\x80\x80\x80",
    b"\xf4\x90\x80\x80",  # past U+10FFFF
    b"\xf5\x80\x80\x80",
    b"\xc0\xaf",
    b"\xe2\x82",  # cut at the end
    b"\xf0\x9f\x98",
    b"\xf0\x9f",
    b"\xf0",
    b"\xe2\x28\xa1",
    b"\xf0\x28\x8c\x28",
    b"\xf0\x90\x28\xbc",
    b"a\x80b\xbfc\xfe\xff",
    "naïve ✓ 😀".encode(),
]


def malformed_text(data: Path) -> Path:
    """A segment whose keys and values are malformed UTF-8 (the list, then random bytes), one
    with gaps in its offsets, and a producer snapshot of an entry without a batch."""
    rng = random.Random(31)
    values = [*MALFORMED, *(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 12))) for _ in range(400))]
    partition = data / "malformed-0"
    partition.mkdir(parents=True)
    batch = build_batch(values, keys=[v[::-1] for v in values], timestamps=NOW_MS)
    (partition / "00000000000000000000.log").write_bytes(batch)
    # And a segment with gaps between its batches' offsets, as compaction leaves them.
    gapped = data / "gapped-0"
    gapped.mkdir()
    batches = [
        build_batch([b"kept-%d" % base], keys=[b"k%d" % base], timestamps=NOW_MS, base_offset=base)
        for base in (0, 1, 5, 9, 10, 30)
    ]
    (gapped / "00000000000000000000.log").write_bytes(b"".join(batches))
    # And a producer snapshot whose entry has no batch left (a transactional producer's whose
    # batches were all removed): the broker's own dir has one only when its retention was that
    # quick.
    write_snapshot(gapped / "00000000000000000031.snapshot", (4, 0, -1, -1, 0, NOW_MS, 2, -1))
    return data


def copy_live(log_dir: Path, copy: Path) -> Path:
    """A copy of a running broker's log dir: its cleaner renames and deletes files meanwhile,
    and a file gone by the time it is copied is left out (both tools read the same copy)."""
    for path in sorted(log_dir.rglob("*")):
        target = copy / path.relative_to(log_dir)
        try:
            if path.is_dir():
                target.mkdir(parents=True, exist_ok=True)
            elif path.name.endswith(SUFFIXES):
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
        except FileNotFoundError:
            continue
    for index in [*copy.glob("*/*.index"), *copy.glob("*/*.timeindex")]:
        if not index.with_suffix(".log").exists():  # (Kafka's dump of an index reads its segment)
            index.unlink()
    return copy


def seglogfs_dump(files: Sequence[Path], flags: Sequence[str]) -> dict[Path, str]:
    done = subprocess.run(
        [SEGLOGFS, "dump", *flags, "--files", ",".join(map(str, files))],
        capture_output=True,
        cwd=REPO,
        timeout=300,
        check=False,
    )
    result = subprocess.CompletedProcess(
        done.args,
        done.returncode,
        done.stdout.decode(errors="surrogateescape"),
        done.stderr.decode(errors="surrogateescape"),
    )
    return split_dump(result.stdout, files, f"seglogfs dump {' '.join(flags)}", result)


def reports(parts: dict[Path, str], known: set[str] | None = None) -> Counter[str]:
    """The reports printed after the files (stdout and stderr), one per heading, as a multiset;
    the KNOWN ones taken out (and named in `known`)."""
    text = parts[AFTER_FILES] + "".join(
        line + "\n"
        for line in parts[STDERR].splitlines()
        if not line.startswith("[")  # (a logged WARN)
    )
    for name, pattern in KNOWN.items():
        text, count = pattern.subn("", text)
        if count and known is not None:
            known.add(name)
    starts = [m.start() for m in TRAILER.finditer(text)]
    leftover = text[: starts[0]] if starts else text
    blocks = [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=False)]
    return Counter(blocks + ([leftover] if leftover else []))


def differences(kafka: dict[Path, str], ours: dict[Path, str], known: set[str]) -> list[str]:
    found = []
    for path, expected in kafka.items():
        if path in (AFTER_FILES, STDERR):
            continue
        mine = ours.get(path, "")
        if mine != expected:
            pairs = zip(expected.splitlines(), mine.splitlines(), strict=False)
            first = next(((k, o) for k, o in pairs if k != o), (f"{len(expected)} chars", f"{len(mine)} chars"))
            found.append(f"{path}:\n  kafka:    {first[0][:300]!r}\n  seglogfs: {first[1][:300]!r}")
    theirs, mine = reports(kafka, known), reports(ours)
    if theirs != mine:
        found.append(f"reports after the files: only Kafka's {theirs - mine}, only seglogfs's {mine - theirs}")
    return found


def active(path: Path) -> bool:
    """Whether `path` belongs to its partition's newest segment."""
    return path.name.split(".")[0] == max(p.name.split(".")[0] for p in path.parent.glob("*.log"))


def flag_sets(files: Sequence[Path]) -> list[tuple[list[str], list[Path]]]:
    """Each flag set both tools have, with the files it applies to."""
    logs = [f for f in files if f.suffix in (".log", ".checkpoint")]
    metadata = [f for f in logs if "__cluster_metadata" in str(f)]
    offsets = [f for f in logs if "__consumer_offsets" in str(f)]
    transactions = [f for f in logs if "__transaction_state" in str(f)]
    indexes = [f for f in files if f.suffix in (".index", ".timeindex")]
    small = [f for f in logs if not big(f)]
    sets = [
        ([], list(files)),
        (["--deep-iteration"], small),
        (["--print-data-log"], [f for f in logs if f not in metadata]),
        (["--print-data-log", "--skip-record-metadata"], small),
        (["--deep-iteration", "--max-bytes", "3000"], logs),
        (["--verify-index-only"], indexes),
        # (Not a live broker's active time index: preallocated, its zero tail is a last entry
        # to Kafka, whose check then throws and ends the run; seglogfs checks the entries in use.)
        (["--index-sanity-check"], [f for f in indexes if not (f.suffix == ".timeindex" and active(f))]),
        (["--cluster-metadata-decoder"], metadata),
        (["--offsets-decoder"], offsets),
    ]
    if transactions:
        sets.append((["--transaction-log-decoder"], transactions))
    return [(flags, chosen) for flags, chosen in sets if chosen]


def test_dump_prints_what_kafkas_dump_log_prints(
    kafka: dict[str, Kafka], kafka_broker: Broker, producer_classes: Path, tmp_path: Path
) -> None:
    broker = kafka_broker
    broker.create_topic("dumped", internal_segment_bytes="4096", cleanup_policy="compact")
    produced = broker.kafka.run(
        "console-producer",
        "--bootstrap-server",
        broker.bootstrap,
        "--topic",
        "dumped",
        "--compression-codec",
        "lz4",
        "--command-property",
        "batch.size=2048",  # (a batch over the topic's segment size is refused)
        "--reader-property",
        "parse.key=true",
        "--reader-property",
        "key.separator=:",
        stdin="".join(f"k{i % 13}:dumped-{i}-{hashlib.sha256(b'%d' % i).hexdigest()}\n" for i in range(500)).encode(),
    )
    assert "] ERROR " not in produced.stderr, produced.stderr[-3000:]
    # Transactions, committed and aborted, over small segments: `.txnindex` files.
    broker.create_topic("dumped-txn", internal_segment_bytes="1024")
    producers = Producers(broker, producer_classes, f"dumped-{uuid.uuid4().hex}", tmp_path / "producers.err")
    try:
        for round_ in range(6):
            producers.line("begin")
            for i in range(5):
                producers.send("txn", "dumped-txn", f"k{i}", f"round-{round_}-{i}", "round:" + str(round_))
            producers.send("idem", "dumped-txn", "<null>", f"between-{round_}", "")
            producers.sync()  # (an abort fails the records not yet sent)
            producers.line("commit" if round_ % 2 else "abort")
        producers.sync()
    finally:
        producers.close()
    live = copy_live(broker.log_dir, tmp_path / "live")
    files = files_of(kafka_fixtures()) + files_of(live) + files_of(malformed_text(tmp_path / "made"))
    assert len(files) > 200
    assert len(list(live.glob("dumped-0/*.log"))) > 1, "the broker rolled no segment of the topic"
    assert list(live.glob("dumped-txn-0/*.txnindex")), "the aborted transactions left no transaction index"
    runs = flag_sets(files)
    older = [version for version in kafka if version != NEWEST]
    # Two at a time: each a JVM or a Python process, most of it start-up and output.
    with ThreadPoolExecutor(max_workers=2) as pool:
        ours_pending = pool.map(lambda run: seglogfs_dump(run[1], run[0]), runs)
        theirs_pending = {
            version: pool.map(lambda run, k=kafka[version]: k.dump_log(run[1], *run[0]), runs)
            for version in (NEWEST, *older)
        }
        ours = list(ours_pending)
        theirs = {version: list(pending) for version, pending in theirs_pending.items()}
    known: set[str] = set()
    found = []
    for (flags, _), kafka_parts, our_parts in zip(runs, theirs[NEWEST], ours, strict=True):
        found += [f"{' '.join(flags) or '(no flag)'}: {d}" for d in differences(kafka_parts, our_parts, known)]
    assert not found, f"seglogfs dump differs from Kafka {NEWEST}'s kafka-dump-log:\n" + "\n".join(found[:30])
    assert known == set(KNOWN), f"Kafka no longer prints {set(KNOWN) - known}: take it out of KNOWN"
    # Each older Kafka: as the newest prints, but for the listed differences.
    for version in older:
        seen: set[str] = set()
        found = []
        for (flags, _), kafka_parts, our_parts in zip(runs, theirs[version], ours, strict=True):
            if "--cluster-metadata-decoder" in flags:
                # The live broker's metadata log has record versions newer than this Kafka
                # knows: it says it cannot decode them, and seglogfs decodes them as the newest.
                newer = [
                    path
                    for path, text in kafka_parts.items()
                    if live.resolve() in path.parents and "Failed to deserialize record" in text
                ]
                assert newer, f"Kafka {version} now decodes every record of Kafka {NEWEST}'s metadata log"
                kafka_parts = {path: text for path, text in kafka_parts.items() if path not in newer}
            theirs_taken = without_version_differences(kafka_parts, flags, True, seen)
            ours_taken = without_version_differences(our_parts, flags, False, seen)
            found += [f"{' '.join(flags) or '(no flag)'}: {d}" for d in differences(theirs_taken, ours_taken, set())]
        assert not found, f"Kafka {version} differs from {NEWEST} otherwise than listed:\n" + "\n".join(found[:30])
        assert seen == set(VERSION_DIFFERENCES), f"Kafka {version} no longer prints {set(VERSION_DIFFERENCES) - seen}"
