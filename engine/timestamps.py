"""Times given as text: epoch milliseconds or ISO-8601, as `--timestamp`, `by-time/T` and a JSON
record's `timestamp` take them."""

from __future__ import annotations

from datetime import UTC, datetime

from seglogfs.engine.errors import TimestampParseError


def parse_timestamp(text: str) -> int:
    """Epoch milliseconds, or ISO-8601 (`2026-11-22T10:00:00Z`, `2026-11-22T10:00:00.5+01:00`,
    `2026-11-22`); a time without a zone is UTC. Raises TimestampParseError."""
    stripped = text.strip()
    if stripped.lstrip("-").isdigit():
        return int(stripped)
    try:
        moment = datetime.fromisoformat(stripped)
    except ValueError:
        raise TimestampParseError(
            f"timestamp {text!r} is neither epoch milliseconds nor ISO-8601 (e.g. 2026-11-22T10:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)
