"""Spark's pushed filters → `Constraints` the planner answers exactly.

Not used by the batch reader today: Spark 4.3 answers a loaded DataFrame's later queries that
push no filter from the plan made with an earlier query's pushed filters, so the reader pushes
none (see `source.PushdownSeglogReader`). Kept for a Spark that plans each scan on its own.

Pushed (ANDed, each answered exactly, so Spark does not evaluate them again):

* `topic` = / IN (strings): only those topics are planned;
* `partition` = / IN / > / >= / < / <= (integers): only those partitions;
* `offset` = / IN / > / >= / < / <= (integers): the offset ranges shrink; IN is also checked
  per record;
* `timestamp` = / > / >= / < / <= (timestamps): a lower bound starts each partition at its first
  offset whose record reaches it (time index, offset index) and skips segments and batches whose
  largest timestamp is below it; every bound is also checked per record, since record
  timestamps need not rise with offsets;
* IS NOT NULL on any of those columns (they are never null).

Anything else (NOT, OR, other columns, other value types) goes back to Spark. A timestamp filter
compares microseconds; records carry milliseconds: `timestamp >= X` holds for a record of `t` ms
exactly when `t * 1000 >= X`, which the bounds below keep in whole milliseconds.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence

from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
)

from seglogfs.pipeline.planning import Constraints

_NEVER_NULL = frozenset({"topic", "partition", "offset", "timestamp", "timestampType"})
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_INT64_MAX = 2**63 - 1


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _micros(value: object) -> int | None:
    """A timestamp literal in epoch microseconds; None unless an aware datetime."""
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        return None
    return (value - _EPOCH) // dt.timedelta(microseconds=1)


def _floor_ms(micros: int) -> int:
    return micros // 1000


def _ceil_ms(micros: int) -> int:
    return -((-micros) // 1000)


def _integer_bounds(flt: Filter) -> tuple[int | None, int | None] | None:
    """[lo, hi) for a comparison with an integer; None when not one."""
    value = getattr(flt, "value", None)
    if not _is_int(value):
        return None
    assert isinstance(value, int)
    if isinstance(flt, EqualTo | EqualNullSafe):
        return value, value + 1
    if isinstance(flt, GreaterThan):
        return value + 1, None
    if isinstance(flt, GreaterThanOrEqual):
        return value, None
    if isinstance(flt, LessThan):
        return None, value
    if isinstance(flt, LessThanOrEqual):
        return None, value + 1
    return None


def _integers(values: Sequence[object]) -> frozenset[int] | None:
    """The integers of an IN list (nulls never match); None when another type is there."""
    present = [v for v in values if v is not None]
    if not all(_is_int(v) for v in present):
        return None
    return frozenset(v for v in present if isinstance(v, int))


def constraint_for(flt: Filter) -> Constraints | None:
    """The constraint a filter sets, or None when it is not answered here."""
    attribute: tuple[str, ...] = getattr(flt, "attribute", ())
    if len(attribute) != 1:
        return None
    column = attribute[0]
    if isinstance(flt, IsNotNull):
        return Constraints() if column in _NEVER_NULL else None
    if column == "topic":
        if isinstance(flt, EqualTo | EqualNullSafe) and isinstance(flt.value, str):
            return Constraints(topics=frozenset({flt.value}))
        if isinstance(flt, In) and all(isinstance(v, str) or v is None for v in flt.value):
            return Constraints(topics=frozenset(v for v in flt.value if isinstance(v, str)))
        return None
    if column in ("partition", "offset"):
        if isinstance(flt, In):
            members = _integers(flt.value)
            if members is None:
                return None
            return Constraints(partitions=members) if column == "partition" else Constraints(offsets_in=members)
        bounds = _integer_bounds(flt)
        if bounds is None:
            return None
        lo, hi = bounds
        if column == "partition":
            return Constraints(partition_lo=lo, partition_hi=hi)
        return Constraints(offset_lo=lo, offset_hi=hi)
    if column == "timestamp":
        micros = _micros(getattr(flt, "value", None))
        if micros is None:
            return None
        if isinstance(flt, EqualTo | EqualNullSafe):
            if micros % 1000:
                return Constraints(timestamp_lo_ms=0, timestamp_hi_ms=0)  # no record has that time
            return Constraints(timestamp_lo_ms=micros // 1000, timestamp_hi_ms=micros // 1000 + 1)
        if isinstance(flt, GreaterThanOrEqual):
            return Constraints(timestamp_lo_ms=_ceil_ms(micros))
        if isinstance(flt, GreaterThan):
            return Constraints(timestamp_lo_ms=_floor_ms(micros) + 1)
        if isinstance(flt, LessThan):
            return Constraints(timestamp_hi_ms=_ceil_ms(micros))
        if isinstance(flt, LessThanOrEqual):
            return Constraints(timestamp_hi_ms=_floor_ms(micros) + 1)
    return None


def push_filters(filters: Iterable[Filter]) -> tuple[Constraints, list[Filter]]:
    """The constraints of the filters answered here, and the others (the same objects, as
    Spark requires), in their order."""
    constraints = Constraints()
    rest: list[Filter] = []
    for flt in filters:
        constraint = constraint_for(flt)
        if constraint is None:
            rest.append(flt)
        else:
            constraints = constraints.also(constraint)
    return constraints, rest
