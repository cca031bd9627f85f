"""The README's example pipeline (`examples/hourly_counts.py`): a topic to hourly per-key counts
in Parquet, as a batch job and as a streaming query, equal to the counts computed here from the
records (the streaming query writes only the hours its watermark, an hour behind the newest
record, has passed)."""

from __future__ import annotations

import importlib.util
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote

import pyarrow.parquet as pq

from seglogfs.engine import BrokerConfig, DataDir

HOUR_MS = 3_600_000
T0 = 1_763_798_400_000  # 2025-11-22T08:00:00Z, on the hour
LAST_TIMESTAMP = T0 + 185 * 97_000 + 13_000
REPOSITORY = Path(__file__).resolve().parents[2]


def example():
    spec = importlib.util.spec_from_file_location("hourly_counts", REPOSITORY / "examples" / "hourly_counts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(path: Path) -> Counter:
    """Records over five hours and two partitions, keys a, b, c; returns the counts per
    (hour start ms, key)."""
    counts: Counter = Counter()
    config = BrokerConfig.load(overrides=["log.segment.bytes=4000"], log_dirs=[path])
    with DataDir.open(config, now_ms=int(time.time() * 1000)) as data_dir:
        data_dir.create_topic("orders", 2, now_ms=int(time.time() * 1000))
        for partition in (0, 1):
            log = data_dir.partition("orders", partition)
            stamps = [T0 + i * 97_000 + partition * 13_000 for i in range(186)]  # five hours
            keys = [b"abc"[(i + partition) % 3 : (i + partition) % 3 + 1] for i in range(len(stamps))]
            log.append_records([b"x"] * len(stamps), keys=keys, timestamps=stamps, now_ms=int(time.time() * 1000))
            counts.update(((s - s % HOUR_MS), k.decode()) for s, k in zip(stamps, keys, strict=True))
    return counts


def hour_ms(hour: object) -> int:
    """An hour as Parquet gives it back: a timestamp column, or a partition directory's name."""
    if isinstance(hour, str):
        hour = datetime.fromisoformat(unquote(hour)).replace(tzinfo=UTC)
    assert isinstance(hour, datetime)
    return int(hour.timestamp() * 1000)


def parquet_counts(out: Path) -> Counter:
    return Counter({(hour_ms(row["hour"]), row["key"]): row["count"] for row in pq.read_table(out).to_pylist()})


def test_the_example_pipeline_batch_and_streaming(spark, tmp_path: Path) -> None:
    data = tmp_path / "data"
    counts = build(data)
    hourly = example()
    hourly.batch(spark, str(data), "orders", str(tmp_path / "batch"))
    assert parquet_counts(tmp_path / "batch") == counts
    hourly.stream(
        spark, str(data), "orders", str(tmp_path / "stream"), str(tmp_path / "checkpoint"), available_now=True
    )
    watermark = LAST_TIMESTAMP - HOUR_MS  # an hour's counts are out once the watermark passed its end
    assert parquet_counts(tmp_path / "stream") == Counter(
        {(hour, key): n for (hour, key), n in counts.items() if hour + HOUR_MS <= watermark}
    )
