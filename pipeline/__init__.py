"""The PySpark data source `seglog`: Kafka log dirs read and written by Spark, with the schema
and options of Spark's own Kafka source.

    from seglogfs.pipeline import register
    register(spark)
    df = (spark.read.format("seglog").option("path", "/var/lib/kafka-logs")
          .option("subscribe", "orders").option("startingTimestamp", "1763800000000").load())
    df.write.format("seglog").option("path", "/var/lib/seglogfs").option("topic", "copy").mode("append").save()
    source_metrics(query.lastProgress.sources[0])   # a stream's Spark Kafka metrics

Modules: `options` (names, checks, precedence), `planning` (offsets and segment slices; no
pyspark, reusable by a streaming reader), `streaming` (micro-batch offsets of
`spark.readStream.format("seglog")`, no pyspark), `filters` (pushed-down predicates), `reading`
(a task's slice → Arrow batches), `partitioning` (Kafka's partitioner, vectorised), `writing` (staging and
commit) and `source` (the pyspark classes).
"""

from __future__ import annotations

from typing import Any

from seglogfs.pipeline.streaming import source_metrics

__all__ = ["register", "source_metrics"]

FILTER_PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: Any, *, filter_pushdown: bool = True) -> None:
    """Register `format("seglog")` with a SparkSession. Python data sources get pushed-down
    filters only with `spark.sql.python.filterPushdown.enabled`, and Spark then refuses any read
    of a source able to take them while it is off: this turns it on (sources that push nothing
    are unaffected), or with `filter_pushdown=False` registers a `seglog` that pushes nothing.
    One query can also opt out with the option `pushFilters=false`. (`seglog` is offered the
    filters and pushes none while Spark reuses a DataFrame's plan: see `source.PushdownSeglogReader`.)"""
    # (imported here: the package's other modules are usable without pyspark)
    from seglogfs.pipeline.source import SeglogDataSource, SeglogDataSourceWithoutPushdown  # noqa: PLC0415

    if filter_pushdown:
        spark.conf.set(FILTER_PUSHDOWN_CONF, "true")
        spark.dataSource.register(SeglogDataSource)
    else:
        spark.dataSource.register(SeglogDataSourceWithoutPushdown)
