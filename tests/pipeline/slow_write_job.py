"""A write job that stages slowly, run as its own Spark application (its own JVM) so a test can
kill it outright mid-write:

    python -m tests.pipeline.slow_write_job DATA_DIR TOPIC ROWS

Four tasks stage `ROWS` rows in Arrow batches of 1,000, each value made by a Python UDF that
sleeps a millisecond, so the job is still writing for many seconds after its first staged bytes
appear.
"""

from __future__ import annotations

import os
import sys
import time

from tests.pipeline.jvm import TEST_JVM_OPTIONS


def slowly(value: str) -> bytes:
    time.sleep(0.001)
    return value.encode()


def main(data_dir: str, topic: str, rows: int) -> None:
    from pyspark.sql import SparkSession, functions

    from seglogfs.pipeline import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("seglogfs-slow-write")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.extraJavaOptions", TEST_JVM_OPTIONS)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
        .getOrCreate()
    )
    register(spark)
    slow_value = functions.udf(slowly, "binary")
    frame = spark.range(0, rows, numPartitions=4).selectExpr("cast(id as string) as key")
    frame = frame.withColumn("value", slow_value(functions.concat(functions.lit("value-"), frame.key)))
    frame.write.format("seglog").option("path", data_dir).option("topic", topic).mode("append").save()
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
