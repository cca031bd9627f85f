"""Mount benchmarks: each figure a ratio to its baseline measured in the same run.

    .venv/bin/python -m bench.fs_bench [--gib 1.0] [--big-gib 10] [--only NAME ...]

    logdir      reading a 1 GiB segment through MNT/.logdir vs reading it directly (dd bs=1M)
    cat         `cat records > /dev/null` vs `seglogfs consume > /dev/null` (same partition): the
                first look (the layout is measured as it goes), later looks, after a remount;
                and `cat records` vs `cat` of the segments through .logdir, in bytes per second
    first-look  `ls -l` of a never-measured partition (both views measured) vs `cat` of its .log
                files, page cache warm and cold; the mount's peak memory meanwhile
    append      `cat file >> MNT/t/0/append` vs the engine's append of the same lines
    follow      append-to-visible latency for a follower reading the view (p50, p90)
    by-offset   open + first byte of by-offset/N on a big partition: the first look ever (every
                segment is measured), the first after a remount (sealed segments' layouts kept
                in the view cache) and later opens (p50)
    partitions  mount time and the mount process's memory with 1,000 partitions
    write-views write latency of one-line appends (p50) with 1 view looked up and with 1,000
                (by-offset/N): the ratio should stay near 1
    printf      `printf 'x\\n' >> MNT/t/0/append` in a shell loop, p50 per line, vs the same loop
                appending to a plain file
    loop-block  the longest the mount's event loop was kept from running during a 1 GiB burst of
                appends while a reader measures a view of the partition (the mount reports it)

Throughput figures are the best of three rounds, the two sides of a ratio interleaved. Results
print as they come and are written to bench/results/fs.json (replacing the figures of the
benches run, keeping the others).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.engine_bench import drop_caches_of
from seglogfs.engine import BrokerConfig, DataDir

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
# The records' time: now, as the mounts' retention (7 days by the real clock) would delete older
# ones at its first check, five minutes into a mount.
NOW_MS = int(time.time() * 1000)
FUSERMOUNT = shutil.which("fusermount3") or "fusermount"
ROUNDS = 3  # throughput figures: best of this many interleaved rounds


class Mounted:
    def __init__(self, data: Path, mountpoint: Path, *options: str) -> None:
        mountpoint.mkdir(parents=True, exist_ok=True)
        self.path = mountpoint
        self.log = mountpoint.parent / f"{mountpoint.name}.log"
        log = open(self.log, "wb")  # noqa: SIM115 (the process holds it)
        started = time.perf_counter()
        cache = f"view.cache={data.parent / (data.name + '-view-cache')}"
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "seglogfs.mount_tools.cli",
                "mount",
                str(data),
                str(mountpoint),
                "-f",
                "-o",
                cache,
                *options,
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        while not os.path.ismount(mountpoint):
            if self.process.poll() is not None:
                raise RuntimeError("mount failed")
            time.sleep(0.005)
        self.mount_seconds = time.perf_counter() - started

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def report(self) -> dict:
        """The mount's request counters and loop stall since its last report (SIGUSR1)."""
        marker = self.log.read_text().count("requests ")
        self.process.send_signal(signal.SIGUSR1)
        while self.log.read_text().count("requests ") == marker:
            time.sleep(0.01)
        return json.loads(self.log.read_text().rsplit("requests ", 1)[1].splitlines()[0])

    def close(self) -> None:
        subprocess.run([FUSERMOUNT, "-u", "-z", str(self.path)], check=False, capture_output=True)
        self.process.wait(timeout=60)

    def __enter__(self) -> Mounted:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def timed(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def run(command: list[str], **kwargs) -> None:
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, **kwargs)


def fill(
    data: Path,
    topic: str,
    total_bytes: int,
    *,
    record_bytes: int = 100,
    segment_bytes: int = 1 << 30,
    batch: int = 2000,
) -> int:
    """Text-like records (`record-<n> xxxx…`) until the partition holds `total_bytes`, `batch`
    records to a record batch."""
    config = BrokerConfig.load(overrides=[f"log.segment.bytes={segment_bytes}"], log_dirs=[data])
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        log = data_dir.partition_for_append(topic, 0, now_ms=NOW_MS)[0]
        pad = b"x" * (record_bytes - 16)
        n = 0
        while log.size_in_bytes() < total_bytes:
            values = [b"record-%08d " % (n + i) + pad for i in range(batch)]
            log.append_records(values, timestamps=NOW_MS + n, now_ms=NOW_MS)
            n += batch
        return log.log_end_offset


def best_of(rounds: int, *works: Callable[[], object]) -> list[float]:
    """The best time of each work over `rounds` rounds, the works interleaved within a round (the
    machine is shared: its speed drifts, and both sides of a ratio should see the same drift)."""
    best = [float("inf")] * len(works)
    for _ in range(rounds):
        for i, work in enumerate(works):
            best[i] = min(best[i], timed(work))
    return best


