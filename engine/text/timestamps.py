"""Times given as text: epoch milliseconds or ISO-8601, as `--timestamp`, `by-time/T` and a JSON
record's `timestamp` take them."""

from __future__ import annotations

from datetime import UTC, datetime

from seglogfs.engine.errors import TimestampParseError

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def parse_timestamp(text: str) -> int:
    """Epoch milliseconds, or ISO-8601 (`2026-11-22T10:00:00Z`, `2026-11-22T10:00:00.5+01:00`,
    `2026-11-22`); a time without a zone is UTC. Raises TimestampParseError, also for a time
    that is no int64 of milliseconds (Kafka's timestamps are longs)."""
    stripped = text.strip()
    digits = stripped.removeprefix("-")
    if digits.isascii() and digits.isdigit():  # "²" is a digit to str.isdigit, not to int()
        value = int(stripped)
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise TimestampParseError(f"timestamp {text!r} is out of range (epoch milliseconds as a 64-bit integer)")
        return value
    try:
        moment = datetime.fromisoformat(stripped)
    except ValueError:
        raise TimestampParseError(
            f"timestamp {text!r} is neither epoch milliseconds nor ISO-8601 (e.g. 2026-11-22T10:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)
