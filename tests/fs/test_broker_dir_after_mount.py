"""What a writable mount changes in a broker's data dir. Every broker data dir of
`tests/fixtures/kafka` is copied, listed (every file's name, size and content hash), mounted
writable, given one record through a partition's `append.jsonl`, unmounted, and listed again:
each file added, changed or removed must be one the README's list ("A broker's data dir after a
writable mount") names for that kind of change, and the list must be the one below (so neither
drifts without the other). The appended batch carries the partition's leader epoch, the
clean-shutdown file the broker epoch it had."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from seglogfs.engine.log.checkpoint import CLEAN_SHUTDOWN_FILE, LEADER_EPOCH_CHECKPOINT, read_leader_epochs
from tests.conftest import REPO, kafka_fixtures
from tests.engine.test_fixtures import _is_partition_dir
from tests.fs.conftest import Mount

SEGLOGFS = [sys.executable, "-m", "seglogfs.mount_tools.cli"]
SECTION = "### A broker's data dir after a writable mount"

# The README's list: each path pattern and the changes it allows. `<topic>-<partition>` is a
# partition dir, `<offset>` a segment's 20-digit base offset.
ALLOWED: dict[str, frozenset[str]] = {
    ".lock": frozenset({"added"}),
    ".kafka_cleanshutdown": frozenset({"added", "changed", "removed"}),
    "recovery-point-offset-checkpoint": frozenset({"added", "changed"}),
    "replication-offset-checkpoint": frozenset({"added", "changed"}),
    "log-start-offset-checkpoint": frozenset({"added", "changed"}),
    "cleaner-offset-checkpoint": frozenset({"added", "changed"}),
    "<topic>-<partition>/<offset>.log": frozenset({"added", "changed"}),
    "<topic>-<partition>/<offset>.index": frozenset({"added", "changed"}),
    "<topic>-<partition>/<offset>.timeindex": frozenset({"added", "changed"}),
    "<topic>-<partition>/<offset>.txnindex": frozenset({"added", "changed"}),
    "<topic>-<partition>/leader-epoch-checkpoint": frozenset({"added", "changed"}),
}
# What one append never rewrites (a missing one is made, as Kafka makes it): a file rewritten for
# nothing is a change the broker did not need.
UNCHANGED_BY_AN_APPEND = (
    "log-start-offset-checkpoint",
    "cleaner-offset-checkpoint",
    "<topic>-<partition>/<offset>.txnindex",
)
# What one append shows in at least one of the fixtures (the rest follows from other work:
# compaction, retention, transactions, a failed unmount).
SEEN: set[tuple[str, str]] = {
    (".lock", "added"),
    (".kafka_cleanshutdown", "added"),
    ("recovery-point-offset-checkpoint", "added"),
    ("recovery-point-offset-checkpoint", "changed"),
    ("replication-offset-checkpoint", "changed"),
    ("<topic>-<partition>/<offset>.log", "added"),
    ("<topic>-<partition>/<offset>.log", "changed"),
    ("<topic>-<partition>/<offset>.index", "added"),
    ("<topic>-<partition>/<offset>.timeindex", "added"),
    ("<topic>-<partition>/leader-epoch-checkpoint", "added"),
}


def broker_data_dirs() -> list[Path]:
    """Every fixture folder holding partition dirs: every broker data dir, legacy ones included
    (`kafka-go-fetch-fixtures` holds captured fetch responses, no log dir)."""
    return sorted(d for d in kafka_fixtures().iterdir() if d.is_dir() and any(map(_is_partition_dir, d.iterdir())))


BROKER_DATA_DIRS = broker_data_dirs()


def readme_list() -> dict[str, frozenset[str]]:
    """The README section's bullets: `pattern`, `pattern` (kinds): ..."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert SECTION in text, f"README.md has no section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n#", 1)[0]
    items: dict[str, frozenset[str]] = {}
    for bullet in re.findall(r"^- (.*?)(?=^- |^\n|\Z)", section, re.M | re.S):
        names, kinds = re.match(r"((?:`[^`]+`,?\s*)+)\(([a-z, \n]+)\)", bullet).groups()
        for name in re.findall(r"`([^`]+)`", names):
            items[name] = frozenset(kind.strip() for kind in kinds.split(","))
    return items


def pattern_regex(pattern: str) -> re.Pattern[str]:
    regex = re.escape(pattern).replace(re.escape("<topic>-<partition>"), r"[^/]+-[0-9]+")
    return re.compile(regex.replace(re.escape("<offset>"), r"[0-9]{20}") + r"\Z")


