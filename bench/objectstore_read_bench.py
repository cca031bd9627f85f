"""Reading a backup where it is, in object storage (a real S3 server on loopback: s3proxy, as the
tests run it), each figure a ratio to the same read of the local data dir in the same run.

    .venv/bin/python -m bench.objectstore_read_bench [--records 10000000] [--rounds 2] [--dir DIR]

The data dir of bench/spark_bench (two partitions, 128 MiB segments, values of 100 bytes,
timestamps rising 1 ms a record) is backed up to the server. Then:

* Spark read: every record into Spark's `noop` sink on local[2], `path` the bucket's URI vs the
  data dir (the data dir page-cached; the server's files too, on the same disk): rows/s and
  their ratio (bucket / local). Each bucket round reads cold (its own local copy: nothing
  fetched before).
* Spark `startingTimestamp` for the last 1% of the records: the bytes fetched from the server
  (planning and tasks, as the source counts them), as a share of the bucket's segment bytes, and
  what planning fetched of them (none: it reads index objects and the catalogue).
* consume: `seglogfs consume --from-beginning` of partition 0 into a pipe, from the bucket vs
  from the data dir (each run a new process: its own local copy, fetched cold).

Client and server share the machine's cores (the load average is printed). Results print as a
table and are written to bench/results/objectstore_read.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.spark_bench import T0, build_data_dir
from seglogfs.pipeline.reading import FETCHES_FILE, METRICS_ENV
from tests.objectstore.conftest import CREDENTIAL, IDENTITY, REGION, S3Server

RESULTS = Path(__file__).resolve().parent / "results"
SEGLOGFS = str(Path(sys.executable).parent / "seglogfs")


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def timed_run(command: list[str], env: dict[str, str], *, drain: bool = False) -> float:
    """Seconds `command` took; with `drain` its output is read through a pipe (into /dev/null
    directly, `consume` would know it goes nowhere and skip its work)."""
    started = time.perf_counter()
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE if drain else subprocess.DEVNULL, stderr=subprocess.PIPE
    ) as process:
        if drain:
            assert process.stdout is not None
            while process.stdout.read(1 << 20):
                pass
        stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command[:3])} … exited {process.returncode}: {stderr[-2000:]}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=None, help="work dir (default: a temporary dir, removed after)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="seglog-objectstore-read-bench-", dir=args.dir))
    metrics = work / "metrics"
    metrics.mkdir()
    server = None
    try:
        data = work / "data"
        print(f"building {args.records:,} records (load {load()}) ...", flush=True)
        build_data_dir(data, args.records, args.value_bytes)
        segment_bytes = sum(path.stat().st_size for path in data.glob("bench-*/*.log"))
        server = S3Server(work / "s3")
        bucket = server.new_bucket()
        env = {**os.environ, **server.env()}
        print(f"backing up {segment_bytes / 2**20:,.0f} MiB of segments ...", flush=True)
        timed_run([SEGLOGFS, "backup", str(data), f"s3://{bucket}/backup"], env)

        def uri(round_: int) -> str:
            # (a query of its own per round: a new local copy in the Python workers, read cold)
            return (
                f"s3://{bucket}/backup?endpoint_override=127.0.0.1:{server.port}&scheme=http&region={REGION}"
                f"&access_key={IDENTITY}&secret_key={CREDENTIAL}&connect_timeout={5 + round_}"
            )

        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ[METRICS_ENV] = str(metrics)
        from pyspark.sql import SparkSession

        from seglogfs.pipeline import register

        spark = (
            SparkSession.builder.master("local[2]")
            .appName("seglog-objectstore-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.memory", "2g")
            .config("spark.python.unix.domain.socket.enabled", "true")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)

        def drain(path: str, **options: str) -> float:
            reader = spark.read.format("seglog").option("path", path).option("subscribe", "bench")
            for key, value in options.items():
                reader = reader.option(key, value)
            started = time.perf_counter()
            reader.load().write.format("noop").mode("overwrite").save()
            return time.perf_counter() - started

        drain(str(data))  # (the JVM, the Python workers, the page cache: warm for both)
        local = bucket_read = float("inf")
        for round_ in range(args.rounds):  # alternating: neither side gets a warmer machine
            local = min(local, drain(str(data)))
            bucket_read = min(bucket_read, drain(uri(round_ + 1)))
        (metrics / FETCHES_FILE).unlink(missing_ok=True)
        start = T0 + args.records - args.records // 100
        late_seconds = drain(
            uri(args.rounds + 1), startingTimestamp=str(start), startingOffsetsByTimestampStrategy="latest"
        )
        entries = [json.loads(line) for line in (metrics / FETCHES_FILE).read_text().splitlines()]
        fetched = sum(entry["bytes"] for entry in entries)
        fetched_planning = sum(entry["bytes"] for entry in entries if entry["where"] == "planning")
        spark.stop()

        consume_local = consume_bucket = float("inf")
        for _ in range(args.rounds):
            for where in (str(data), f"s3://{bucket}/backup"):
                seconds = timed_run(
                    [SEGLOGFS, "consume", where, "--topic", "bench", "--partition", "0", "--from-beginning"],
                    env,
                    drain=True,
                )
                if where == str(data):
                    consume_local = min(consume_local, seconds)
                else:
                    consume_bucket = min(consume_bucket, seconds)
        n = args.records
        results = {
            "records": n,
            "segment_mib": round(segment_bytes / 2**20, 1),
            "rounds": args.rounds,
            "spark_local_rows_s": round(n / local),
            "spark_bucket_rows_s": round(n / bucket_read),
            "spark_ratio_bucket_to_local": round(local / bucket_read, 2),
            "last_1pct_fetched_mib": round(fetched / 2**20, 2),
            "last_1pct_fetched_share": round(fetched / segment_bytes, 4),
            "last_1pct_fetched_by_planning_bytes": fetched_planning,
            "last_1pct_seconds": round(late_seconds, 2),
            "consume_local_s": round(consume_local, 2),
            "consume_bucket_s": round(consume_bucket, 2),
            "consume_ratio_bucket_to_local": round(consume_local / consume_bucket, 2),
            "load": load(),
        }
        print(f"{'':34} {'bucket':>12} {'local':>12} {'ratio':>7}")
        print(
            f"{'Spark read, rows/s':34} {results['spark_bucket_rows_s']:>12,} {results['spark_local_rows_s']:>12,} "
            f"{results['spark_ratio_bucket_to_local']:>7}"
        )
        print(
            f"{'consume partition 0, s':34} {results['consume_bucket_s']:>12} {results['consume_local_s']:>12} "
            f"{results['consume_ratio_bucket_to_local']:>7}"
        )
        print(
            f"startingTimestamp, last 1%: {results['last_1pct_fetched_mib']} MiB fetched, "
            f"{100 * results['last_1pct_fetched_share']:.2f}% of the segments' bytes "
            f"({fetched_planning} bytes of it by planning), {results['last_1pct_seconds']} s"
        )
        print(f"load average: {results['load']}")
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "objectstore_read.json").write_text(json.dumps(results, indent=2) + "\n")
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
