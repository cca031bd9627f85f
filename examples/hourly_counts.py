"""A topic to hourly per-key record counts in Parquet, as a batch job or as a streaming query.

    python examples/hourly_counts.py batch  DATA_DIR TOPIC OUT
    python examples/hourly_counts.py stream DATA_DIR TOPIC OUT CHECKPOINT [--available-now]

DATA_DIR is a data dir, a broker's log dirs (comma-separated) or a seglogfs mount point.

batch: every record of TOPIC, counted per hour (of the record's timestamp) and key, written to
OUT as Parquet partitioned by hour (replacing what was there).

stream: the records appended to TOPIC from now on (from the start with `--available-now`, which
also stops once it has read what is there), counted per hour and key; an hour's counts are
appended to OUT once the watermark (an hour behind the newest timestamp seen) has passed it.
Restarted with the same CHECKPOINT, the query goes on where it stopped.
"""

from __future__ import annotations

import argparse

from pyspark.sql import DataFrame, SparkSession, functions

from seglogfs.pipeline import register


def batch(spark: SparkSession, data_dir: str, topic: str, out: str) -> None:
    records = spark.read.format("seglog").option("path", data_dir).option("subscribe", topic).load()
    hourly = records.groupBy(
        functions.date_trunc("hour", "timestamp").alias("hour"), functions.col("key").cast("string").alias("key")
    ).count()
    hourly.write.mode("overwrite").partitionBy("hour").parquet(out)


def stream(spark: SparkSession, data_dir: str, topic: str, out: str, checkpoint: str, *, available_now: bool) -> None:
    records: DataFrame = (
        spark.readStream.format("seglog")
        .option("path", data_dir)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest" if available_now else "latest")
        .load()
    )
    hourly = (
        records.withWatermark("timestamp", "1 hour")
        .groupBy(functions.window("timestamp", "1 hour"), functions.col("key").cast("string").alias("key"))
        .count()
        .select(functions.col("window.start").alias("hour"), "key", "count")
    )
    writer = hourly.writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint)
    writer = writer.outputMode("append")
    query = writer.trigger(availableNow=True).start() if available_now else writer.start()
    query.awaitTermination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["batch", "stream"])
    parser.add_argument("data_dir")
    parser.add_argument("topic")
    parser.add_argument("out")
    parser.add_argument("checkpoint", nargs="?")
    parser.add_argument("--available-now", action="store_true")
    args = parser.parse_args()
    spark = SparkSession.builder.appName("hourly-counts").config("spark.sql.session.timeZone", "UTC").getOrCreate()
    register(spark)
    if args.mode == "batch":
        batch(spark, args.data_dir, args.topic, args.out)
    else:
        if args.checkpoint is None:
            parser.error("stream needs a CHECKPOINT directory")
        stream(spark, args.data_dir, args.topic, args.out, args.checkpoint, available_now=args.available_now)
    spark.stop()


if __name__ == "__main__":
    main()