def bench_logdir(root: Path, total: int) -> dict:
    data = root / "logdir-data"
    fill(data, "t", total, record_bytes=1000)
    segment = next((data / "t-0").glob("*.log"))
    size = segment.stat().st_size
    run(["cat", str(segment)])  # page cache warm for both
    with Mounted(data, root / "logdir-mnt") as m:
        mirrored = m.path / ".logdir" / "t-0" / segment.name
        direct, through = best_of(
            ROUNDS,
            lambda: run(["dd", f"if={segment}", "of=/dev/null", "bs=1M", "status=none"]),
            lambda: run(["dd", f"if={mirrored}", "of=/dev/null", "bs=1M", "status=none"]),
        )
    shutil.rmtree(data)
    return {
        "segment_bytes": size,
        "direct_MB_per_s": size / direct / 1e6,
        "logdir_MB_per_s": size / through / 1e6,
        "ratio": direct / through,
    }


def bench_cat(root: Path, total: int) -> dict:
    data = root / "cat-data"
    records = fill(data, "t", total)
    command = [
        sys.executable,
        "-m",
        "seglogfs.mount_tools.cli",
        "consume",
        str(data),
        "--topic",
        "t",
        "--from-beginning",
    ]

    def consume() -> None:
        run(command, cwd=REPO, stderr=subprocess.DEVNULL)

    with Mounted(data, root / "cat-mnt") as m:
        view = m.path / "t" / "0" / "records"
        first = timed(lambda: run(["cat", str(view)]))  # measures the layout as it goes
        consumed, again = best_of(ROUNDS, consume, lambda: run(["cat", str(view)]))
        mirrored = sorted(str(path) for path in (m.path / ".logdir" / "t-0").glob("*.log"))
        view_bytes = view.stat().st_size
        segment_bytes = sum(os.path.getsize(path) for path in mirrored)
        through_logdir, through_view = best_of(ROUNDS, lambda: run(["cat", *mirrored]), lambda: run(["cat", str(view)]))
    remounted = float("inf")
    for _ in range(ROUNDS):  # a new mount each time: the layouts come from the view cache
        with Mounted(data, root / "cat-mnt") as m:
            remounted = min(remounted, timed(lambda: run(["cat", str(m.path / "t" / "0" / "records")])))
    shutil.rmtree(data)
    return {
        "records": records,
        "consume_seconds": consumed,
        "cat_first_seconds": first,
        "cat_again_seconds": again,
        "cat_remounted_seconds": remounted,
        "ratio_first": consumed / first,
        "ratio_again": consumed / again,
        "ratio_remounted": consumed / remounted,
        # `cat records` against `cat` of the same segments through .logdir (the FUSE ceiling), in
        # bytes per second of each (the view's bytes are its rendering)
        "view_MB_per_s": view_bytes / through_view / 1e6,
        "logdir_MB_per_s": segment_bytes / through_logdir / 1e6,
        "ratio_view_to_logdir": (view_bytes / through_view) / (segment_bytes / through_logdir),
    }


