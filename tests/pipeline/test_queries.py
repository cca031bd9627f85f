"""One loaded DataFrame (or temp view) queried again and again, as in a notebook or a Thrift
server: each query is planned from its own filters only, and sees the records there are when it
runs, as with Spark's Kafka source."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SEGLOGFS = [sys.executable, "-m", "seglogfs.mount_tools.cli"]


def seglogfs(*args: str, stdin: str | None = None) -> None:
    subprocess.run([*SEGLOGFS, *args], input=stdin, cwd=REPO, check=True, capture_output=True, text=True)


def produce(data: Path, partition: int, first: int, count: int) -> None:
    lines = "".join(f"order-{n}\n" for n in range(first, first + count))
    seglogfs("produce", str(data), "--topic", "orders", "--partition", str(partition), stdin=lines)


def new_orders(data: Path, records_per_partition: int = 100) -> Path:
    """A topic `orders` of 3 partitions holding `records_per_partition` records each."""
    seglogfs("topics", str(data), "create", "--topic", "orders", "--partitions", "3")
    for partition in range(3):
        produce(data, partition, 0, records_per_partition)
    return data


@pytest.fixture(scope="module")
def orders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return new_orders(tmp_path_factory.mktemp("queries") / "data")


def load(spark, data: Path, **options: str):
    reader = spark.read.format("seglog").option("path", str(data)).option("subscribe", "orders")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_a_query_without_filters_after_one_with_filters_reads_everything(spark, orders: Path) -> None:
    df = load(spark, orders)
    assert (df.count(), df.where("offset >= 50").count(), df.count()) == (300, 150, 300)
    assert (df.where("partition = 0").count(), df.count()) == (100, 300)
    # an OR pushes nothing: it must not be answered from the previous query's plan
    assert (df.where("offset < 5").count(), df.where("offset < 5 or offset >= 97").count()) == (15, 24)


def test_a_temp_view_answers_each_statement_from_its_own_where(spark, orders: Path) -> None:
    load(spark, orders).createOrReplaceTempView("orders_view")
    try:
        assert spark.sql("SELECT count(*) FROM orders_view WHERE offset < 5").first()[0] == 15
        assert spark.sql("SELECT count(*) FROM orders_view").first()[0] == 300
        assert spark.sql("SELECT count(*) FROM orders_view WHERE partition = 2 AND offset >= 90").first()[0] == 10
        assert spark.sql("SELECT max(offset) FROM orders_view").first()[0] == 99
    finally:
        spark.catalog.dropTempView("orders_view")


@pytest.mark.parametrize("push_filters", ["true", "false"])
def test_a_dataframe_sees_records_appended_after_its_first_action(spark, tmp_path: Path, push_filters: str) -> None:
    data = new_orders(tmp_path / "data", records_per_partition=10)
    df = load(spark, data, pushFilters=push_filters)
    assert df.count() == 30
    produce(data, 0, 10, 10)
    assert df.count() == 40
    produce(data, 2, 10, 5)
    assert df.where("partition = 2").count() == 15
    assert df.count() == 45
    rows = df.select("partition", "offset").collect()
    assert sorted((r.partition, r.offset) for r in rows) == sorted(
        [(0, o) for o in range(20)] + [(1, o) for o in range(10)] + [(2, o) for o in range(15)]
    )


def test_the_next_query_reads_the_topics_and_partitions_a_subscription_gained(spark, tmp_path: Path) -> None:
    data = new_orders(tmp_path / "data", records_per_partition=10)
    df = spark.read.format("seglog").option("path", str(data)).option("subscribePattern", "ord.*").load()
    assert df.count() == 30
    seglogfs("topics", str(data), "create", "--topic", "ordinals", "--partitions", "2")
    seglogfs("produce", str(data), "--topic", "ordinals", "--partition", "1", stdin="one\ntwo\n")
    seglogfs("topics", str(data), "alter", "--topic", "orders", "--partitions", "4")
    produce(data, 3, 0, 5)
    rows = df.select("topic", "partition", "offset").collect()
    assert len(rows) == 37
    assert sorted((r.topic, r.partition, r.offset) for r in rows if r.partition > 2 or r.topic == "ordinals") == [
        ("orders", 3, o) for o in range(5)
    ] + [("ordinals", 1, 0), ("ordinals", 1, 1)]


def test_min_partitions_splits_as_sparks_kafka_source_and_the_tasks_split_the_range_exactly(
    spark, orders: Path
) -> None:
    df = load(spark, orders, minPartitions="10")
    # Spark's Kafka source gives each partition round(its share of minPartitions) tasks, at least
    # one: three partitions of 100 records make round(3.33) = 3 tasks each, 9 in all.
    assert df.rdd.getNumPartitions() == 9
    per_task = df.select("partition", "offset").rdd.glom().map(lambda rows: [(r[0], r[1]) for r in rows]).collect()
    assert len([task for task in per_task if task]) == 9
    together = [row for task in per_task for row in task]
    assert sorted(together) == [(p, o) for p in range(3) for o in range(100)]  # each record once
    for task in per_task:  # each task a run of consecutive offsets of one partition
        assert len({p for p, _ in task}) <= 1
        assert [o for _, o in task] == list(range(task[0][1], task[0][1] + len(task))) if task else True


# -- options refused when the DataFrame is loaded -------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "line"),
    [
        ({"startingOffset": "latest"}, "unknown option startingOffset for seglog: did you mean startingOffsets?"),
        (
            {"kafka.auto.offset.reset": "earliest"},
            "option kafka.auto.offset.reset is not supported by seglog: set startingOffsets to earliest or latest",
        ),
        ({"kafka.bootstrap.servers": "localhost:9092"}, "option kafka.bootstrap.servers is not supported by seglog"),
        ({"kafka.security.protocol": "SSL"}, "option kafka.security.protocol is a Kafka client setting"),
    ],
)
def test_an_option_seglog_does_not_take_is_refused_by_name_at_load(
    spark, orders: Path, options: dict[str, str], line: str
) -> None:
    # (Spark hands a source its option names in lower case)
    with pytest.raises(Exception, match=re.compile(re.escape(line), re.IGNORECASE)):
        load(spark, orders, **options)


def test_options_spark_passes_and_case_variants_are_taken(spark, orders: Path) -> None:
    df = spark.read.format("seglog").option("SUBSCRIBE", "orders").option("endingoffsets", "latest").load(str(orders))
    assert df.count() == 300


@pytest.mark.parametrize(
    ("options", "line"),
    [
        (
            {"startingOffsets": "earlist"},
            "startingOffsets must be earliest, latest or a JSON object of offsets, not 'earlist': "
            "did you mean earliest?",
        ),
        ({"failOnDataLoss": "flase"}, "failOnDataLoss must be true or false, not 'flase': did you mean false?"),
    ],
)
def test_a_bad_value_is_refused_in_one_line_naming_the_option(
    spark, orders: Path, options: dict[str, str], line: str
) -> None:
    with pytest.raises(Exception, match=re.escape(line)):
        load(spark, orders, **options).count()


def test_a_path_that_is_no_directory_is_refused_as_such(spark, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-data-dir"
    with pytest.raises(Exception, match=re.escape(f"path {missing}: no such directory")):
        load(spark, missing).count()


def test_a_task_that_finds_another_data_dir_at_the_path_says_so(spark, tmp_path: Path) -> None:
    """As an executor on a host whose path holds another (here: an empty) data dir: the loaded
    DataFrame's tasks, planned on the driver, meet none of its partitions."""
    data = new_orders(tmp_path / "data", records_per_partition=5)
    df = load(spark, data)
    assert df.count() == 15
    data.rename(tmp_path / "moved")
    data.mkdir()
    with pytest.raises(Exception, match=re.escape(f"or host {socket.gethostname()} sees another data dir at {data}")):
        df.count()


