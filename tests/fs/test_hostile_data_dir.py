"""A mount of a data dir holding a link, a FIFO and a directory named like a segment (each in a
partition of its own, beside healthy ones): it mounts at once, those partitions answer EIO
naming the path, the others are served, and `.logdir` shows a link as a link (its target's name,
never its content), whatever name is looked up. Read-only and writable alike."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_hostile_data_dir import SECRET, SEGMENT, make_hostile
from tests.fs.conftest import REFUSED, Mount

WALK_S = 5  # every read of the whole tree together answers within this

# Reads every file of the tree below argv[1] (links not followed), one JSON line each: the
# path, the bytes read or the errno, and the seconds the read took.
WALKER = r"""
import json, os, sys, time
root = sys.argv[1]
for directory, dirs, files in os.walk(root):
    for name in sorted(files):
        path = os.path.join(directory, name)
        started = time.monotonic()
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                data = b""
                while chunk := os.read(fd, 1 << 20):
                    data += chunk
                answer = {"bytes": data.decode("utf-8", "replace")}
            finally:
                os.close(fd)
        except OSError as error:
            answer = {"errno": error.errno}
        answer.update(path=os.path.relpath(path, root), seconds=time.monotonic() - started)
        print(json.dumps(answer), flush=True)
"""


def walk(root: Path) -> dict[str, dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-c", WALKER, str(root)], capture_output=True, timeout=WALK_S, check=True, text=True
    )
    return {answer["path"]: answer for answer in map(json.loads, done.stdout.splitlines())}


@pytest.mark.expect_warnings("where a regular file belongs: refused", REFUSED)
@pytest.mark.parametrize("options", [["-o", "ro"], []], ids=["read-only", "writable"])
def test_a_mount_serves_the_rest_and_shows_links_as_links(mount, tmp_path: Path, options: list[str]) -> None:
    data, victim = make_hostile(tmp_path)
    (data / "good-0" / "stolen").symlink_to(victim.path)  # (a name no segment has: a lookup of it too)
    m: Mount = mount(data, *options)

    read = walk(m.path)
    assert read["good/0/records"]["bytes"] == "g1\ng2\n"
    assert read["bad/3/records"]["bytes"] == "b3\n"
    for partition, kind in enumerate(("a symbolic link", "a FIFO", "a directory")):
        for view in ("records", "records.jsonl", "read_committed/records"):
            assert read[f"bad/{partition}/{view}"].get("errno") == errno.EIO, (partition, view)
        status = json.loads(str(read[f"bad/{partition}/status"]["bytes"]))
        path = data / f"bad-{partition}" / SEGMENT
        assert status["offline"] == f"{path}: {kind} where a regular file belongs: refused"
    assert not [path for path, answer in read.items() if SECRET in str(answer.get("bytes", ""))]

    logdir = m.path / ".logdir"
    link = logdir / "bad-0" / SEGMENT
    assert SEGMENT in os.listdir(logdir / "bad-0")
    assert stat.S_ISLNK(os.lstat(link).st_mode) and os.readlink(link) == str(victim.path)
    stolen = logdir / "good-0" / "stolen"
    assert stat.S_ISLNK(os.lstat(stolen).st_mode) and os.readlink(stolen) == str(victim.path)
    with pytest.raises(OSError) as raised:
        os.open(stolen, os.O_RDONLY | os.O_NOFOLLOW)
    assert raised.value.errno == errno.ELOOP
    for partition in (1, 2):  # a FIFO, a directory: not shown, and not found when looked up
        assert SEGMENT not in os.listdir(logdir / f"bad-{partition}")
        with pytest.raises(FileNotFoundError):
            os.lstat(logdir / f"bad-{partition}" / SEGMENT)
    for partition in range(4):  # each partition's healthy segment, as on disk (an offline one's too)
        mirrored = logdir / f"bad-{partition}" / "00000000000000000000.log"
        assert mirrored.read_bytes() == (data / f"bad-{partition}" / "00000000000000000000.log").read_bytes()

    if not options:
        (m.path / "good" / "0" / "append").write_bytes(b"g3\n")
        with pytest.raises(OSError) as raised:
            (m.path / "bad" / "0" / "append").write_bytes(b"x\n")
        assert raised.value.errno == errno.EIO
        assert (m.path / "good" / "0" / "records").read_text() == "g1\ng2\ng3\n"
    m.stop()
    assert victim.unchanged()
    assert SECRET not in m.output()
    for partition in range(3):
        assert f"{data / f'bad-{partition}' / SEGMENT}:" in m.output()


@pytest.mark.expect_warnings("belongs: refused", REFUSED)
def test_a_partition_dir_that_is_a_link_is_shown_as_one(mount, tmp_path: Path) -> None:
    data, victim = make_hostile(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "00000000000000000000.log").write_bytes(b"not yours")
    (data / "good-1").symlink_to(elsewhere)
    m: Mount = mount(data)
    logdir = m.path / ".logdir"
    assert stat.S_ISLNK(os.lstat(logdir / "good-1").st_mode) and os.readlink(logdir / "good-1") == str(elsewhere)
    with pytest.raises(OSError) as raised:
        (m.path / "good" / "1" / "append").write_bytes(b"x\n")
    assert raised.value.errno == errno.EIO
    assert (m.path / "good" / "0" / "records").read_text() == "g1\ng2\n"
    m.stop()
    assert sorted(os.listdir(elsewhere)) == ["00000000000000000000.log"]
    assert (elsewhere / "00000000000000000000.log").read_bytes() == b"not yours"
    assert victim.unchanged()