def bench_first_look(root: Path, total: int) -> dict:
    """`ls -l` of a never-measured partition's directory (a stat of each view: both measured)
    vs `cat` of its `.log` files, page cache warm and cold; and the mount's peak memory while it
    measures."""
    data = root / "first-look-data"
    fill(data, "t", total, record_bytes=1024, batch=200)
    logs = sorted(str(path) for path in (data / "t-0").glob("*.log"))
    segment_bytes = sum(os.path.getsize(path) for path in logs)
    out: dict = {"segment_bytes": segment_bytes}
    for cache in ("warm", "cold"):
        cats, looks, peak_rss = [], [], 0.0
        for _ in range(ROUNDS):  # no view cache, no background measure: each mount measures afresh
            if cache == "cold":
                for path in logs:
                    drop_caches_of(Path(path))
            cats.append(timed(lambda: run(["cat", *logs])))
            with Mounted(data, root / "first-look-mnt", "-o", "view.cache=none,measure=lazy") as m:
                if cache == "cold":
                    for path in logs:
                        drop_caches_of(Path(path))
                looks.append(timed(lambda m=m: run(["ls", "-l", str(m.path / "t" / "0")])))
                peak_rss = max(peak_rss, _peak_rss_mb(m.process.pid))
        cat, first = min(cats), min(looks)
        out[cache] = {
            "cat_MB_per_s": segment_bytes / cat / 1e6,
            "first_look_MB_per_s": segment_bytes / first / 1e6,
            "ratio": cat / first,
            "mount_peak_rss_MB": peak_rss,
        }
    shutil.rmtree(data)
    return out


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def bench_append(root: Path, total: int) -> dict:
    lines_file = root / "lines.txt"
    with open(lines_file, "wb") as out:
        written = 0
        n = 0
        while written < total:
            chunk = b"".join(b"line-%09d %s\n" % (n + i, b"y" * 84) for i in range(10000))
            out.write(chunk)
            written += len(chunk)
            n += 10000
    lines = lines_file.read_bytes().split(b"\n")[:-1]

    engine_dirs = iter(range(ROUNDS))

    def engine_append() -> None:  # a new data dir each round
        data = root / f"append-engine-{next(engine_dirs)}"
        with DataDir.open(BrokerConfig.load(log_dirs=[data]), now_ms=NOW_MS) as data_dir:
            log = data_dir.partition_for_append("t", 0, now_ms=NOW_MS)[0]
            for start in range(0, len(lines), 10000):
                log.append_records(lines[start : start + 10000], now_ms=NOW_MS)

    with Mounted(root / "append-data", root / "append-mnt") as m:
        topics = iter(range(ROUNDS))

        def mount_append() -> None:  # a new topic each round: the same work as the engine's
            topic = m.path / f"t{next(topics)}"
            os.mkdir(topic)
            run(["bash", "-c", f"cat {lines_file} >> {topic}/0/append"])

        engine, through = best_of(ROUNDS, engine_append, mount_append)
    for data in root.glob("append-engine-*"):
        shutil.rmtree(data)
    shutil.rmtree(root / "append-data")
    lines_file.unlink()
    return {
        "bytes": written,
        "engine_MB_per_s": written / engine / 1e6,
        "mount_MB_per_s": written / through / 1e6,
        "ratio": engine / through,
    }


def bench_follow(root: Path, samples: int = 200) -> dict:
    with Mounted(root / "follow-data", root / "follow-mnt") as m:
        os.mkdir(m.path / "t")
        append = os.open(m.path / "t" / "0" / "append", os.O_WRONLY | os.O_APPEND)
        reader = os.open(m.path / "t" / "0" / "records", os.O_RDONLY)
        latencies = []
        position = 0
        for i in range(samples):
            line = b"follow-%d\n" % i
            start = time.perf_counter()
            os.write(append, line)
            while True:  # what a follower does: fstat, then read what is new
                size = os.fstat(reader).st_size
                if size > position:
                    data = os.pread(reader, size - position, position)
                    if data.endswith(line):
                        position = size
                        break
            latencies.append((time.perf_counter() - start) * 1000)
            time.sleep(0.005)
        os.close(append)
        os.close(reader)
    latencies.sort()
    return {
        "samples": samples,
        "p50_ms": statistics.median(latencies),
        "p90_ms": latencies[int(samples * 0.9)],
        "max_ms": latencies[-1],
    }


