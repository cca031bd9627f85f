"""`seglogfs groups`: kafka-consumer-groups for a data dir, read from its `__consumer_offsets`.

    seglogfs groups list DATADIR
    seglogfs groups describe DATADIR [--group G] [--json]

DATADIR is one log dir or several separated by commas (`log.dirs`), as for every command; every
`__consumer_offsets-N` partition in them is replayed (engine.internal_topics.consumer_offsets): nothing is
changed and no lock is taken, so it works beside a running broker or a mount.

`list` prints group ids, one a line, sorted (kafka-consumer-groups --list). `describe` prints,
per group, kafka-consumer-groups --describe's table after an empty line:

    GROUP  TOPIC  PARTITION  CURRENT-OFFSET  LOG-END-OFFSET  LAG  CONSUMER-ID  HOST  CLIENT-ID

one row per partition with a committed offset or assigned to a member, sorted by topic and
partition, columns padded as that tool pads them. LOG-END-OFFSET is the data dir's own
partition's when it holds that topic-partition, else `-` (and LAG `-`); CONSUMER-ID, HOST and
CLIENT-ID are the member the partition is assigned to (protocol type `consumer`), else `-`. A
group without members gets kafka-consumer-groups' note on stderr ("Consumer group 'G' has no
active members."). `--json` prints one document (keys in `describe_document`).

Bad data: a record of a type not read here (KIP-848 and share group records) is skipped with a
warning line on stderr naming the file and offset, as the broker's loader skips it; a record
that does not decode, or a corrupt batch, stops the command with one line naming the file and
offset (exit 1). A data dir without `__consumer_offsets` partitions is exit 1 with one line; an
unknown `--group` too. Exit codes are the CLI's (`seglogfs --help`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from seglogfs.engine import DataDir, UnknownTopicOrPartitionError
from seglogfs.engine.config import CONSUMER_OFFSETS_TOPIC
from seglogfs.engine.internal_topics.consumer_offsets import (
    ConsumerGroup,
    GroupCoordinatorState,
    GroupIdNotFoundError,
    GroupMember,
    read_consumer_groups,
)
from seglogfs.engine.object_store import is_object_store_uri
from seglogfs.engine.stored.local_copy import EVERY_PARTITION, Partitions
from seglogfs.mount_tools.common import (
    EPILOG,
    EXIT_OK,
    add_common,
    broker_config,
    now_ms,
    print_json,
    require_data_dirs,
)

ACTIONS = ("list", "describe")
_HEADERS = (
    "GROUP",
    "TOPIC",
    "PARTITION",
    "CURRENT-OFFSET",
    "LOG-END-OFFSET",
    "LAG",
    "CONSUMER-ID",
    "HOST",
    "CLIENT-ID",
)
_MISSING = "-"


def add_parser(commands: Any) -> None:
    """`groups` and its actions, on the CLI's subcommands."""
    groups = commands.add_parser(
        "groups", help="list and describe consumer groups (kafka-consumer-groups)", epilog=EPILOG
    )
    actions = groups.add_subparsers(dest="action", required=True, metavar="ACTION")

    listing = actions.add_parser("list", help="print group ids, one a line", epilog=EPILOG)
    add_common(listing)
    listing.set_defaults(handler=cmd_list)

    describe = actions.add_parser(
        "describe", help="print groups' offsets, lag and members (kafka-consumer-groups --describe)", epilog=EPILOG
    )
    add_common(describe)
    describe.add_argument("--group", metavar="G", help="only this group (default: all)")
    describe.add_argument("--json", action="store_true", help="one JSON document")
    describe.set_defaults(handler=cmd_describe)


def _open(args: argparse.Namespace, partitions: Partitions = EVERY_PARTITION) -> DataDir:
    """The data dir named, opened read-only (no lock, nothing written); an error when it does
    not exist. Of a backup in object storage, `partitions` are laid out."""
    config = broker_config(args, stored=True, partitions=partitions)
    require_data_dirs(config)
    return DataDir.open(config, read_only=True, now_ms=now_ms())


def _state(data_dir: DataDir) -> GroupCoordinatorState:
    """The groups the data dir's offsets topic holds; warnings to stderr. An error when no dir
    holds `__consumer_offsets`."""
    partitions = data_dir.topics().get(CONSUMER_OFFSETS_TOPIC, ())
    state = read_consumer_groups({p: data_dir.partition(CONSUMER_OFFSETS_TOPIC, p) for p in partitions})
    if not state.partitions:
        where = ", ".join(str(d) for d in data_dir.config.log_dirs)
        raise UnknownTopicOrPartitionError(
            f"{where}: no {CONSUMER_OFFSETS_TOPIC} partitions (no consumer group has committed offsets here)"
        )
    for warning in state.warnings:
        print(f"seglogfs: warning: {warning}", file=sys.stderr)
    return state


def cmd_list(args: argparse.Namespace) -> int:
    with _open(args, Partitions(topics=frozenset([CONSUMER_OFFSETS_TOPIC]))) as data_dir:
        state = _state(data_dir)
    sys.stdout.write("".join(f"{group_id}\n" for group_id in state.groups))
    return EXIT_OK


