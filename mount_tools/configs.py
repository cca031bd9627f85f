"""`seglogfs config show`: every effective setting and where its value comes from (what
kafka-configs --describe --all shows of a broker or a topic, with seglogfs's layers).

    seglogfs config show DATADIR [--topic T] [-c server.properties] [--override k=v ...] [--json]

Without `--topic`: the broker's settings, `log.dirs`, the broker-only ones (`num.partitions`, …)
and each topic default under its broker name (`log.retention.ms`, even when `log.retention.hours`
set it). With `--topic`: the topic's, under the topic-level names. One line per setting,

    name=value<spaces>source (detail)

the source being one of `default`, `server.properties` (the -c file: its path:line and the name
set there), `--override`, `metadata-log` (a KRaft broker's dynamic broker config or topic
config), `internal-topic` (what Kafka creates __consumer_offsets and __transaction_state with),
`topic-override` (the seglogfs overrides: `topics alter --config`, the mount's `config` file),
`cleanup-off` (retention and compaction off: `__cluster_metadata`, or a topic whose broker
configs are unknown; the value, an empty list, is shown as `(none)`, and the detail says why and
what sets a policy), `DATADIR`. `--json` prints `{"topic": T or null, "configs": [{"name",
"value", "source", "detail"}]}`. The data dir is opened read-only (no lock).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

from seglogfs.engine import DataDir
from seglogfs.engine.object_store import is_object_store_uri, parse_location
from seglogfs.engine.stored.local_copy import Partitions
from seglogfs.mount_tools.common import EPILOG, EXIT_OK, add_common, broker_config, now_ms, print_json

ACTIONS = ("show",)
EMPTY_VALUE = "(none)"
_ALIGN_MAX = 48  # values are padded to one column up to this width; longer ones stand out


def add_parser(commands: Any) -> None:
    """`config` and its action, on the CLI's subcommands."""
    config = commands.add_parser(
        "config", help="show effective configs and where they come from (kafka-configs)", epilog=EPILOG
    )
    actions = config.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = actions.add_parser(
        "show", help="every effective setting of the broker or a topic, with its source", epilog=EPILOG
    )
    add_common(show)
    show.add_argument("--topic", help="the topic's settings (default: the broker's)")
    show.add_argument("--json", action="store_true", help="one JSON document")
    show.set_defaults(handler=cmd_show)


def cmd_show(args: argparse.Namespace) -> int:
    # (of a backup in object storage, the topic's partitions, or none for the broker's settings)
    wanted = Partitions(topics=frozenset([args.topic])) if args.topic is not None else Partitions()
    config = broker_config(args, stored=True, partitions=wanted)
    with DataDir.open(config, read_only=True, now_ms=now_ms()) as data_dir:
        entries = data_dir.config_entries(args.topic)
    if is_object_store_uri(args.datadir):  # (the backup's log dirs are where they are, not its local copy)
        shown = parse_location(args.datadir).display
        entries = [replace(e, value=shown) if e.name == "log.dirs" else e for e in entries]
    if args.json:
        print_json(
            {
                "topic": args.topic,
                "configs": [
                    {"name": e.name, "value": e.value, "source": e.source, "detail": e.detail} for e in entries
                ],
            }
        )
        return EXIT_OK
    # An empty value (cleanup.policy with retention and compaction off) is shown as `(none)`: a
    # blank would let the source column read as the value.
    settings = [f"{e.name}={e.value or EMPTY_VALUE}" for e in entries]
    width = min(max(map(len, settings), default=0), _ALIGN_MAX)
    lines = [
        f"{setting:<{width}}  {e.source}" + (f" ({e.detail})" if e.detail else "")
        for setting, e in zip(settings, entries, strict=True)
    ]
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    return EXIT_OK