def bench_by_offset(root: Path, big: int, samples: int = 200) -> dict:
    data = root / "big-data"
    # Batches of ~16 KiB, the size a Kafka producer sends by default (batch.size=16384).
    end = fill(data, "t", big, segment_bytes=256 << 20, batch=160)
    rng = random.Random(1)

    def first_byte(m: Mounted, n: int) -> float:
        start = time.perf_counter()
        with open(m.path / "t" / "0" / "by-offset" / str(n), "rb") as handle:
            handle.read(1)
        return (time.perf_counter() - start) * 1000

    with Mounted(data, root / "big-mnt") as m:
        cold = first_byte(m, end // 2)  # every segment is measured
    with Mounted(data, root / "big-mnt") as m:  # a new mount: sealed segments' layouts kept
        remounted = first_byte(m, end // 3)
        warm = sorted(first_byte(m, rng.randrange(end)) for _ in range(samples))
    segments = len(list((data / "t-0").glob("*.log")))
    shutil.rmtree(data)
    return {
        "partition_records": end,
        "partition_bytes": big,
        "segments": segments,
        "first_open_ever_ms": cold,
        "first_open_after_remount_ms": remounted,
        "p50_ms": statistics.median(warm),
        "p90_ms": warm[int(samples * 0.9)],
    }


def bench_write_views(root: Path, samples: int = 300, views: int = 1000) -> dict:
    def p50_write_ms(append: int) -> float:
        latencies = []
        for i in range(samples):
            start = time.perf_counter()
            os.write(append, b"line-%d\n" % i)
            latencies.append((time.perf_counter() - start) * 1000)
        return statistics.median(latencies)

    with Mounted(root / "views-data", root / "views-mnt") as m:
        os.mkdir(m.path / "t")
        append = os.open(m.path / "t" / "0" / "append", os.O_WRONLY | os.O_APPEND)
        os.write(append, b"".join(b"seed-%d\n" % i for i in range(views)))
        (m.path / "t" / "0" / "records").stat()
        one = p50_write_ms(append)
        for n in range(views):  # the kernel now knows 1,000 more views of the partition
            (m.path / "t" / "0" / "by-offset" / str(n)).stat()
        many = p50_write_ms(append)
        os.close(append)
    return {"views": views, "p50_ms_1_view": one, "p50_ms_1000_views": many, "ratio": many / one}


def bench_printf(root: Path, lines: int = 2000) -> dict:
    """`printf 'x\\n' >> append` in a shell loop (each line an open, a write and a close: one
    one-record batch), p50 per line as the shell times it, against the same loop appending to a
    file in the data dir's file system."""
    script = (
        'for ((i = 0; i < $2; i++)); do s=${EPOCHREALTIME/./}; printf "x\\n" >> "$1"; '
        "e=${EPOCHREALTIME/./}; echo $((e - s)); done"
    )

    def p50_us(target: Path) -> float:
        out = subprocess.run(["bash", "-c", script, "-", str(target), str(lines)], check=True, capture_output=True)
        return statistics.median(int(line) for line in out.stdout.split())

    plain_file = root / "printf-plain.txt"
    with Mounted(root / "printf-data", root / "printf-mnt") as m:
        os.mkdir(m.path / "t")
        append = m.path / "t" / "0" / "append"
        plain, mounted = p50_us(plain_file), p50_us(append)
        written = (m.path / "t" / "0" / "records").read_bytes().count(b"\n")
    plain_file.unlink()
    if written != lines:
        raise RuntimeError(f"printf: {written} records after {lines} lines")
    return {"lines": lines, "p50_ms": mounted / 1000, "p50_ms_plain_file": plain / 1000, "ratio": mounted / plain}


def bench_loop_block(root: Path, total: int) -> dict:
    lines = root / "burst.txt"
    with open(lines, "wb") as out:
        line = b"x" * 99 + b"\n"
        chunk = line * 10_000
        for _ in range(total // len(chunk)):
            out.write(chunk)
    with Mounted(root / "burst-data", root / "burst-mnt") as m:
        os.mkdir(m.path / "t")
        view = m.path / "t" / "0" / "records.jsonl"
        m.report()  # the stall count starts now
        writer = subprocess.Popen(["sh", "-c", f"cat {lines} >> {m.path / 't' / '0' / 'append'}"])
        stats = 0
        while writer.poll() is None:  # a reader measuring the growing view meanwhile
            view.stat()
            stats += 1
            time.sleep(0.05)
        report = m.report()
    lines.unlink()
    return {"burst_bytes": total, "stats_meanwhile": stats, "loop_blocked_max_ms": report["loop_blocked_max_ms"]}


def bench_partitions(root: Path, partitions: int = 1000) -> dict:
    data = root / "many-data"
    with DataDir.open(BrokerConfig.load(log_dirs=[data]), now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("many", partitions, now_ms=NOW_MS)
        for p in range(partitions):
            data_dir.partition("many", p).append_records([b"one", b"two"], now_ms=NOW_MS)
    with Mounted(data, root / "many-mnt") as m:
        mount_seconds = m.mount_seconds
        listing = timed(lambda: os.listdir(m.path / "many"))
        rss = m.rss_mb()
    shutil.rmtree(data)
    return {"partitions": partitions, "mount_seconds": mount_seconds, "ls_seconds": listing, "rss_MB": rss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--big-gib", type=float, default=10.0, help="size of the by-offset partition")
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    total = int(args.gib * (1 << 30))
    root = Path(tempfile.mkdtemp(prefix="seglogfs-fsbench-"))
    benches: dict[str, Callable[[], dict]] = {
        "logdir": lambda: bench_logdir(root, total),
        "cat": lambda: bench_cat(root, total),
        "first-look": lambda: bench_first_look(root, total),
        "append": lambda: bench_append(root, total),
        "follow": lambda: bench_follow(root),
        "partitions": lambda: bench_partitions(root),
        "write-views": lambda: bench_write_views(root),
        "printf": lambda: bench_printf(root),
        "loop-block": lambda: bench_loop_block(root, total),
        "by-offset": lambda: bench_by_offset(root, int(args.big_gib * (1 << 30))),
    }
    results = {}
    try:
        for name, bench in benches.items():
            if args.only and name not in args.only:
                continue
            results[name] = bench()
            print(f"{name}: {json.dumps(results[name], indent=1)}", flush=True)
    finally:
        for mountpoint in root.glob("*-mnt"):
            subprocess.run([FUSERMOUNT, "-u", "-z", str(mountpoint)], check=False, capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
    results["peak_rss_of_bench_MB"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    RESULTS.mkdir(exist_ok=True)
    saved = RESULTS / "fs.json"
    kept = json.loads(saved.read_text()) if saved.exists() else {}  # figures of benches not run now
    saved.write_text(json.dumps({**kept, **results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