def listing(data: Path) -> dict[str, tuple[int | None, str]]:
    """Every file and directory below `data`: (size, sha-256) of files, (None, "dir") of dirs."""
    found: dict[str, tuple[int | None, str]] = {}
    for root, dirs, files in os.walk(data):
        for name in dirs:
            found[(Path(root) / name).relative_to(data).as_posix()] = (None, "dir")
        for name in files:
            path = Path(root) / name
            content = path.read_bytes()
            found[path.relative_to(data).as_posix()] = (len(content), hashlib.sha256(content).hexdigest())
    return found


def changes(before: dict, after: dict) -> list[tuple[str, str]]:
    out = [(name, "removed") for name in before.keys() - after.keys()]
    out += [(name, "added") for name in after.keys() - before.keys()]
    out += [(name, "changed") for name in before.keys() & after.keys() if before[name] != after[name]]
    return sorted(out)


def the_partition(data: Path) -> Path:
    """The first partition dir of a topic that is not internal (Kafka's `__` topics)."""
    return next(p for p in sorted(data.iterdir()) if _is_partition_dir(p) and not p.name.startswith("__"))


def test_the_readme_lists_what_the_test_allows() -> None:
    assert readme_list() == ALLOWED


@pytest.mark.expect_warnings("retention and compaction are off for .* topics whose broker configs are unknown")
def test_a_writable_mount_and_an_append_change_only_what_the_readme_lists(mount, tmp_path: Path) -> None:
    assert {d.name for d in BROKER_DATA_DIRS} >= {"experts-kafka-data", "spooldir-cp512", "kafkalite-magic0"}
    regexes = {pattern: pattern_regex(pattern) for pattern in ALLOWED}
    seen: set[tuple[str, str]] = set()
    refused: list[str] = []
    for fixture in BROKER_DATA_DIRS:
        data = tmp_path / fixture.name
        shutil.copytree(fixture, data, symlinks=True)
        before = listing(data)
        marker = (data / CLEAN_SHUTDOWN_FILE).read_bytes() if (data / CLEAN_SHUTDOWN_FILE).exists() else None
        partition_dir = the_partition(data)
        topic, _, partition = partition_dir.name.rpartition("-")
        checkpoint = partition_dir / LEADER_EPOCH_CHECKPOINT
        entries = read_leader_epochs(checkpoint) if checkpoint.exists() else []
        m: Mount = mount(data, "-o", "measure=lazy")
        record = {"key": "k", "value": f"one record for {fixture.name}"}
        (m.path / topic / partition / "append.jsonl").write_text(json.dumps(record) + "\n")
        done = subprocess.run([*SEGLOGFS, "umount", str(m.path)], check=False, cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        m.process.wait(timeout=60)

        for name, kind in changes(before, listing(data)):
            allowing = [pattern for pattern, regex in regexes.items() if regex.match(name)]
            if not any(kind in ALLOWED[pattern] for pattern in allowing):
                refused.append(f"{fixture.name}: {name} {kind}")
            if kind != "added" and any(pattern in UNCHANGED_BY_AN_APPEND for pattern in allowing):
                refused.append(f"{fixture.name}: {name} {kind}, for nothing")
            seen.update((pattern, kind) for pattern in allowing)
        # The root checkpoints name the partitions Kafka's LogManager loads: not the metadata log.
        for name in ("recovery-point-offset-checkpoint", "replication-offset-checkpoint"):
            assert "__cluster_metadata" not in (data / name).read_text(), (fixture.name, name)
        # The clean-shutdown file as a broker wrote it, its epoch kept; none: an empty one.
        assert (data / CLEAN_SHUTDOWN_FILE).read_bytes() == (marker or b""), fixture.name
        # The appended batch carries the partition's leader epoch (0 where it has none).
        last_log = sorted(partition_dir.glob("*.log"))[-1]
        dumped = subprocess.run(
            [*SEGLOGFS, "dump", str(last_log)], check=False, cwd=REPO, capture_output=True, text=True
        )
        assert dumped.returncode == 0, dumped.stderr
        batch = dumped.stdout.splitlines()[-1]
        assert " count: 1 " in batch, batch
        assert f" partitionLeaderEpoch: {entries[-1][0] if entries else 0} " in batch, (fixture.name, batch)
    assert not refused, "changed but not in the README's list:\n" + "\n".join(refused)
    assert seen >= SEEN, f"listed but never seen: {sorted(SEEN - seen)}"
