"""Engine benchmarks: each figure next to a baseline measured in the same run.

    .venv/bin/python -m bench.engine_bench [--gib 1.0] [--only NAME ...] [--crash-trials N]

Figures (the issue's list): append of 100-byte and of 1 KiB records (records/s, MB/s and the
median ratio to a plain Python buffered write of the same bytes over three rounds, ended by an
fsync and left in the page cache) and of one-record batches (batches/s); offset→position look-ups
on an index of 1.3 M entries (beside Python's bisect over the same offsets); recovery of a segment
with no index files (MB/s as a ratio to reading the file); `seglogfs consume > /dev/null` of a
partition of 1 KiB and of 100-byte records, as text and as JSON Lines (segment MB/s as a ratio to
`cat` of its `.log` files);
opening a data dir of 10,000 segments after a clean and an unclean stop; compaction of a
partition of 1 M keys × 10 versions (MB/s as a ratio to reading the same partition, record by
record through the engine and as raw bytes, and the peak memory of the compacting process
against log.cleaner.dedupe.buffer.size); optionally more SIGKILL crash trials than CI runs.
Results print as a table and are written to bench/results/engine.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from seglogfs.engine import BrokerConfig, DataDir, PartitionLog
from seglogfs.engine.log.loader import segment_for
from seglogfs.engine.log.offset_index import OffsetIndex

NOW_MS = 1_763_800_000_000
RESULTS = Path(__file__).resolve().parent / "results"


def timed(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def drop_caches_of(path: Path) -> None:
    """Evict a file from the page cache (so a cold read is measured cold)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def new_log(root: Path, **overrides: str) -> PartitionLog:
    root.mkdir(parents=True, exist_ok=True)
    config = BrokerConfig.load(overrides=[f"{k}={v}" for k, v in overrides.items()], log_dirs=[root]).topic_defaults
    return PartitionLog.create(root / "bench-0", "bench", 0, config, topic_id="AAAAAAAAAAAAAAAAAAAAAA", now_ms=NOW_MS)


def bench_append(root: Path, total_bytes: int, rounds: int = 3) -> dict:
    """Append of 100-byte and 1 KiB records through the engine against a plain buffered Python
    write of the same bytes, each `rounds` times in turn (A B A B ...), the median of the pair
    ratios: once ending with an fsync on both sides (the disk's speed, which varies from run to
    run, dominates), and once left in the page cache on both sides, the work of each (in one
    segment: a roll flushes the segment before it, an fsync)."""
    out = {}
    for record_bytes, batch_records in ((100, 10_000), (1024, 1000)):
        count = total_bytes // record_bytes
        values = [os.urandom(record_bytes)] * batch_records
        batches = count // batch_records
        payload = b"".join(values)
        for synced in (True, False):
            engine_s, plain_s, written = [], [], 0
            for n in range(rounds):
                log = new_log(
                    root / f"append{record_bytes}-{n}", **({} if synced else {"log.segment.bytes": str(2**31 - 1)})
                )

                def append(
                    log: PartitionLog = log, values: list[bytes] = values, batches: int = batches, synced: bool = synced
                ) -> None:
                    for _ in range(batches):
                        log.append_records(values, now_ms=NOW_MS)
                    if synced:
                        log.flush()

                engine_s.append(timed(append))
                written = log.size_in_bytes()
                log.close()
                shutil.rmtree(root / f"append{record_bytes}-{n}")
                baseline_path = root / f"baseline{record_bytes}.bin"

                def baseline(
                    baseline_path: Path = baseline_path,
                    payload: bytes = payload,
                    batches: int = batches,
                    synced: bool = synced,
                ) -> None:
                    with open(baseline_path, "wb") as handle:
                        for _ in range(batches):
                            handle.write(payload)
                        handle.flush()
                        if synced:
                            os.fsync(handle.fileno())

                plain_s.append(timed(baseline))
                baseline_path.unlink()
            ratios = sorted(
                (written / e) / (batches * len(payload) / p) for e, p in zip(engine_s, plain_s, strict=True)
            )
            out[f"append_{record_bytes}B{'_fsynced' if synced else '_page_cache'}"] = {
                "records": batches * batch_records,
                "records_per_s": batches * batch_records / statistics.median(engine_s),
                "MB_per_s": written / statistics.median(engine_s) / 1e6,
                "baseline_MB_per_s": batches * len(payload) / statistics.median(plain_s) / 1e6,
                "ratio_to_buffered_write": statistics.median(ratios),
                "ratio_range": [ratios[0], ratios[-1]],
            }
    # One-record batches (each `echo >> append` through the mount is one): a call per record.
    log = new_log(root / "append-single")
    value, count = os.urandom(100), 200_000
    seconds = timed(lambda: [log.append_records([value], now_ms=NOW_MS) for _ in range(count)])
    log.close()
    out["one_record_batches"] = {"batches": count, "batches_per_s": count / seconds}
    shutil.rmtree(root / "append-single")
    return out


