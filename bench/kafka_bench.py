"""seglogfs beside what a user would run instead: Apache Kafka's broker, its tools and Spark's Kafka
source, on the same records, each ratio from one run.

    .venv/bin/python -m bench.kafka_bench [--scale 1.0] [--only spark consume dump] [--rounds 1]
        [--record-bytes 128] [--dir DIR]

A single-node KRaft broker (Kafka 4.4.0, tests/interop/conftest.py's `Broker`, from the jars
`scripts/dev setup` resolved) is started in a temporary dir, and Kafka's own
`kafka-producer-perf-test` writes 10 M records (values of `--record-bytes` random capital
letters, no key, uncompressed, batches of up to 256 KiB) into a one-partition topic whose
`segment.bytes` is 1 GiB, so that the first segment is a full 1 GiB one. The broker keeps running:
seglogfs reads its live log dir, Kafka's side reads through it. Then:

* spark: Spark's Kafka source (spark-sql-kafka 4.2.0, on the broker) vs `format("seglog")` (on the
  broker's log dir), in one local[2] session, the same options (`subscribe`, `minPartitions=2`:
  two tasks for the one partition), in rows/s: `count()`, an aggregation over every column (the
  rows are materialised; the two results must be equal) and the rows drained into Spark's `noop`
  sink;
* consume: `seglogfs consume --from-beginning` vs `kafka-console-consumer --from-beginning
  --max-messages N` through the broker, both printing timestamp, partition, offset, key and value
  (`--property print.*=true`) to /dev/null, in records/s (the first 1,000 lines of each are
  compared first);
* dump: `seglogfs dump --deep-iteration --print-data-log` vs `kafka-dump-log` with the same flags
  on the topic's first segment (1 GiB), to /dev/null, in MiB/s (the dumps of its first MiB,
  `--max-bytes`, are compared first).

Kafka's tools run with the JVM options of Kafka's own scripts (kafka-run-class.sh: G1, the full
JIT; kafka-console-consumer.sh's 512 MiB heap), not the tests' short-run options. Each figure is
the best of `--rounds`, the two sides interleaved, on page-cached files. `--scale 0.05` is a
quick run at 1/20 (500 k records, segments of 51 MiB). Other processes on the machine change the
figures: the load average is printed beside them. Results print as a table and are written to
bench/results/kafka.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.interop.conftest import NEWEST, Broker, Kafka
from tests.pipeline.conftest import kafka_source_jars

RESULTS = Path(__file__).resolve().parent / "results"
RECORDS = 10_000_000
SEGMENT_BYTES = 2**30
TOPIC = "bench"
# kafka-run-class.sh's KAFKA_JVM_PERFORMANCE_OPTS: what `kafka-dump-log` and
# `kafka-console-consumer` run with when a user types them.
SCRIPT_JVM = [
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
]
PRINT = ["print.timestamp=true", "print.partition=true", "print.offset=true", "print.key=true"]
# Spark's session, as bench/spark_bench.py's.
SESSION_CONF = {"spark.python.unix.domain.socket.enabled": "true"}


def script_command(kafka: Kafka, tool: str, *args: str, heap: str = "256M") -> list[str]:
    """A Kafka tool's command line as its shell script builds it (heap: KAFKA_HEAP_OPTS, 256 MiB
    unless the script sets its own)."""
    return [
        kafka.java,
        f"-Xmx{heap}",
        *SCRIPT_JVM,
        *kafka.tools_logging,
        "-cp",
        kafka.classpath,
        kafka.main_class(tool),
        *args,
    ]


def seglogfs_command(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "seglogfs"), *args]


def timed(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def to_null(command: Sequence[str]) -> Callable[[], None]:
    def run() -> None:
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
        if done.returncode != 0:
            raise SystemExit(
                f"{command[0]} ... exited {done.returncode}: {done.stderr.decode(errors='replace')[-2000:]}"
            )

    return run


def interleaved(ours: Callable[[], object], theirs: Callable[[], object], rounds: int) -> tuple[float, float]:
    """The best time of each over `rounds`, alternating: neither gets the warmer page cache."""
    best_ours = best_theirs = float("inf")
    for _ in range(rounds):
        best_theirs = min(best_theirs, timed(theirs))
        best_ours = min(best_ours, timed(ours))
    return best_ours, best_theirs


def children_cpu() -> float:
    """CPU seconds (user and system) of the finished child processes so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def tool_figures(ours: Callable[[], object], theirs: Callable[[], object], rounds: int) -> dict[str, float]:
    """`interleaved` for two commands, with the CPU seconds of each side's best round as well:
    on a machine others load, the CPU a tool takes says more than the time it waits for it."""
    best: dict[str, tuple[float, float]] = {}
    for _ in range(rounds):
        for name, work in (("kafka", theirs), ("seglogfs", ours)):
            cpu = children_cpu()
            seconds = timed(work)
            cpu = children_cpu() - cpu
            best[name] = min(best.get(name, (float("inf"), 0.0)), (seconds, cpu))
    return {
        f"{name}_{what}": value
        for name, pair in best.items()
        for what, value in zip(("seconds", "cpu_seconds"), pair, strict=True)
    }


