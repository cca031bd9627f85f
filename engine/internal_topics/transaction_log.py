"""The transaction coordinator's records: the `__transaction_state` topic (Kafka's
TransactionLog; schemas TransactionLogKey and TransactionLogValue).

    key    int16 record type (0), TransactionalId string
    value  int16 version (0-1; flexible from 1), ProducerId int64, PreviousProducerId int64
           (tag 0, v1+), NextProducerId int64 (tag 1, v1+), ProducerEpoch int16,
           TransactionTimeoutMs int32, TransactionStatus int8, TransactionPartitions nullable
           [Topic string, PartitionIds [int32]], TransactionLastUpdateTimestampMs int64,
           TransactionStartTimestampMs int64, ClientTransactionVersion int16 (tag 2, v1+)

A null value is a tombstone: the transactional id expired.
"""

from __future__ import annotations

import struct
from typing import Any

from seglogfs.engine.record.messages import Field, Schema, decode, since

TRANSACTION_LOG_KEY_TYPE = 0
TRANSACTION_LOG_KEY = Schema("TransactionLogKey", (Field("TransactionalId", "string"),))
_PARTITIONS = Schema("PartitionsSchema", (Field("Topic", "string"), Field("PartitionIds", "[]int32")), flexible_from=1)
TRANSACTION_LOG_VALUE = Schema(
    "TransactionLogValue",
    (
        Field("ProducerId", "int64"),
        Field("PreviousProducerId", "int64", since(1), tag=0),
        Field("NextProducerId", "int64", since(1), tag=1),
        Field("ProducerEpoch", "int16"),
        Field("TransactionTimeoutMs", "int32"),
        Field("TransactionStatus", "int8"),
        Field("TransactionPartitions", _PARTITIONS, nullable=since(0), array=True),
        Field("TransactionLastUpdateTimestampMs", "int64"),
        Field("TransactionStartTimestampMs", "int64"),
        Field("ClientTransactionVersion", "int16", since(1), tag=2),
    ),
    flexible_from=1,
)
TRANSACTION_LOG_VALUE_VERSIONS = range(2)

# A transaction's state by its TransactionStatus id (Kafka's TransactionState and its names).
TRANSACTION_STATES = (
    "Empty",
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "CompleteCommit",
    "CompleteAbort",
    "Dead",
    "PrepareEpochFence",
)


def transaction_state_name(status: int) -> str:
    """A TransactionStatus as Kafka's tools print it: the state's name, or the id when no state
    has it."""
    return TRANSACTION_STATES[status] if 0 <= status < len(TRANSACTION_STATES) else str(status)


def decode_transaction_log_key(key: bytes) -> tuple[int, dict[str, Any]] | None:
    """(record type, fields) of a TransactionLogKey; None for another record type."""
    if len(key) < 2:
        raise ValueError(f"key of {len(key)} bytes has no record type")
    kind = int(struct.unpack_from(">h", key)[0])
    if kind != TRANSACTION_LOG_KEY_TYPE:
        return None
    return kind, decode(key, TRANSACTION_LOG_KEY, 0, 2)


def decode_transaction_log_value(value: bytes) -> tuple[int, dict[str, Any]]:
    """(version, fields) of a TransactionLogValue; ValueError for an unknown version."""
    if len(value) < 2:
        raise ValueError(f"value of {len(value)} bytes has no version")
    version = int(struct.unpack_from(">h", value)[0])
    if version not in TRANSACTION_LOG_VALUE_VERSIONS:
        raise ValueError(f"TransactionLogValue version {version} is unknown (known: 0-1)")
    return version, decode(value, TRANSACTION_LOG_VALUE, version, 2)