def bench_lookups(root: Path) -> dict:
    entries = 1_300_000
    index = OffsetIndex(root / "00000000000000000000.index", 0, entries * 8, writable=True)
    relative = np.arange(entries, dtype=np.int64) * 3 + 1
    raw = np.empty(entries, dtype=[("relative_offset", ">i4"), ("position", ">i4")])
    raw["relative_offset"] = relative
    raw["position"] = np.arange(entries) * 4100
    with index._lock:  # bulk fill, as append() writes an entry: pwrite to the file, which the mapping sees
        index._write_locked(0, raw.tobytes())
        index._entries = entries
    rng = np.random.default_rng(1)
    singles = rng.integers(0, entries * 3, size=100_000).tolist()
    single_s = timed(lambda: [index.lookup(t) for t in singles])
    # Baseline: plain Python bisect over a list of the same offsets.
    import bisect

    keys = relative.tolist()
    bisect_s = timed(lambda: [bisect.bisect_right(keys, t) for t in singles])
    index.close()
    return {
        "index_entries": entries,
        "single_lookups_per_s": len(singles) / single_s,
        "baseline_python_bisect_per_s": len(singles) / bisect_s,
    }


def fill_partition(root: Path, total_bytes: int, record_bytes: int) -> PartitionLog:
    log = new_log(root)
    rng = np.random.default_rng(2)
    batch_records = max(1, (256 * 1024) // record_bytes)
    values = [bytes(rng.integers(32, 127, record_bytes, dtype=np.uint8)) for _ in range(batch_records)]
    while log.size_in_bytes() < total_bytes:
        log.append_records(values, now_ms=NOW_MS, timestamps=NOW_MS + log.log_end_offset // batch_records)
    log.flush()
    return log


def bench_recovery(root: Path, total_bytes: int) -> dict:
    log = fill_partition(root / "recover", total_bytes, 1024)
    segment = log.segments[0]
    log.close()
    for path in (segment.offset_index_path, segment.time_index_path):
        path.unlink()
    path = segment.log_path
    size = path.stat().st_size

    def read_file() -> None:
        with open(path, "rb") as handle:
            while handle.read(8 << 20):
                pass

    drop_caches_of(path)
    read_cold = timed(read_file)
    read_warm = timed(read_file)
    config = BrokerConfig.load(log_dirs=[root / "recover"]).topic_defaults

    def recover() -> None:
        recovered = segment_for(path.parent, segment.base_offset, config, writable=True, now_ms=NOW_MS)
        recovered.recover()
        recovered.close()

    recover_warm = timed(recover)
    for index_path in (segment.offset_index_path, segment.time_index_path):
        index_path.unlink()
    drop_caches_of(path)
    recover_cold = timed(recover)
    shutil.rmtree(root / "recover")
    return {
        "segment_bytes": size,
        "recover_MB_per_s_warm": size / recover_warm / 1e6,
        "read_MB_per_s_warm": size / read_warm / 1e6,
        "ratio_warm": read_warm / recover_warm,
        "recover_MB_per_s_cold": size / recover_cold / 1e6,
        "read_MB_per_s_cold": size / read_cold / 1e6,
        "ratio_cold": read_cold / recover_cold,
    }


def bench_consume(root: Path, total_bytes: int) -> dict:
    """`seglogfs consume --from-beginning > /dev/null` of one partition, as text and as JSON Lines,
    of 1 KiB and of 100-byte records: segment bytes per second as a ratio to `cat` of its `.log`
    files (page cache warm), each the best of three."""
    out: dict = {}
    seglogfs = str(Path(sys.executable).with_name("seglogfs"))
    for record_bytes in (1024, 100):
        where = root / f"consume{record_bytes}"
        log = fill_partition(where, total_bytes, record_bytes)
        records, size = log.log_end_offset, log.size_in_bytes()
        log.close()
        files = [str(p) for p in sorted((where / "bench-0").glob("*.log"))]

        def run(command: list[str]) -> float:
            return min(
                timed(lambda: subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True))
                for _ in range(3)
            )

        cat_s = run(["cat", *files])
        figures = {"records": records, "partition_bytes": size, "cat_MB_per_s": size / cat_s / 1e6}
        for name, extra in (("text", []), ("jsonl", ["--format", "jsonl"])):
            consume = [seglogfs, "consume", str(where), "--topic", "bench", "--partition", "0", "--from-beginning"]
            seconds = run([*consume, *extra])
            figures[f"{name}_records_per_s"] = records / seconds
            figures[f"{name}_MB_per_s"] = size / seconds / 1e6
            figures[f"{name}_ratio_to_cat"] = cat_s / seconds
        out[f"{record_bytes}B"] = figures
        shutil.rmtree(where)
    return out


def bench_open(root: Path, segments: int = 10_000) -> dict:
    log_dir = root / "open"
    config = BrokerConfig.load(overrides=["log.segment.bytes=1000", "num.partitions=1"], log_dirs=[log_dir])
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        log = data_dir.partition_for_append("many", 0, now_ms=NOW_MS)[0]
        value = b"v" * 400
        while len(log.segments) < segments:
            log.append_records([value, value], now_ms=NOW_MS)
    count = len(list((log_dir / "many-0").glob("*.log")))
    clean = timed(lambda: DataDir.open(config, read_only=False, now_ms=NOW_MS).close())
    # A retention pass when nothing has expired (records stamped NOW_MS, 7-day retention).
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        retention_pass = timed(lambda: data_dir.clean(NOW_MS + 1000))
        assert len(data_dir.partition("many", 0).segments) == count
    # An unclean stop: no clean-shutdown marker, recovery point at the start of the last segment.
    (log_dir / ".kafka_cleanshutdown").unlink()
    unclean = timed(lambda: DataDir.open(config, now_ms=NOW_MS).close())
    (log_dir / ".kafka_cleanshutdown").unlink()
    (log_dir / "recovery-point-offset-checkpoint").unlink()
    from_zero = timed(lambda: DataDir.open(config, now_ms=NOW_MS).close())
    shutil.rmtree(log_dir)
    return {
        "segments": count,
        "open_after_clean_stop_s": clean,
        "retention_pass_nothing_expired_s": retention_pass,
        "open_after_unclean_stop_s": unclean,
        "open_unclean_without_recovery_checkpoint_s": from_zero,
    }


_COMPACT_CHILD = """
import json, resource, sys, time
from pathlib import Path
from seglogfs.engine import BrokerConfig, DataDir
root, now, buffer = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
config = BrokerConfig.load(overrides=[f"log.cleaner.dedupe.buffer.size={buffer}"], log_dirs=[root])
with DataDir.open(config, now_ms=now) as data_dir:
    if sys.argv[4] == "compact":
        start = time.perf_counter()
        report = data_dir.compact(now)
        seconds = time.perf_counter() - start
        stats = report.compaction[0].stats
        result = {"seconds": seconds, "bytes_read": stats.bytes_read, "bytes_written": stats.bytes_written,
                  "records_read": stats.records_read, "records_written": stats.records_written}
    else:
        log = data_dir.partition("compacted", 0)
        start = time.perf_counter()
        count = sum(1 for _ in log.records(0, log.active_segment.base_offset))
        result = {"seconds": time.perf_counter() - start, "records": count}
result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps(result))
"""


def bench_compaction(root: Path, keys: int = 1_000_000, versions: int = 10, value_bytes: int = 80) -> dict:
    """A compacted partition of `keys` keys × `versions` versions (about 1 GiB at the defaults),
    compacted in a fresh process with the default 128 MiB dedupe buffer."""
    directory = root / "compaction"
    config = BrokerConfig.load(overrides=["log.segment.bytes=134217728"], log_dirs=[directory])
    batch = 1000
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("compacted", 1, {"cleanup.policy": "compact"}, now_ms=NOW_MS)
        log = data_dir.partition("compacted", 0)
        pad = b"v" * (value_bytes - 16)
        for version in range(versions):
            for first in range(0, keys, batch):
                key_list = [b"key-%08d" % k for k in range(first, min(first + batch, keys))]
                values = [b"%02d-%013d" % (version, k) + pad for k in range(first, first + len(key_list))]
                log.append_records(values, keys=key_list, now_ms=NOW_MS)
        log.roll(NOW_MS)
        size = log.size_in_bytes()
    buffer = 128 * 1024 * 1024

    def child(mode: str) -> dict:
        done = subprocess.run(
            [sys.executable, "-c", _COMPACT_CHILD, str(directory), str(NOW_MS), str(buffer), mode],
            cwd=Path(__file__).resolve().parent.parent,
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(done.stdout)

    files = [str(p) for p in sorted((directory / "compacted-0").glob("*.log"))]
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
    cat_s = timed(lambda: subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True))
    read = child("read")
    compacted = child("compact")
    compact_mb_s = compacted["bytes_read"] / compacted["seconds"] / 1e6
    read_mb_s = size / read["seconds"] / 1e6
    shutil.rmtree(directory)
    return {
        "partition_bytes": size,
        "records": keys * versions,
        "records_kept": compacted["records_written"],
        "bytes_kept": compacted["bytes_written"],
        "compact_seconds": compacted["seconds"],
        "compact_MB_per_s": compact_mb_s,
        "engine_read_MB_per_s": read_mb_s,
        "ratio_to_engine_read": compact_mb_s / read_mb_s,
        "cat_MB_per_s": size / cat_s / 1e6,
        "ratio_to_cat": compact_mb_s / (size / cat_s / 1e6),
        "dedupe_buffer_bytes": buffer,
        "compact_peak_rss_MB": compacted["peak_rss_bytes"] / 1e6,
        "read_peak_rss_MB": read["peak_rss_bytes"] / 1e6,
        "peak_over_buffer_MB": (compacted["peak_rss_bytes"] - buffer) / 1e6,
    }


def bench_crash(trials: int) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "tests/cli/test_crash.py", "-p", "no:cacheprovider"],
        env={**os.environ, "SEGLOGFS_CRASH_TRIALS": str(trials)},
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    return {"trials": trials, "result": result.stdout.strip().splitlines()[-1], "exit": result.returncode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0, help="size of the append/recovery/consume data")
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--crash-trials", type=int, default=0, help="also run this many SIGKILL trials")
    parser.add_argument("--dir", type=Path, default=None, help="scratch dir (default: a temp dir)")
    args = parser.parse_args()
    total = int(args.gib * (1 << 30))
    root = Path(tempfile.mkdtemp(prefix="seglogfs-bench-", dir=args.dir))
    benches: dict[str, Callable[[], dict]] = {
        "append": lambda: bench_append(root, total),
        "lookups": lambda: bench_lookups(root),
        "recovery": lambda: bench_recovery(root, total),
        "consume": lambda: bench_consume(root, total),
        "open": lambda: bench_open(root),
        "compaction": lambda: bench_compaction(root),
    }
    if args.crash_trials:
        benches["crash"] = lambda: bench_crash(args.crash_trials)
    results = {}
    try:
        for name, run in benches.items():
            if args.only and name not in args.only:
                continue
            results[name] = run()
            print(f"{name}: {json.dumps(results[name], indent=1)}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    saved = RESULTS / "engine.json"
    kept = json.loads(saved.read_text()) if saved.exists() else {}  # figures of benches not run now
    saved.write_text(json.dumps({**kept, **results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