def _log_end_offsets(data_dir: DataDir, wanted: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """The log end offsets of the wanted topic-partitions the data dir holds."""
    held = data_dir.topics()
    return {(t, p): data_dir.partition(t, p).log_end_offset for t, p in wanted if p in held.get(t, ())}


def _rows(group: ConsumerGroup, log_end_offsets: dict[tuple[str, int], int]) -> list[dict[str, Any]]:
    owners: dict[tuple[str, int], GroupMember] = {}
    if group.metadata is not None:
        for assigned in group.metadata.members:
            for topic_partition in assigned.assigned_partitions:
                owners[topic_partition] = assigned
    rows = []
    for topic, partition in sorted(set(group.offsets) | set(owners)):
        commit = group.offsets.get((topic, partition))
        member = owners.get((topic, partition))
        current = None if commit is None else commit.offset
        end = log_end_offsets.get((topic, partition))
        rows.append(
            {
                "topic": topic,
                "partition": partition,
                "currentOffset": current,
                "logEndOffset": end,
                "lag": None if current is None or end is None else end - current,
                "leaderEpoch": None if commit is None else commit.leader_epoch,
                "metadata": None if commit is None else commit.metadata,
                "commitTimestamp": None if commit is None else commit.commit_timestamp,
                "expireTimestamp": None if commit is None else commit.expire_timestamp,
                "consumerId": None if member is None else member.member_id,
                "host": None if member is None else member.client_host,
                "clientId": None if member is None else member.client_id,
            }
        )
    return rows


def describe_document(
    state: GroupCoordinatorState, groups: list[str], log_end_offsets: dict[tuple[str, int], int]
) -> dict[str, Any]:
    """`describe --json`: `{"groups": [{"group", "state" (Stable or Empty), "protocolType",
    "protocol", "generation", "leader", "currentStateTimestamp" (null without group metadata),
    "members": [{"memberId", "groupInstanceId", "clientId", "clientHost", "rebalanceTimeoutMs",
    "sessionTimeoutMs", "assignment": [{"topic", "partition"}]}], "offsets": [{"topic",
    "partition", "currentOffset", "logEndOffset", "lag", "leaderEpoch", "metadata",
    "commitTimestamp", "expireTimestamp", "consumerId", "host", "clientId"}]}]}`; null where
    the table shows `-`."""
    described = []
    for group_id in groups:
        group = state.groups[group_id]
        metadata = group.metadata
        described.append(
            {
                "group": group_id,
                "state": group.state,
                "protocolType": None if metadata is None else metadata.protocol_type,
                "protocol": None if metadata is None else metadata.protocol,
                "generation": None if metadata is None else metadata.generation,
                "leader": None if metadata is None else metadata.leader,
                "currentStateTimestamp": None if metadata is None else metadata.current_state_timestamp,
                "members": [
                    {
                        "memberId": m.member_id,
                        "groupInstanceId": m.group_instance_id,
                        "clientId": m.client_id,
                        "clientHost": m.client_host,
                        "rebalanceTimeoutMs": m.rebalance_timeout_ms,
                        "sessionTimeoutMs": m.session_timeout_ms,
                        "assignment": [{"topic": t, "partition": p} for t, p in m.assigned_partitions],
                    }
                    for m in (() if metadata is None else metadata.members)
                ],
                "offsets": _rows(group, log_end_offsets),
            }
        )
    return {"groups": described}


def _cell(value: object) -> str:
    return _MISSING if value is None else str(value)


def _table(group_id: str, rows: list[dict[str, Any]]) -> list[str]:
    """kafka-consumer-groups' table: GROUP, TOPIC, CONSUMER-ID and HOST as wide as their
    longest value, PARTITION 10 and the offsets 15 characters, one space between columns."""
    cells = [
        (
            group_id,
            r["topic"],
            _cell(r["partition"]),
            _cell(r["currentOffset"]),
            _cell(r["logEndOffset"]),
            _cell(r["lag"]),
            _cell(r["consumerId"]),
            _cell(r["host"]),
            _cell(r["clientId"]),
        )
        for r in rows
    ]
    widths = [max(len(_HEADERS[i]), *(len(c[i]) for c in cells)) for i in (0, 1, 6, 7)]
    group_w, topic_w, consumer_w, host_w = widths

    def line(c: tuple[str, ...]) -> str:
        return (
            f"{c[0]:<{group_w}} {c[1]:<{topic_w}} {c[2]:<10} {c[3]:<15} {c[4]:<15} {c[5]:<15} "
            f"{c[6]:<{consumer_w}} {c[7]:<{host_w}} {c[8]}"
        )

    return [line(_HEADERS), *(line(c) for c in cells)]


def cmd_describe(args: argparse.Namespace) -> int:
    # Of a backup in object storage: the offsets topic's partitions first, then those the groups
    # read (their log ends), and no other's.
    stored = is_object_store_uri(args.datadir)
    with _open(args, Partitions(topics=frozenset([CONSUMER_OFFSETS_TOPIC])) if stored else EVERY_PARTITION) as data_dir:
        state = _state(data_dir)
        if args.group is not None:
            if args.group not in state.groups:
                raise GroupIdNotFoundError(f"Consumer group '{args.group}' does not exist.")
            groups = [args.group]
        else:
            groups = list(state.groups)
        wanted = {partition for group_id in groups for partition in state.groups[group_id].offsets}
        for group_id in groups:
            metadata = state.groups[group_id].metadata
            for member in () if metadata is None else metadata.members:
                wanted.update(member.assigned_partitions)
        if not stored:
            log_ends = _log_end_offsets(data_dir, wanted)
    if stored:
        with _open(args, Partitions(partitions=frozenset(wanted))) as data_dir:
            log_ends = _log_end_offsets(data_dir, wanted)
    document = describe_document(state, groups, log_ends)
    if args.json:
        print_json(document)
        return EXIT_OK
    for group in document["groups"]:
        if not group["members"]:
            sys.stdout.flush()  # the note comes before its table, as the tool prints it
            print(f"\nConsumer group '{group['group']}' has no active members.", file=sys.stderr)
        if not group["offsets"]:
            continue
        sys.stdout.write("\n" + "".join(f"{line}\n" for line in _table(group["group"], group["offsets"])))
    return EXIT_OK
