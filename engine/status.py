"""A partition's status document: its offsets, its segments and its effective config, as the
mount's `status` file and `seglogfs` scripts show it (JSON, Kafka's camelCase names as
kafka-log-dirs --describe and the admin API use them)."""

from __future__ import annotations

import json
from typing import Any

from seglogfs.engine.log.log import PartitionLog


def partition_status(log: PartitionLog) -> dict[str, Any]:
    """The document of one partition, read under no lock: each figure is as it was when read.
    An offline partition's document says why (`offline`) and lists what it can."""
    return {
        "topic": log.topic,
        "partition": log.partition,
        "logStartOffset": log.log_start_offset,
        "logEndOffset": log.log_end_offset,
        "highWatermark": log.high_watermark,
        "recoveryPoint": log.recovery_point,
        "sizeInBytes": log.size_in_bytes(),
        "offline": log.offline_reason,  # why the partition was taken offline, or null
        "segments": [
            {
                "baseOffset": segment.base_offset,
                "bytes": segment.size,
                "maxTimestamp": segment.max_timestamp_so_far.timestamp,
            }
            for segment in log.segments
        ],
        "config": log.config.as_properties(),
    }


def status_json(log: PartitionLog, extra: dict[str, Any] | None = None) -> bytes:
    """`partition_status` (and `extra` fields) as indented JSON with a final newline."""
    return (json.dumps({**partition_status(log), **(extra or {})}, indent=2) + "\n").encode()