def figure(value: float) -> str:
    return f"{value:>14,.0f}" if value >= 100 else f"{value:>14.2f}"


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def produce(kafka: Kafka, broker: Broker, records: int, record_bytes: int) -> None:
    """Kafka's producer perf test: the broker writes the records as it would a client's."""
    done = subprocess.run(
        script_command(
            kafka,
            "org.apache.kafka.tools.ProducerPerformance",
            "--topic",
            TOPIC,
            "--num-records",
            str(records),
            "--record-size",
            str(record_bytes),
            "--throughput",
            "-1",
            "--producer-props",
            f"bootstrap.servers={broker.bootstrap}",
            "acks=1",
            "batch.size=262144",
            "linger.ms=20",
            "buffer.memory=67108864",
            "compression.type=none",
            heap="512M",
        ),
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"kafka-producer-perf-test exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    print("  " + done.stdout.decode().strip().splitlines()[-1], flush=True)


def bench_dump(kafka: Kafka, segment: Path, rounds: int) -> dict[str, Any]:
    flags = ["--deep-iteration", "--print-data-log"]
    first = ["--max-bytes", str(2**20)]
    ours_head = subprocess.run(seglogfs_command("dump", *flags, *first, str(segment)), capture_output=True, check=True)
    theirs_head = subprocess.run(
        script_command(kafka, "dump-log", *flags, *first, "--files", str(segment)), capture_output=True, check=True
    )
    if ours_head.stdout != theirs_head.stdout:
        raise SystemExit(f"seglogfs dump and kafka-dump-log differ on the first MiB of {segment}")
    figures = tool_figures(
        to_null(seglogfs_command("dump", *flags, str(segment))),
        to_null(script_command(kafka, "dump-log", *flags, "--files", str(segment))),
        rounds,
    )
    print(f"  {figures} (load {load()})", flush=True)
    return {**figures, "bytes": segment.stat().st_size}


def bench_consume(kafka: Kafka, broker: Broker, records: int, rounds: int) -> dict[str, Any]:
    def ours(*limit: str) -> list[str]:
        properties = [arg for p in PRINT for arg in ("--property", p)]
        return seglogfs_command(
            "consume", "--topic", TOPIC, "--from-beginning", *limit, *properties, str(broker.log_dir)
        )

    def theirs(count: int) -> list[str]:
        # (--property is deprecated in Kafka 4, and says so on standard output)
        properties = [arg for p in PRINT for arg in ("--formatter-property", p)]
        return script_command(
            kafka,
            "console-consumer",
            "--bootstrap-server",
            broker.bootstrap,
            "--topic",
            TOPIC,
            "--from-beginning",
            "--max-messages",
            str(count),
            *properties,
            heap="512M",
        )

    head = 1000
    ours_head = subprocess.run(ours("--max-messages", str(head)), capture_output=True, check=True).stdout
    theirs_head = subprocess.run(theirs(head), capture_output=True, check=True).stdout
    if ours_head != theirs_head:
        raise SystemExit(
            f"seglogfs consume and kafka-console-consumer differ in their first {head} lines:\n"
            f"{ours_head[:300]!r}\n{theirs_head[:300]!r}"
        )
    figures = tool_figures(to_null(ours()), to_null(theirs(records)), rounds)
    print(f"  {figures} (load {load()})", flush=True)
    return figures


def bench_spark(broker: Broker, records: int, rounds: int) -> dict[str, object]:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from seglogfs.pipeline import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("seglog-kafka-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.jars", ",".join(kafka_source_jars()))
    )
    for key, value in SESSION_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)

    def seglog():
        reader = spark.read.format("seglog").option("path", str(broker.log_dir))
        return reader.option("subscribe", TOPIC).option("minPartitions", "2").load()

    def kafka():
        reader = spark.read.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
        return reader.option("subscribe", TOPIC).option("minPartitions", "2").load()

    def aggregate(frame):
        return frame.agg(
            F.count(F.lit(1)).alias("rows"),
            F.sum(F.coalesce(F.length("key"), F.lit(-1))).alias("keys"),
            F.sum(F.length("value")).alias("values"),
            F.max("topic").alias("topic"),
            F.sum("partition").alias("partitions"),
            F.sum("offset").alias("offsets"),
            F.min("timestamp").alias("first"),
            F.max("timestamp").alias("last"),
            F.sum("timestampType").alias("types"),
        ).collect()[0]

    def drain(frame) -> None:
        frame.write.format("noop").mode("overwrite").save()

    results: dict[str, object] = {}
    try:
        # Each source's first query starts its code paths (and the Kafka source's consumers).
        for frame in (seglog, kafka):
            if frame().count() != records:
                raise SystemExit(f"{frame.__name__} counted {frame().count()} rows, {records} were produced")
        ours_agg, theirs_agg = aggregate(seglog()), aggregate(kafka())
        if ours_agg != theirs_agg:
            raise SystemExit(f"the aggregations differ:\nseglog {ours_agg}\nkafka  {theirs_agg}")
        for name, work in (
            ("count", lambda frame: frame().count()),
            ("aggregate", lambda frame: aggregate(frame())),
            ("noop", lambda frame: drain(frame())),
        ):
            ours, theirs = interleaved(lambda: work(seglog), lambda: work(kafka), rounds)  # noqa: B023
            results[name] = {"seglogfs_seconds": ours, "kafka_seconds": theirs, "load": load()}
            print(f"  {name}: seglog {ours:.2f} s, kafka {theirs:.2f} s (load {load()})", flush=True)
    finally:
        spark.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--scale",
        type=float,
        default=float(os.environ.get("SEGLOG_BENCH_SCALE", "1")),
        help="of 10 M records and 1 GiB segments",
    )
    parser.add_argument("--record-bytes", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--only", nargs="+", choices=["spark", "consume", "dump"], default=["spark", "consume", "dump"])
    parser.add_argument("--dir", type=Path, default=None, help="work dir (default: a temporary dir, removed after)")
    args = parser.parse_args()
    records = int(RECORDS * args.scale)
    segment_bytes = max(2**20, int(SEGMENT_BYTES * args.scale))

    work = Path(tempfile.mkdtemp(prefix="seglog-kafka-bench-", dir=args.dir))
    broker = None
    try:
        kafka = Kafka(NEWEST, work / "kafka")
        broker = Broker(kafka, work / "broker")
        broker.format()
        broker.start()
        broker.create_topic(TOPIC, 1, segment_bytes=str(segment_bytes))
        print(f"producing {records:,} records of {args.record_bytes} bytes (load {load()}) ...", flush=True)
        produce_seconds = timed(lambda: produce(kafka, broker, records, args.record_bytes))
        partition = broker.log_dir / f"{TOPIC}-0"
        segments = sorted(partition.glob("*.log"))
        size = sum(s.stat().st_size for s in segments)
        print(f"  {produce_seconds:.1f} s, {len(segments)} segments, {size / 2**20:,.0f} MiB", flush=True)

        results: dict[str, object] = {
            "kafka": NEWEST,
            "spark_kafka": "4.2.0",
            "records": records,
            "record_bytes": args.record_bytes,
            "segment_bytes": segment_bytes,
            "rounds": args.rounds,
        }
        rows: list[tuple[str, float, float, str]] = []
        if "dump" in args.only:
            print(f"dump of {segments[0].name} ({segments[0].stat().st_size / 2**20:,.0f} MiB) ...", flush=True)
            dump = bench_dump(kafka, segments[0], args.rounds)
            dump["load"] = load()
            results["dump"] = dump
            mib = dump["bytes"] / 2**20
            rows.append(("dump, MiB/s", mib / dump["seglogfs_seconds"], mib / dump["kafka_seconds"], dump["load"]))
            rows.append(
                ("  MiB per CPU s", mib / dump["seglogfs_cpu_seconds"], mib / dump["kafka_cpu_seconds"], dump["load"])
            )
        if "consume" in args.only:
            print("consume ...", flush=True)
            consume = bench_consume(kafka, broker, records, args.rounds)
            consume["load"] = load()
            results["consume"] = consume
            rows.append(
                (
                    "consume, records/s",
                    records / consume["seglogfs_seconds"],
                    records / consume["kafka_seconds"],
                    consume["load"],
                )
            )
            rows.append(  # (Kafka's side: the consumer's CPU, not the broker's serving it)
                (
                    "  records per CPU s",
                    records / consume["seglogfs_cpu_seconds"],
                    records / consume["kafka_cpu_seconds"],
                    consume["load"],
                )
            )
        if "spark" in args.only:
            print("spark ...", flush=True)
            spark = bench_spark(broker, records, args.rounds)
            results["spark"] = spark
            for name, measured in spark.items():
                rows.append(
                    (
                        f"spark {name}, rows/s",
                        records / measured["seglogfs_seconds"],
                        records / measured["kafka_seconds"],
                        measured["load"],
                    )
                )
        broker.stop()
        errors = broker.errors_since(0)
        if errors:
            raise SystemExit("the broker logged errors:\n" + "\n".join(errors[:20]))

        print()
        print(f"{'figure':<28}{'seglogfs':>14}{'Kafka':>14}{'ratio':>9}   load (1/5/15 min)")
        for name, ours, theirs, at in rows:
            print(f"{name:<28}{figure(ours)}{figure(theirs)}{ours / theirs:>9.2f}   {at}")
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "kafka.json").write_text(json.dumps(results, indent=2) + "\n")
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
