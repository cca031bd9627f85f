"""The issue's query sequences over Spark Connect, run as its own application: a Connect client
(`SparkSession.builder.remote("local[2]")`, which starts pyspark's Connect server in local mode
in a JVM of its own; it cannot share the JVM of the suite's classic session).

    python -m tests.pipeline.connect_job DATA_DIR

DATA_DIR holds a topic `orders` of 3 partitions of 100 records each. Prints one JSON object of
what each query answered.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.pipeline.jvm import TEST_JVM_OPTIONS


def main(data_dir: str) -> None:
    from pyspark.sql import SparkSession

    from seglogfs.pipeline import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.remote("local[2]").config("spark.driver.extraJavaOptions", TEST_JVM_OPTIONS).getOrCreate()
    )
    try:
        register(spark)
        df = spark.read.format("seglog").option("path", data_dir).option("subscribe", "orders").load()
        answers: dict[str, object] = {
            "dataframe": [df.count(), df.where("offset >= 50").count(), df.count()],
            "partition_then_all": [df.where("partition = 0").count(), df.count()],
        }
        df.createOrReplaceTempView("orders_view")
        answers["temp_view"] = [
            spark.sql("SELECT count(*) FROM orders_view WHERE offset < 5").first()[0],
            spark.sql("SELECT count(*) FROM orders_view").first()[0],
        ]
        lines = "".join(f"order-{n}\n" for n in range(10))
        subprocess.run(
            [
                sys.executable,
                "-m",
                "seglogfs.mount_tools.cli",
                "produce",
                data_dir,
                "--topic",
                "orders",
                "--partition",
                "1",
            ],
            input=lines,
            text=True,
            check=True,
            capture_output=True,
        )
        answers["after_append"] = [df.count(), spark.sql("SELECT count(*) FROM orders_view").first()[0]]
        answers["session"] = type(spark).__module__
    finally:
        spark.stop()
    print(json.dumps(answers))


if __name__ == "__main__":
    main(sys.argv[1])