def test_create_table_using_seglog_is_refused_with_the_reason(spark, orders: Path) -> None:
    reason = "CREATE TABLE … USING seglog makes a table Spark cannot read"
    with pytest.raises(Exception, match=re.escape(reason)):
        spark.sql(f"CREATE TABLE orders_table USING seglog OPTIONS (path '{orders}', subscribe 'orders')")
    with pytest.raises(Exception, match=re.escape(reason)):
        spark.sql(f"CREATE TABLE orders_table USING seglog OPTIONS (subscribe 'orders') LOCATION '{orders}'")
    # with a schema Spark asks the source nothing until the table is read
    spark.sql(f"CREATE TABLE orders_typed (key binary) USING seglog OPTIONS (subscribe 'orders') LOCATION '{orders}'")
    try:
        with pytest.raises(Exception, match=re.escape(reason)):
            spark.sql("SELECT count(*) FROM orders_typed").collect()
    finally:
        spark.sql("DROP TABLE orders_typed")
    # what the refusal offers instead reads the data
    spark.sql(f"CREATE TEMPORARY VIEW orders_sql USING seglog OPTIONS (path '{orders}', subscribe 'orders')")
    try:
        assert spark.sql("SELECT count(*) FROM orders_sql").first()[0] == 300
    finally:
        spark.catalog.dropTempView("orders_sql")
