"""Spark benchmarks for `format("seglog")`, each figure next to a baseline measured in the same run.

    .venv/bin/python -m bench.spark_bench [--records 10000000] [--value-bytes 100] [--rounds 2] [--only read]
        [--conf KEY=VALUE ...]

On a local[2] SparkSession:

* read: every record of a two-partition topic (keys of 12 bytes, values of `--value-bytes`),
  consumed by Spark's `noop` sink, in rows/s and as a ratio to Spark reading the same rows
  (the same columns) from Parquet;
* write: the same rows (key, value) written with `df.write.format("seglog")` into a new data dir
  (Kafka's partitioner, staged by the tasks, appended at commit) in rows/s, as a ratio to writing
  them to Parquet;
* filter: `timestamp >= X` selecting the last 1% of the records (pushed down: the time index),
  its time as a ratio of the full read's time (and the same query unpushed, for comparison).
  Any Spark query costs a floor of its own (planning, a Python worker, a task, the job's end),
  measured in the same run twice: `spark.range(1)` into the same sink, and a `seglog` read of a
  one-record topic. The net ratio takes the latter out of both times: what the source does for
  the 1% against what it does for all of it.

Reads and writes are the best of `--rounds` (each write into a new dir), on page-cached files.
Results print as a table and are written to bench/results/spark.json (with `--only read`, only
the read figure is measured, and printed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from seglogfs.engine import BrokerConfig, DataDir

T0 = 1_763_800_000_000
RESULTS = Path(__file__).resolve().parent / "results"
CHUNK = 250_000
# Spark's Python workers talk to the JVM over a Unix socket rather than TCP on loopback: a query's
# fixed cost (planning and task round trips) falls from about 0.11 s to 0.06-0.08 s here, for any
# Python source. Both the seglog figures and their baselines run in this one session.
SESSION_CONF = {"spark.python.unix.domain.socket.enabled": "true"}


def timed(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def best(work: Callable[[], object], rounds: int) -> float:
    return min(timed(work) for _ in range(rounds))


def build_data_dir(path: Path, records: int, value_bytes: int) -> None:
    """`records` records over two partitions, timestamps rising by 1 ms per record (so the last 1%
    by time is the last 1% of each partition), segments of 128 MiB."""
    rng = np.random.default_rng(1)
    pool = rng.integers(0, 256, (CHUNK + 1) * value_bytes, dtype=np.uint8).tobytes()
    config = BrokerConfig.load(overrides=["log.segment.bytes=134217728"], log_dirs=[path])
    with DataDir.open(config, now_ms=T0) as data_dir:
        data_dir.create_topic("bench", 2, now_ms=T0)
        logs = [data_dir.partition("bench", p) for p in (0, 1)]
        for start in range(0, records, CHUNK):
            n = min(CHUNK, records - start)
            shift = start % 997
            values = [pool[(i + shift) * value_bytes : (i + shift + 1) * value_bytes] for i in range(n)]
            keys = [b"key-%08d" % (start + i) for i in range(n)]
            stamps = T0 + np.arange(start, start + n, dtype=np.int64)
            logs[(start // CHUNK) % 2].append_records(values, keys=keys, timestamps=stamps, now_ms=T0)
        data_dir.create_topic("one", 1, now_ms=T0)
        data_dir.partition("one", 0).append_records([pool[:value_bytes]], keys=[b"key"], timestamps=T0, now_ms=T0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", choices=["read"], default=None, help="measure the read figure only")
    parser.add_argument("--dir", type=Path, default=None, help="work dir (default: a temporary dir, removed after)")
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"a Spark setting for the session (default: {' '.join(f'{k}={v}' for k, v in SESSION_CONF.items())})",
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="seglog-spark-bench-", dir=args.dir))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    try:
        source = work / "logs"
        print(f"building {args.records:,} records of {args.value_bytes} bytes ...", flush=True)
        build_seconds = timed(lambda: build_data_dir(source, args.records, args.value_bytes))
        log_bytes = sum(f.stat().st_size for f in source.glob("*/*.log"))
        print(f"  {build_seconds:.1f} s, {log_bytes / 2**20:,.0f} MiB of segments", flush=True)

        from pyspark.sql import SparkSession

        from seglogfs.pipeline import register

        session_conf = dict(SESSION_CONF)
        session_conf.update(setting.split("=", 1) for setting in args.conf)
        builder = (
            SparkSession.builder.master("local[2]")
            .appName("seglog-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.memory", "2g")
            .config("spark.sql.session.timeZone", "UTC")
        )
        for key, value in session_conf.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)

        def seglog(topic: str = "bench", **options: str):
            reader = spark.read.format("seglog").option("path", str(source)).option("subscribe", topic)
            for key, value in options.items():
                reader = reader.option(key, value)
            return reader.load()

        def drain(frame) -> None:
            frame.write.format("noop").mode("overwrite").save()

        parquet = work / "parquet"
        print("preparing the Parquet copy ...", flush=True)
        seglog().write.parquet(str(parquet))  # (also brings the segments into the page cache)
        count = seglog().count()
        assert count == args.records, f"{count} rows read, {args.records} written"

        results: dict[str, object] = {"records": args.records, "value_bytes": args.value_bytes}
        results["spark_conf"] = session_conf
        read_seglog = best(lambda: drain(seglog()), args.rounds)
        read_parquet = best(lambda: drain(spark.read.parquet(str(parquet))), args.rounds)
        n = args.records
        if args.only == "read":
            spark.stop()
            print(f"{'figure':<44}{'seglog':>14}{'baseline':>14}{'ratio':>9}")
            print(
                f"{'read, rows/s (baseline: Parquet)':<44}{n / read_seglog:>14,.0f}{n / read_parquet:>14,.0f}"
                f"{read_parquet / read_seglog:>9.2f}"
            )
            return
        bound = T0 + args.records - args.records // 100
        condition = f"timestamp >= timestamp_millis({bound})"
        selected = seglog().where(condition).count()
        assert selected == args.records // 100, f"{selected} rows in the last 1%"
        # A short query: as many rounds as the floors below.
        filtered = best(lambda: drain(seglog().where(condition)), args.rounds + 2)
        unpushed = best(lambda: drain(seglog(pushFilters="false").where(condition)), args.rounds)
        spark_floor = best(lambda: drain(spark.range(1)), args.rounds + 2)
        seglog_floor = best(lambda: drain(seglog("one")), args.rounds + 2)
        net_ratio = (filtered - seglog_floor) / (read_seglog - seglog_floor)

        rows = spark.read.parquet(str(parquet)).select("key", "value")

        def write_seglog_copy(target: Path) -> None:
            writer = rows.write.format("seglog").option("path", str(target)).option("topic", "copy")
            writer.option("override.num.partitions", "2").mode("append").save()

        write_seglog = write_parquet = float("inf")
        for round_ in range(args.rounds):  # alternating: neither gets a warmer JVM or page cache
            target = work / f"copy-{round_}"
            write_seglog = min(write_seglog, timed(lambda: write_seglog_copy(target)))  # noqa: B023
            written = spark.read.format("seglog").option("path", str(target)).option("subscribe", "copy").load()
            assert written.count() == args.records, f"{written.count()} rows written"
            shutil.rmtree(target)
            target = work / f"copy-{round_}.parquet"
            write_parquet = min(write_parquet, timed(lambda: rows.write.parquet(str(target))))  # noqa: B023
            shutil.rmtree(target)
        spark.stop()

        results.update(
            {
                "read_seconds": read_seglog,
                "read_rows_per_s": n / read_seglog,
                "parquet_read_seconds": read_parquet,
                "parquet_read_rows_per_s": n / read_parquet,
                "read_ratio_to_parquet": read_parquet / read_seglog,
                "write_seconds": write_seglog,
                "write_rows_per_s": n / write_seglog,
                "parquet_write_seconds": write_parquet,
                "parquet_write_rows_per_s": n / write_parquet,
                "write_ratio_to_parquet": write_parquet / write_seglog,
                "filter_last_1pct_seconds": filtered,
                "filter_last_1pct_ratio_to_full_read": filtered / read_seglog,
                "spark_floor_seconds": spark_floor,
                "seglog_one_record_seconds": seglog_floor,
                "filter_last_1pct_net_ratio": net_ratio,
                "filter_last_1pct_unpushed_seconds": unpushed,
                "filter_last_1pct_unpushed_ratio_to_full_read": unpushed / read_seglog,
            }
        )
        print()
        print(f"{'figure':<44}{'seglog':>14}{'baseline':>14}{'ratio':>9}")
        print(
            f"{'read, rows/s (baseline: Parquet)':<44}{n / read_seglog:>14,.0f}{n / read_parquet:>14,.0f}"
            f"{read_parquet / read_seglog:>9.2f}"
        )
        print(
            f"{'write, rows/s (baseline: Parquet)':<44}{n / write_seglog:>14,.0f}{n / write_parquet:>14,.0f}"
            f"{write_parquet / write_seglog:>9.2f}"
        )
        print(
            f"{'timestamp >= last 1%, s (baseline: full)':<44}{filtered:>14.2f}{read_seglog:>14.2f}"
            f"{filtered / read_seglog:>9.3f}"
        )
        print(f"{'  the same unpushed, s':<44}{unpushed:>14.2f}{read_seglog:>14.2f}{unpushed / read_seglog:>9.3f}")
        print(
            f"{'  net of a one-record read, s':<44}{filtered - seglog_floor:>14.2f}"
            f"{read_seglog - seglog_floor:>14.2f}{net_ratio:>9.3f}"
        )
        print(f"{'  (Spark: range(1), s; one-record read, s)':<44}{spark_floor:>14.2f}{seglog_floor:>14.2f}")
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "spark.json").write_text(json.dumps(results, indent=2) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
