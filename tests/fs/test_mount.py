"""The mount driven by real tools: shell appends, tail, head, dd, wc, grep, less, tail -f."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from seglogfs.fs.page_cache import AHEAD_DELAY_ENV
from seglogfs.mount_tools.serving import CLOSE_DELAY_ENV
from tests.conftest import REPO
from tests.fs.conftest import FUSERMOUNT, REFUSED, Mount


def sh(command: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["bash", "-c", command], capture_output=True, check=check, timeout=60, **kwargs)


def consume(data: Path, topic: str, *extra: str) -> bytes:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "seglogfs.mount_tools.cli",
            "consume",
            str(data),
            "--topic",
            topic,
            "--from-beginning",
            *extra,
        ],
        cwd=REPO,
        capture_output=True,
        check=True,
        timeout=60,
    )
    return done.stdout


def test_append_then_tail_wc_head_dd(mount) -> None:
    m: Mount = mount()
    os.mkdir(m.path / "t")
    partition = m.path / "t" / "0"
    sh(f"printf 'a\\nb\\n' >> {partition}/append")
    assert sh(f"tail -n 2 {partition}/records").stdout == b"a\nb\n"
    sh(f"seq 1 5000 >> {partition}/append")
    records = partition / "records"
    expected = b"a\nb\n" + b"".join(b"%d\n" % i for i in range(1, 5001))
    assert records.stat().st_size == len(expected)
    assert sh(f"wc -l < {records}").stdout.strip() == b"5002"
    assert sh(f"head -c 1000 {records}").stdout == expected[:1000]
    assert sh(f"tail -c 777 {records}").stdout == expected[-777:]
    assert sh(f"dd if={records} bs=100 skip=37 count=12 status=none").stdout == expected[3700:4900]
    assert sh(f"grep -c '^49' {records}").stdout.strip() == b"111"
    assert records.read_bytes() == expected
    # The views equal what seglogfs consume prints.
    assert records.read_bytes() == consume(m.data, "t")
    assert (partition / "records.jsonl").read_bytes() == consume(m.data, "t", "--format", "jsonl")


def test_view_options_and_append_options(mount) -> None:
    m: Mount = mount(None, "-o", "print.key,print.offset,key.separator=:,parse.key")
    os.mkdir(m.path / "t")
    sh(f"printf 'k1:v1\\nk2:v2\\n' >> {m.path}/t/0/append")
    assert (m.path / "t" / "0" / "records").read_bytes() == b"Offset:0:k1:v1\nOffset:1:k2:v2\n"


def test_partial_line_waits_for_close(mount) -> None:
    m: Mount = mount()
    os.mkdir(m.path / "t")
    with open(m.path / "t" / "0" / "append", "ab", buffering=0) as handle:
        handle.write(b"one\ntw")
        assert (m.path / "t" / "0" / "records").read_bytes() == b"one\n"
        handle.write(b"o\nthr")
        assert (m.path / "t" / "0" / "records").read_bytes() == b"one\ntwo\n"
    assert (m.path / "t" / "0" / "records").read_bytes() == b"one\ntwo\nthr\n"


@pytest.mark.parametrize("follower", ["tail", "less"])
def test_followers_see_appends_within_two_seconds(mount, follower: str) -> None:
    m: Mount = mount()
    os.mkdir(m.path / "t")
    records = m.path / "t" / "0" / "records"
    sh(f"printf 'first\\n' >> {m.path}/t/0/append")
    if follower == "tail":
        process = subprocess.Popen(["tail", "-f", str(records)], stdout=subprocess.PIPE)
        reader = process.stdout
    else:
        master, slave = os.openpty()
        process = subprocess.Popen(
            ["less", "+F", str(records)],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env={**os.environ, "TERM": "xterm", "LINES": "24", "COLUMNS": "80"},
        )
        os.close(slave)
        reader = os.fdopen(master, "rb", buffering=0)
    try:
        os.set_blocking(reader.fileno(), False)
        seen = b""
        time.sleep(0.5)
        before, started = m.requests(), time.monotonic()
        for i in range(5):
            line = b"line-%d-%f" % (i, time.time())
            sh(f"printf '{line.decode()}\\n' >> {m.path}/t/0/append")
            written = time.monotonic()
            while line not in seen:
                assert time.monotonic() - written < 2.0, f"{follower} did not show {line!r} within 2 s: {seen[-300:]!r}"
                time.sleep(0.02)
                with contextlib.suppress(BlockingIOError, OSError):  # nothing new yet
                    seen += reader.read(65536) or b""
            time.sleep(0.5)
        after = m.requests()
        rate = (after.get("getattr", 0) - before.get("getattr", 0)) / (time.monotonic() - started)
        assert rate < 20, f"{follower} cost {rate:.1f} getattr requests a second"
    finally:
        process.kill()
        process.wait(timeout=10)
        reader.close()


@pytest.mark.expect_warnings(REFUSED)
def test_mkdir_creates_a_topic_and_bad_names_are_refused(mount) -> None:
    m: Mount = mount()
    os.mkdir(m.path / "orders")
    assert sorted(os.listdir(m.path / "orders")) == ["0", "append", "append.jsonl", "config"]
    assert sorted(os.listdir(m.path / "orders" / "0")) == [
        "append",
        "append.batches",
        "append.jsonl",
        "by-offset",
        "by-time",
        "read_committed",
        "read_uncommitted",
        "records",
        "records.jsonl",
        "status",
    ]
    with pytest.raises(OSError) as raised:
        os.mkdir(m.path / "bad name")
    assert raised.value.errno == 22  # EINVAL
    with pytest.raises(OSError) as raised:
        os.mkdir(m.path / "orders")
    assert raised.value.errno == 17  # EEXIST


def test_mount_type_and_fstab_line(tmp_path: Path) -> None:
    """`mount -t fuse.seglogfs` and an fstab line run through mount.fuse3 (seglogfs on PATH)."""
    import shutil

    assert shutil.which("seglogfs"), "scripts/dev setup puts seglogfs on PATH for mount(8)"
    data, mountpoint = tmp_path / "data", tmp_path / "mnt"
    mountpoint.mkdir()
    subprocess.run(
        [sys.executable, "-m", "seglogfs.mount_tools.cli", "produce", str(data), "--topic", "t"],
        input=b"hello\n",
        cwd=REPO,
        check=True,
    )
    fstab = tmp_path / "fstab"
    fstab.write_text(f"{data} {mountpoint} fuse.seglogfs ro,noauto,print.offset 0 0\n")
    for command, expected in (
        (["mount", "-t", "fuse.seglogfs", str(data), str(mountpoint), "-o", "ro"], b"hello\n"),
        (["mount", "--fstab", str(fstab), str(mountpoint)], b"Offset:0\thello\n"),
    ):
        subprocess.run(command, check=True, timeout=60)
        try:
            assert (mountpoint / "t" / "0" / "records").read_bytes() == expected
        finally:
            subprocess.run(["umount", str(mountpoint)], check=True, timeout=60)
        deadline = time.monotonic() + 10
        while os.path.ismount(mountpoint) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.ismount(mountpoint)


def test_kafka_settings_as_mount_options(mount) -> None:
    m: Mount = mount(None, "-o", "message.timestamp.type=LogAppendTime,num.partitions=2")
    os.mkdir(m.path / "t")
    assert sorted(os.listdir(m.path / "t")) == ["0", "1", "append", "append.jsonl", "config"]
    (m.path / "t" / "0" / "append.jsonl").write_bytes(b'{"value":"v","timestamp":5}\n')
    record = json.loads((m.path / "t" / "0" / "records.jsonl").read_bytes())
    assert record["timestampType"] == "LogAppendTime" and record["timestamp"] != 5


@pytest.mark.expect_warnings(REFUSED)
def test_topic_config_is_written_through_the_mount(mount) -> None:
    m: Mount = mount()
    os.mkdir(m.path / "t")
    config = m.path / "t" / "config"
    assert config.read_bytes() == b""
    config.write_bytes(b"# a comment\nretention.ms=1000\ncleanup.policy=compact\n")
    assert config.read_bytes() == b"cleanup.policy=compact\nretention.ms=1000\n"
    status = json.loads((m.path / "t" / "0" / "status").read_bytes())
    assert status["config"]["retention.ms"] == "1000" and status["config"]["cleanup.policy"] == "compact"
    with pytest.raises(OSError) as raised:  # now compacted: a record needs a key
        (m.path / "t" / "0" / "append").write_bytes(b"no key\n")
    assert raised.value.errno == errno.EINVAL
    for bad in (b"retention.ms=soon\n", b"no.such.setting=1\n", b"just words\n"):
        with pytest.raises(OSError) as raised:
            config.write_bytes(bad)
        assert raised.value.errno == errno.EINVAL, bad
    assert config.read_bytes() == b"cleanup.policy=compact\nretention.ms=1000\n"
    config.write_bytes(b"")  # applied when the last descriptor goes, a moment after close
    assert eventually(lambda: config.read_bytes() == b"")


def eventually(condition, seconds: float = 5.0) -> bool:
    """Whether `condition()` holds within `seconds` (for what the kernel does after close
    returns: it releases a file's last descriptor asynchronously)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


START = b"retention.ms=3600000\n"
CONFIG_IDIOMS = [
    # (what a shell user types, its exit status, the config file after it)
    ("printf 'retention.ms=1000\\n' > config", 0, b"retention.ms=1000\n"),
    ("printf 'segment.ms=5000\\n' >> config", 0, START + b"segment.ms=5000\n"),
    ("printf 'segment.ms=5000' >> config", 0, START + b"segment.ms=5000\n"),  # no final newline
    ("touch config", 1, START),  # a node's times come from the data dir: EPERM
    (": > config", 0, b""),
    ("printf 'bogus.key=1\\n' > config", 1, START),  # refused: nothing changes
    ("printf 'retention.ms=1\\nbogus.key=1\\n' > config", 1, START),  # a bad line spoils the write
    ("printf 'retention.ms=soon\\n' >> config", 1, START),
    ("exec 3<>config; exec 3>&-", 0, START),  # O_RDWR open and close
    ("exec 3>>config; exec 3>&-", 0, START),  # O_APPEND open and close
    ("exec 3<>config; cat <&3 >/dev/null", 0, START),  # reading through O_RDWR
    ("cp config config.copy 2>/dev/null; true", 0, START),
]


@pytest.mark.expect_warnings(REFUSED)
@pytest.mark.parametrize(("idiom", "status", "expected"), CONFIG_IDIOMS, ids=[c[0] for c in CONFIG_IDIOMS])
def test_config_file_takes_shell_idioms(mount, idiom: str, status: int, expected: bytes) -> None:
    m: Mount = mount()
    os.mkdir(m.path / "t")
    config = m.path / "t" / "config"
    assert sh(f"printf 'retention.ms=3600000\\n' > {config}").returncode == 0
    done = subprocess.run(["bash", "-c", idiom], cwd=config.parent, capture_output=True, timeout=60, check=False)
    assert done.returncode == status, done.stderr
    assert eventually(lambda: config.read_bytes() == expected), config.read_bytes()
    assert config.stat().st_size == len(expected)  # ls -l shows the real size
    overrides = json.loads((m.path / "t" / "0" / "status").read_bytes())["config"]
    for line in expected.decode().splitlines():
        key, _, value = line.partition("=")
        assert overrides[key] == value
    saved = json.loads((m.data / ".seglogfs-topic-configs.json").read_text())["topics"].get("t", {})
    assert saved == dict(line.split("=", 1) for line in expected.decode().splitlines())


@pytest.mark.expect_warnings(
    r"rename t/(tmp\S+) to t/config: t/\1: unknown topic config 'bogus.key' \(EINVAL\)$",
    r"rename t/(sed\S+) to t/config: t/\1: unknown topic config 'bogus.ms' \(EINVAL\)$",
    r"rename t/\S+ to t/other: a topic dir holds append, append.jsonl, config and the partitions; .* \(EPERM\)$",
    r"unlink t/append: a topic dir holds append, append.jsonl, config and the partitions; .* \(EPERM\)$",
)
def test_editors_save_config_through_a_temporary_file_and_a_rename(mount) -> None:
    """`sed -i` and a save through a temporary file and `os.replace` replace the overrides,
    checked line by line: a bad line changes nothing and the rename fails (EINVAL). The
    temporary files live in the mount's memory only and are gone after the rename, refused or
    not; nothing else can be renamed or removed in a topic dir."""
    m: Mount = mount()
    os.mkdir(m.path / "t")
    config = m.path / "t" / "config"
    config.write_bytes(b"retention.ms=3600000\n")

    def overrides() -> dict[str, str]:
        return json.loads((m.path / "t" / "0" / "status").read_bytes())["config"]

    def save(text: bytes, onto: Path = config) -> None:
        fd, name = tempfile.mkstemp(dir=config.parent)
        try:
            os.write(fd, text)
        finally:
            os.close(fd)
        try:
            os.replace(name, onto)
        finally:
            assert not os.path.exists(name)

    sed = subprocess.run(["sed", "-i", "s/3600000/7200000/", str(config)], capture_output=True, check=False)
    assert sed.returncode == 0, sed.stderr
    assert config.read_bytes() == b"retention.ms=7200000\n" and overrides()["retention.ms"] == "7200000"
    save(b"retention.ms=1000\nsegment.ms=5000\n")
    assert config.read_bytes() == b"retention.ms=1000\nsegment.ms=5000\n"
    assert overrides()["retention.ms"] == "1000" and overrides()["segment.ms"] == "5000"
    before = config.read_bytes()
    with pytest.raises(OSError) as raised:
        save(b"retention.ms=5\nbogus.key=1\n")
    assert raised.value.errno == errno.EINVAL
    sed = subprocess.run(["sed", "-i", "s/retention/bogus/", str(config)], capture_output=True, check=False)
    assert sed.returncode != 0 and b"Invalid argument" in sed.stderr, sed
    assert config.read_bytes() == before and overrides()["retention.ms"] == "1000"
    with pytest.raises(OSError) as raised:
        save(b"retention.ms=5\n", onto=config.parent / "other")
    assert raised.value.errno == errno.EPERM
    with pytest.raises(OSError) as raised:
        os.unlink(config.parent / "append")
    assert raised.value.errno == errno.EPERM
    left = config.parent / "left-behind"
    left.write_bytes(b"retention.ms=5\n")  # made, never renamed: removed as any file is
    assert left.read_bytes() == b"retention.ms=5\n"
    left.unlink()
    assert sorted(os.listdir(config.parent)) == ["0", "append", "append.jsonl", "config"]
    assert config.read_bytes() == before
    stored = [path.name for path in m.data.rglob("*")]
    assert not any(name.startswith(("sed", "tmp", "other")) for name in stored), stored


def test_mount_errors_are_one_line_with_the_cli_exit_codes(mount, tmp_path: Path) -> None:
    m: Mount = mount()
    second = tmp_path / "second"
    second.mkdir()
    for args, code, said in (
        ([str(m.data), str(second)], 3, "is in use by process"),  # the first mount holds the lock
        ([str(m.data), str(second), "-o", "bogus"], 1, "-o bogus: unknown mount option"),
        ([str(m.data), str(second), "-o", "measure=soon"], 1, "measure=background (the default) or measure=lazy"),
        ([str(m.data), str(tmp_path / "missing")], 1, "mount point is not a directory"),
    ):
        command = [sys.executable, "-m", "seglogfs.mount_tools.cli", "mount", *args]
        done = subprocess.run(command, cwd=REPO, capture_output=True, timeout=60, check=False)
        lines = done.stderr.decode().strip().splitlines()
        assert done.returncode == code and len(lines) == 1 and said in lines[0], (args, done)
    assert not os.path.ismount(second)


def test_tail_f_follows_through_retention(mount, tmp_path: Path) -> None:
    """Retention removing the oldest segments under a follower is no truncation: the follower's
    file keeps its bytes and size; `records` looked up afresh starts at the new log start."""
    m: Mount = mount(None, "-o", "log.retention.check.interval.ms=200")
    os.mkdir(m.path / "t")
    (m.path / "t" / "config").write_bytes(b"segment.bytes=1024\n")
    part = m.path / "t" / "0"
    old_ms = int(time.time() * 1000) - 3_600_000
    expected = []
    for batch in range(8):  # an hour old: several segments
        lines = [b"old-%d-%d-%s" % (batch, i, b"x" * 40) for i in range(5)]
        with open(part / "append.jsonl", "ab") as out:
            out.write(b"".join(b'{"value":"%s","timestamp":%d}\n' % (line, old_ms) for line in lines))
        expected += lines
    sh(f"printf 'new-1\\nnew-2\\n' >> {part}/append")
    expected += [b"new-1", b"new-2"]
    errors = tmp_path / "tail.err"
    with open(errors, "wb") as err:
        follow = ["tail", "-n", "+1", "-f", str(part / "records")]
        process = subprocess.Popen(follow, stdout=subprocess.PIPE, stderr=err)
    assert process.stdout is not None
    try:
        os.set_blocking(process.stdout.fileno(), False)
        seen = b""

        def wait_for(line: bytes) -> None:
            nonlocal seen
            deadline = time.monotonic() + 5
            while line not in seen:
                assert time.monotonic() < deadline, f"tail -f did not show {line!r}: {seen[-300:]!r}"
                time.sleep(0.05)
                with contextlib.suppress(BlockingIOError, OSError):
                    seen += process.stdout.read(65536) or b""

        wait_for(b"new-2\n")
        (m.path / "t" / "config").write_bytes(b"segment.bytes=1024\nretention.ms=600000\n")
        deadline = time.monotonic() + 10
        while json.loads((part / "status").read_bytes())["logStartOffset"] == 0:
            assert time.monotonic() < deadline, "retention did not run"
            time.sleep(0.1)
        time.sleep(1.5)  # tail looks once a second
        for line in (b"after-1", b"after-2"):
            sh(f"printf '{line.decode()}\\n' >> {part}/append")
            expected.append(line)
            wait_for(line + b"\n")
        time.sleep(1.5)
        with contextlib.suppress(BlockingIOError, OSError):
            seen += process.stdout.read(65536) or b""
    finally:
        process.kill()
        process.wait(timeout=10)
        process.stdout.close()
    assert errors.read_bytes() == b""  # no "file truncated"
    assert seen == b"".join(line + b"\n" for line in expected)  # every line once, in order
    start = json.loads((part / "status").read_bytes())["logStartOffset"]
    assert start > 0
    # A reader coming now sees the partition from its new start.
    assert (part / "records").read_bytes() == b"".join(line + b"\n" for line in expected[start:])


def test_a_background_mount_logs_to_a_file(tmp_path: Path) -> None:
    """Without -f the mount's stderr is gone once it is up: its log lines go to a file
    (`-o log=FILE`; by default /var/log/seglogfs/seglogfs.log for root) and to syslog."""
    data, mountpoint, log = tmp_path / "data", tmp_path / "mnt", tmp_path / "logs" / "mount.log"
    mountpoint.mkdir()
    command = [sys.executable, "-m", "seglogfs.mount_tools.cli", "mount", str(data), str(mountpoint)]
    options = ["-o", f"log={log},view.cache=none"]
    done = subprocess.run([*command, *options], cwd=REPO, capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    try:
        os.mkdir(mountpoint / "t")
        with pytest.raises(FileNotFoundError):
            (mountpoint / "t" / "0" / "by-offset" / "abc").stat()
    finally:
        subprocess.run([sys.executable, "-m", "seglogfs.mount_tools.cli", "umount", str(mountpoint)], check=True)
    assert eventually(lambda: "requests" in log.read_text())  # written at unmount
    said = log.read_text()
    assert f"{mountpoint}: WARNING" in said and "t/0/by-offset/abc: not an offset" in said
    bad = subprocess.run([*command, "-o", "log=/proc/nope/x.log"], cwd=REPO, capture_output=True, check=False)
    assert bad.returncode == 1 and b"cannot write the mount's log there" in bad.stderr


def test_cat_moves_a_megabyte_a_request(mount, tmp_path: Path) -> None:
    """Views and `.logdir` files advertise 1 MiB as their I/O size, so `cat` asks for a megabyte
    a request, and a view's pages come from the OS page cache on the event loop."""
    data = tmp_path / "data"
    records = [b"record-%06d " % i + b"x" * 90 for i in range(60_000)]  # about 6 MiB as text
    produce = [sys.executable, "-m", "seglogfs.mount_tools.cli", "produce", str(data), "--topic", "t"]
    subprocess.run(produce, input=b"\n".join(records) + b"\n", cwd=REPO, check=True, capture_output=True, timeout=60)
    m: Mount = mount(data)
    view = m.path / "t" / "0" / "records"
    segment = next((m.path / ".logdir" / "t-0").glob("*.log"))
    for path in (view, segment):
        assert os.stat(path).st_blksize == 1 << 20, path
    before = m.requests()
    assert sh(f"cat {view}").stdout == b"\n".join(records) + b"\n"
    after = m.requests()
    reads = after["read"] - before.get("read", 0)
    assert reads <= os.stat(view).st_size // (1 << 20) + 2, f"{reads} read requests"
    # All but the last two on the loop: the one that crosses the end and the one at it go to a
    # worker thread, which looks for records appended since.
    assert after["read_now"] - before.get("read_now", 0) >= reads - 2, "reads went to a worker thread"
    before = after
    sh(f"cat {segment} > /dev/null")
    reads = m.requests()["read"] - before["read"]
    assert reads <= os.stat(segment).st_size // (1 << 20) + 2, f"{reads} read requests"


def test_sequential_readers_get_every_byte_of_pages_rendered_ahead(mount, tmp_path: Path) -> None:
    """`cat`, `grep`, `wc` and `| head` on a partition of several segments, two readers at
    once: a sequential reader's pages are rendered ahead by the core (text and JSON Lines), and
    every reader gets the records, whole and in order, as `consume` prints them."""
    data = tmp_path / "data"
    records = [b"record-%06d " % i + b"y" * (i % 150) for i in range(150_000)]  # about 13 MiB
    cli = [sys.executable, "-m", "seglogfs.mount_tools.cli"]
    produce = [*cli, "produce", str(data), "--topic", "t", "--override", "log.segment.bytes=4000000"]
    subprocess.run(produce, input=b"\n".join(records) + b"\n", cwd=REPO, check=True, capture_output=True, timeout=60)
    consume = [*cli, "consume", str(data), "--topic", "t", "--from-beginning", "--format", "jsonl"]
    jsonl = subprocess.run(consume, cwd=REPO, check=True, capture_output=True, timeout=60).stdout
    m: Mount = mount(data, "-o", "ro")
    view = m.path / "t" / "0" / "records"
    assert len(list((m.path / ".logdir" / "t-0").glob("*.log"))) >= 3
    text = b"\n".join(records) + b"\n"
    both = sh(f"cat {view} > {tmp_path}/a & cat {view} > {tmp_path}/b; wait")
    assert both.returncode == 0
    assert (tmp_path / "a").read_bytes() == text and (tmp_path / "b").read_bytes() == text
    assert sh(f"cat {view}.jsonl").stdout == jsonl
    assert sh(f"grep -c 'record-1.*yyyyyyyyyy$' {view}").stdout == b"%d\n" % sum(
        1 for r in records if r.startswith(b"record-1") and r.endswith(b"y" * 10)
    )
    assert sh(f"wc -l < {view}").stdout.strip() == b"150000"
    assert sh(f"head -c 5000000 {view} | tail -c 20").stdout == text[5_000_000 - 20 : 5_000_000]
    assert sh(f"cat {view}").stdout == text  # (after a reader that went away mid-file)


def test_a_reader_that_catches_up_with_the_render_ahead_thread_waits_on_the_loop(
    mount, tmp_path: Path, monkeypatch
) -> None:
    """With each run rendered ahead slowed down, `cat` of a view catches up with the thread
    again and again: its reads wait on the loop for the run being rendered (they do not go to
    a worker thread), and it gets every record, in order."""
    data = tmp_path / "data"
    records = [b"record-%06d " % i + b"z" * (i % 90) for i in range(120_000)]  # about 8 MiB
    cli = [sys.executable, "-m", "seglogfs.mount_tools.cli"]
    produce = [*cli, "produce", str(data), "--topic", "t"]
    subprocess.run(produce, input=b"\n".join(records) + b"\n", cwd=REPO, check=True, capture_output=True, timeout=60)
    monkeypatch.setenv(AHEAD_DELAY_ENV, "40")
    m: Mount = mount(data, "-o", "ro")
    view = m.path / "t" / "0" / "records"
    assert view.stat().st_size == sum(len(r) + 1 for r in records)  # (measured: the reads below render)
    m.requests()
    assert sh(f"cat {view}").stdout == b"\n".join(records) + b"\n"
    counted = m.requests()  # (since the last report)
    assert counted.get("read_waited", 0) >= 1, "no read waited for the thread"
    # (but the two that reach the end, which take a look at the log first, and the first when
    # `cat`'s open came while the mount was looking at the log: its layout's lock was taken, so
    # the first read brings the layout up to date, on a worker thread)
    assert counted["read"] - counted["read_now"] <= 3, f"reads went to a worker thread: {counted}"


def test_one_line_appends_are_served_on_the_loop_unless_they_roll(mount) -> None:
    """`printf … >> append` appends on the event loop when the append is only a write to the
    page cache; one that rolls the segment (files created, the old one flushed) goes to a worker
    thread. Either way every line is a record, in order."""
    m: Mount = mount(None, "--override", "log.segment.bytes=700")
    os.mkdir(m.path / "t")
    append = m.path / "t" / "0" / "append"
    lines = 120
    before = m.requests()
    sh(f"for i in $(seq {lines}); do printf 'line-%03d\\n' $i >> {append}; done")
    after = m.requests()
    expected = b"".join(b"line-%03d\n" % i for i in range(1, lines + 1))
    assert (m.path / "t" / "0" / "records").read_bytes() == expected
    segments = len(list((m.path / ".logdir" / "t-0").glob("*.log")))
    on_loop = after["write_now"] - before.get("write_now", 0)
    writes = after["write"] - before.get("write", 0)
    assert writes == lines and segments > 8
    # Each roll, and the first append to each new segment (its files not open yet), go to a
    # worker thread; every other line is appended on the loop.
    assert lines - 2 * segments - 2 <= on_loop <= lines - segments + 1, (on_loop, segments)


def test_a_mount_point_given_as_a_data_dir_is_refused_in_one_line(mount, tmp_path: Path) -> None:
    """Commands that take a DATADIR refuse a seglogfs mount point (it holds topics as
    directories, not Kafka's layout: `check` would find nothing and call that clean), naming the
    data dir it serves and its `.logdir`, which they read."""
    data = tmp_path / "data"
    produce = [sys.executable, "-m", "seglogfs.mount_tools.cli", "produce", str(data), "--topic", "t"]
    subprocess.run(produce, input=b"one\ntwo\n", cwd=REPO, check=True, capture_output=True, timeout=60)
    m: Mount = mount(data, "-o", "ro")
    cli = [sys.executable, "-m", "seglogfs.mount_tools.cli"]
    for command in (["check"], ["topics", "list"], ["groups", "list"], ["consume", "--topic", "t"]):
        done = subprocess.run(
            [*cli, command[0], str(m.path), *command[1:]], cwd=REPO, capture_output=True, timeout=60, check=False
        )
        assert done.returncode == 2, (command, done.stderr)
        lines = done.stderr.decode().splitlines()
        assert len(lines) == 1 and f"{m.path} is a seglogfs mount of {data}" in lines[0], lines
        assert f"{m.path / '.logdir'}" in lines[0]
    mirror = str(m.path / ".logdir")
    checked = subprocess.run([*cli, "check", mirror], cwd=REPO, capture_output=True, timeout=60, check=False)
    assert checked.returncode == 0 and b"1 partitions" in checked.stdout, checked
    consumed = subprocess.run(
        [*cli, "consume", mirror, "--topic", "t", "--from-beginning"],
        cwd=REPO,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert consumed.stdout == b"one\ntwo\n", consumed


@pytest.mark.expect_warnings("its views answer EIO there", "corrupt record batch at position")
def test_cat_of_a_partition_with_a_damaged_batch_prints_what_consume_prints(mount, tmp_path: Path) -> None:
    """A batch whose CRC fails in the middle of a partition: `cat records` (and the JSON Lines
    view, and `grep`) prints every record before it, as `consume` does, and ends with EIO; a
    by-offset view past it reads on; `status` names the file and position; the mount stays up."""
    from seglogfs.engine.record.records import iter_batch_headers

    data = tmp_path / "data"
    lines = b"".join(b"line-%06d %s\n" % (n, b"z" * 60) for n in range(60_000))
    produce = [sys.executable, "-m", "seglogfs.mount_tools.cli", "produce", str(data), "--topic", "t"]
    produce += ["--override", "log.segment.bytes=1000000"]
    subprocess.run(produce, input=lines, cwd=REPO, check=True, capture_output=True, timeout=60)
    segment = sorted((data / "t-0").glob("*.log"))[1]
    content = bytearray(segment.read_bytes())
    bad = list(iter_batch_headers(content))[3]
    content[bad.position + 100] ^= 0xFF  # a byte of its records: the CRC no longer holds
    segment.write_bytes(bytes(content))
    before = subprocess.run(
        [sys.executable, "-m", "seglogfs.mount_tools.cli", "consume", str(data), "--topic", "t", "--from-beginning"],
        cwd=REPO,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert before.returncode == 1 and before.stdout.count(b"\n") == bad.base_offset
    m: Mount = mount(data, "-o", "ro")
    view = m.path / "t" / "0" / "records"
    cat = sh(f"cat {view}", check=False)
    assert cat.returncode == 1 and b"Input/output error" in cat.stderr
    assert cat.stdout == before.stdout
    assert sh(f"grep -c line- {view}.jsonl", check=False).stdout == b"%d\n" % bad.base_offset
    after = sh(f"head -1 {m.path}/t/0/by-offset/{bad.last_offset + 1}").stdout
    assert after == b"line-%06d %s\n" % (bad.last_offset + 1, b"z" * 60)
    status = json.loads((m.path / "t" / "0" / "status").read_text())
    assert (
        f"{segment}: corrupt record batch at position {bad.position}: CRC-32C mismatch"
        in status["views"]["text"]["error"]
    )
    assert sh(f"ls {m.path}/t/0").returncode == 0  # (up)


@pytest.mark.expect_warnings(
    r"mkdir .*a_b: Topic 'a_b' collides with existing topic: a\.b \(EINVAL\)$",
    r"mkdir .*__consumer_offsets: topic '__consumer_offsets' is internal to Kafka.*\(EINVAL\)$",
)
def test_mkdir_refuses_kafkas_colliding_and_internal_topic_names(mount) -> None:
    """Kafka refuses a topic whose name differs from another's only by '.' against '_' (both
    make one metric name), and creates its internal topics itself: `mkdir` does as Kafka."""
    m: Mount = mount()
    os.mkdir(m.path / "a.b")
    for name in ("a_b", "__consumer_offsets"):
        with pytest.raises(OSError) as raised:
            os.mkdir(m.path / name)
        assert raised.value.errno == errno.EINVAL, name
    assert sorted(os.listdir(m.path)) == [".logdir", "a.b"]
    assert not any(name.startswith(("a_b", "__")) for name in os.listdir(m.data))
    output = m.output()
    assert "Topic 'a_b' collides with existing topic: a.b" in output
    assert "'__consumer_offsets' is internal to Kafka" in output


def test_umount_returns_once_the_mount_has_closed_the_data_dir(mount, monkeypatch: pytest.MonkeyPatch) -> None:
    """`seglogfs umount` returns when the mount's process has written its checkpoints and its
    clean-shutdown marker and released the lock (closing takes 1.5 s here, as thousands of
    partitions take): a `produce` right after it finds the data dir free."""
    monkeypatch.setenv(CLOSE_DELAY_ENV, "1500")
    m: Mount = mount()
    os.mkdir(m.path / "t")
    (m.path / "t" / "0" / "append").write_bytes(b"before\n")
    seglogfs = [sys.executable, "-m", "seglogfs.mount_tools.cli"]
    done = subprocess.run([*seglogfs, "umount", str(m.path)], cwd=REPO, capture_output=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stderr == b"", done
    assert (m.data / ".kafka_cleanshutdown").exists()
    assert m.process.poll() == 0
    produce = [*seglogfs, "produce", str(m.data), "--topic", "t"]
    produced = subprocess.run(produce, input=b"after\n", cwd=REPO, capture_output=True, timeout=60, check=False)
    assert produced.returncode == 0, produced.stderr


def test_umount_of_2000_partitions_then_produce_at_once(mount, tmp_path: Path) -> None:
    """The issue's case without a test hook: 2,000 partitions mounted and appended to, then
    `umount && produce` — the marker is there when umount returns and produce finds the data
    dir free."""
    data = tmp_path / "data"
    seglogfs = [sys.executable, "-m", "seglogfs.mount_tools.cli"]
    create = [*seglogfs, "topics", str(data), "create", "--topic", "t", "--partitions", "2000"]
    subprocess.run(create, cwd=REPO, capture_output=True, timeout=120, check=True)
    m: Mount = mount(data)
    for partition in (0, 999, 1999):
        (m.path / "t" / str(partition) / "append").write_bytes(b"before\n")
    done = subprocess.run([*seglogfs, "umount", str(m.path)], cwd=REPO, capture_output=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stderr == b"", done
    assert (data / ".kafka_cleanshutdown").exists()
    assert m.process.poll() == 0
    produce = [*seglogfs, "produce", str(data), "--topic", "t", "--partition", "1999"]
    produced = subprocess.run(produce, input=b"after\n", cwd=REPO, capture_output=True, timeout=60, check=False)
    assert produced.returncode == 0, produced.stderr


def test_umount_of_a_read_only_mount_beside_a_writer_returns_at_once(mount) -> None:
    """A read-only mount holds no lock: the lock's holder is the writer beside it, which umount
    of the read-only mount does not wait for."""
    writer: Mount = mount()
    reader: Mount = mount(writer.data, "-o", "ro")
    umount = [sys.executable, "-m", "seglogfs.mount_tools.cli", "umount", str(reader.path)]
    done = subprocess.run(umount, cwd=REPO, capture_output=True, timeout=20, check=False)
    assert done.returncode == 0 and done.stderr == b"", done
    assert reader.process.wait(timeout=20) == 0
    assert os.path.ismount(writer.path) and writer.process.poll() is None


def test_a_mount_waits_for_one_still_closing_the_data_dir(mount, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mount of a data dir that a mount being unmounted still holds (writing its checkpoints)
    says it waits for that process, naming it, and then mounts. (The first's close is held back
    6 s: the second's start, imports included, takes 3 s on a loaded two-core machine.)"""
    monkeypatch.setenv(CLOSE_DELAY_ENV, "6000")
    first: Mount = mount()
    os.mkdir(first.path / "t")
    monkeypatch.delenv(CLOSE_DELAY_ENV)
    subprocess.run([FUSERMOUNT, "-u", str(first.path)], check=True)
    second: Mount = mount(first.data)
    assert first.process.poll() == 0
    assert f"waiting for process {first.process.pid}, a seglogfs mount of it that was unmounted" in second.output()
    assert os.listdir(second.path / "t") == ["append", "append.jsonl", "config", "0"]
