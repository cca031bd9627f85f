"""Apache Kafka itself as the oracle: its broker and tools, run from the jars `scripts/dev setup`
resolved (tests/interop/pom.xml; class paths in build/interop/). No test downloads anything: a
missing class path or a missing `java` fails the test with the command that makes it.

JVM starts are the cost here (1-2 s of CPU each): one broker serves a worker's session (each xdist
worker that draws a broker test starts its own: pytest-xdist's `xdist_group` does not group
under pytest 9, whose node ids it can no longer rename), and Kafka's tools are given many files or
topics per run."""

from __future__ import annotations

import logging
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.conftest import REPO, listen_port
from tests.fs.conftest import mount  # noqa: F401 (a fixture: writable and read-only mounts)

CLASSPATHS = REPO / "build" / "interop"
NEWEST = "4.4.0"
VERSIONS = (NEWEST, "3.9.2")  # the newest Kafka, and the last of the 3.x line

# Kafka's tools log (log4j 2 from 4.0, reload4j before) WARN and worse to stderr, and the broker
# everything to its log file, in its own pattern, so that an ERROR line can be found.
PATTERN = "[%d] %p %m (%c)%n"
LOG4J2 = f"""status = warn
appender.out.type = Console
appender.out.name = out
appender.out.target = SYSTEM_{{target}}
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = {PATTERN}
rootLogger.level = {{level}}
rootLogger.appenderRef.out.ref = out
"""
LOG4J1 = f"""log4j.rootLogger={{level}}, out
log4j.appender.out=org.apache.log4j.ConsoleAppender
log4j.appender.out.Target=System.{{target_lower}}
log4j.appender.out.layout=org.apache.log4j.PatternLayout
log4j.appender.out.layout.ConversionPattern={PATTERN}
"""


class Kafka:
    """One Kafka version's jars: its tools run as `java -cp CLASSPATH MAIN ARGS`."""

    def __init__(self, version: str, work: Path) -> None:
        self.version = version
        self.major = int(version.split(".", maxsplit=1)[0])
        classpath = CLASSPATHS / f"kafka-{version}.classpath"
        java = shutil.which("java")
        if java is None:
            pytest.fail("no `java` on PATH: the interop tests run Apache Kafka (scripts/dev setup installs a JRE)")
        if not classpath.is_file():
            pytest.fail(f"{classpath} is missing: run scripts/dev setup (it resolves Kafka {version} with Maven)")
        self.java = java
        self.classpath = classpath.read_text().strip()
        missing = [jar for jar in self.classpath.split(":") if not Path(jar).is_file()]
        if missing:
            pytest.fail(f"Kafka {version}'s class path names jars that are gone ({missing[0]}): run scripts/dev setup")
        work.mkdir(parents=True, exist_ok=True)
        self.tools_logging = self._logging(work / "tools", "WARN", "ERR")
        self.broker_logging = self._logging(work / "broker", "INFO", "OUT")

    def _logging(self, stem: Path, level: str, target: str) -> list[str]:
        if self.major >= 4:
            path = stem.with_suffix(".log4j2.properties")
            path.write_text(LOG4J2.format(target=target, level=level))
            return [f"-Dlog4j2.configurationFile={path}"]
        path = stem.with_suffix(".log4j.properties")
        path.write_text(LOG4J1.format(level=level, target_lower=target.lower()))
        return [f"-Dlog4j.configuration=file:{path}"]

    def main_class(self, tool: str) -> str:
        """A tool's main class in this version (some moved between the versions tested), or
        `tool` itself, a class name."""
        moved = {
            "dump-log": ("org.apache.kafka.tools.DumpLogSegments", "kafka.tools.DumpLogSegments"),
            "console-producer": ("org.apache.kafka.tools.ConsoleProducer", "kafka.tools.ConsoleProducer"),
            "console-consumer": (
                "org.apache.kafka.tools.consumer.ConsoleConsumer",
                "org.apache.kafka.tools.consumer.ConsoleConsumer",
            ),
            "storage": ("kafka.tools.StorageTool", "kafka.tools.StorageTool"),
        }
        if tool not in moved:
            return tool
        newest, older = moved[tool]
        return newest if self.major >= 4 else older

    def options(self, tool: str, args: Sequence[str]) -> list[str]:
        """`args` as this version names the console tools' options: 3.x has `--property` for
        the reader's and formatter's and `--producer-property`/`--consumer-property` where 4.x
        has `--reader-property`, `--formatter-property` and `--command-property`."""
        if self.major >= 4 or tool not in ("console-producer", "console-consumer"):
            return list(args)
        client = "--producer-property" if tool == "console-producer" else "--consumer-property"
        older = {"--reader-property": "--property", "--formatter-property": "--property", "--command-property": client}
        return [older.get(arg, arg) for arg in args]

    def command(self, tool: str, *args: str, heap: str = "256m", logging: Sequence[str] = ()) -> list[str]:
        # C1 only, and the class-data archive: a tool's run is short, and the start is most of it.
        return [
            self.java,
            f"-Xmx{heap}",
            "-XX:TieredStopAtLevel=1",
            "-XX:+UseSerialGC",
            # Output in UTF-8 whatever the locale (a replaced byte prints as U+FFFD, not "?")
            "-Dfile.encoding=UTF-8",
            "-Dsun.stdout.encoding=UTF-8",
            "-Dsun.stderr.encoding=UTF-8",
            *(logging or self.tools_logging),
            "-cp",
            self.classpath,
            self.main_class(tool),
            *self.options(tool, args),
        ]

    def run(
        self, tool: str, *args: str, stdin: bytes = b"", timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(self.command(tool, *args), input=stdin, capture_output=True, timeout=timeout, check=False)
        result = subprocess.CompletedProcess(
            done.args, done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
        )
        if check and result.returncode != 0:
            raise AssertionError(f"Kafka {self.version} {tool} exited {result.returncode}:\n{result.stderr[-4000:]}")
        return result

    def dump_log(self, files: Sequence[Path], *flags: str) -> dict[Path, str]:
        """kafka-dump-log over many files in one run: each file's output, from its `Dumping`
        line on, by file (the tool goes on to the next file after one it could not read). The
        reports it prints after the last file (index mismatches, out-of-order timestamps,
        non-consecutive offsets) are under the key `AFTER_FILES`, and its standard error (where
        some of those reports go) under `STDERR`."""
        done = self.run("dump-log", *flags, "--files", ",".join(str(f) for f in files), check=False)
        return split_dump(done.stdout, files, f"Kafka {self.version} kafka-dump-log {' '.join(flags)}", done)


AFTER_FILES = Path("(after the files)")
STDERR = Path("(standard error)")
# The reports DumpLogSegments prints once every file is dumped.
TRAILER = re.compile(
    r"^(Mismatches in :|Found timestamp mismatch in :|Found out of order timestamp in :"
    r"|Non-consecutive offsets in |The following indexed offsets are not found in )",
    re.MULTILINE,
)


def split_dump(output: str, files: Sequence[Path], who: str, done: subprocess.CompletedProcess[str]) -> dict[Path, str]:
    """The output of a dump of several files, cut at each `Dumping FILE` line."""
    trailer = TRAILER.search(output)
    output, after = (output[: trailer.start()], output[trailer.start() :]) if trailer else (output, "")
    parts: dict[Path, str] = {AFTER_FILES: after, STDERR: done.stderr}
    pieces = re.split(r"^(?=Dumping )", output, flags=re.MULTILINE)
    extra = pieces.pop(0) if pieces and not pieces[0].startswith("Dumping ") else ""
    for piece in pieces:
        name = piece.split("\n", 1)[0].removeprefix("Dumping ")
        parts[Path(name)] = piece
    missing = [f for f in files if f not in parts]
    if missing or extra or done.returncode != 0:
        raise AssertionError(
            f"{who} (exit {done.returncode}) did not dump {missing[:3]} (of {len(files)}), "
            f"before its first file: {extra[:2000]!r}\nstderr: {done.stderr[-4000:]}"
        )
    return parts


class Broker:
    """A single-node KRaft cluster (the node both broker and controller), formatted in `home`
    with `kafka-storage format --standalone`, on free loopback ports. Its small segments, quick
    retention checks and an eager cleaner make rolls, retention and compaction happen within
    seconds (topics ask for segments under the broker's 1 MiB minimum with Kafka's
    `internal.segment.bytes`)."""

    def __init__(self, kafka: Kafka, home: Path) -> None:
        self.kafka = kafka
        self.home = home
        self.log_dir = home / "logs"
        self.port = listen_port()
        self.controller_port = listen_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log = home / "server.log"
        self.properties = home / "server.properties"
        self.process: subprocess.Popen[bytes] | None = None
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.log_dir),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "log.segment.bytes": "1048576",
            "log.index.interval.bytes": "512",
            "log.retention.check.interval.ms": "1000",
            "log.segment.delete.delay.ms": "0",
            "log.cleaner.backoff.ms": "500",
            "log.cleaner.min.compaction.lag.ms": "0",
            "log.cleaner.min.cleanable.ratio": "0.01",
            "log.cleaner.dedupe.buffer.size": "4194304",
            "log.cleaner.delete.retention.ms": "1000",
        }
        home.mkdir(parents=True, exist_ok=True)
        self.properties.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))

    def format(self) -> None:
        cluster = base64_uuid()
        self.kafka.run("storage", "format", "--standalone", f"--cluster-id={cluster}", "-c", str(self.properties))

    def start(self, timeout: float = 180) -> None:
        """Start it and wait for its `Kafka Server started` line (and its port answering)."""
        started_lines = self.log_lines()
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                self.kafka.command("kafka.Kafka", str(self.properties), heap="512m", logging=self.kafka.broker_logging),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in the terminal is the harness's, not the broker's
            )
        deadline = time.monotonic() + timeout
        while not any("Kafka Server started" in line for line in self.log_lines()[len(started_lines) :]):
            if self.process.poll() is not None:
                errors = "\n".join(self.errors_since(len(started_lines))[:20])
                raise AssertionError(
                    f"the broker exited {self.process.returncode} as it started; its errors:\n{errors}\n"
                    f"its last lines:\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"the broker did not start in {timeout} s:\n{self.tail()}")
            time.sleep(0.1)
        with socket.create_connection(("127.0.0.1", self.port), timeout=10):
            pass

    def stop(self, timeout: float = 120) -> None:
        """SIGTERM, a clean shutdown (the broker writes its clean-shutdown marker); SIGKILL
        only if it hangs, and then the test fails."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
            raise AssertionError(f"the broker did not stop in {timeout} s of SIGTERM:\n{self.tail()}") from None
        if process.returncode not in (0, 143, -signal.SIGTERM):
            raise AssertionError(f"the broker exited {process.returncode} on SIGTERM:\n{self.tail()}")

    def log_lines(self) -> list[str]:
        try:
            return self.log.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return []

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_lines()[-lines:])

    def errors_since(self, line: int, expected: Sequence[str] = ()) -> list[str]:
        """The ERROR (and FATAL) lines it logged from `line` on that match none of `expected`."""
        return [
            text
            for text in self.log_lines()[line:]
            if re.match(r"\[[^]]*\] (ERROR|FATAL) ", text) and not any(re.search(p, text) for p in expected)
        ]

    def create_topic(self, name: str, partitions: int = 1, **configs: str) -> None:
        """A topic through the admin API (a Python client: no JVM start), with its configs given
        as keyword arguments, underscores for dots."""
        from kafka.admin import KafkaAdminClient, NewTopic

        # (The client warns when its event loop was held up, as on a loaded machine: not ours.)
        client_log = logging.getLogger("kafka")
        level = client_log.level
        client_log.setLevel(logging.ERROR)
        try:
            admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=60_000)
            try:
                topic_configs = {key.replace("_", "."): value for key, value in configs.items()}
                admin.create_topics([NewTopic(name, partitions, 1, topic_configs=topic_configs)])
            finally:
                admin.close()
        finally:
            client_log.setLevel(level)


def base64_uuid() -> str:
    """A cluster id as kafka-storage random-uuid prints one (no JVM start for it); it may begin
    with `-`, so it is given as `--cluster-id=ID`."""
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Kafka]:
    """Each Kafka version tested, by version."""
    work = tmp_path_factory.mktemp("kafka-tools")
    return {version: Kafka(version, work / version) for version in VERSIONS}


@pytest.fixture(scope="session")
def session_broker(kafka: dict[str, Kafka], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """The newest Kafka's broker, started once for the session (its start is the dearest thing
    here: 10-30 s on a loaded machine); stopped cleanly after the last test."""
    broker = Broker(kafka[NEWEST], tmp_path_factory.mktemp("broker"))
    broker.format()
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
        errors = broker.errors_since(0, SHUTDOWN_ERRORS)
        assert not errors, "the broker logged errors as it stopped:\n" + "\n".join(errors)


SHUTDOWN_ERRORS: tuple[str, ...] = ()


@pytest.fixture
def kafka_broker(session_broker: Broker, request: pytest.FixtureRequest) -> Iterator[Broker]:
    """The session's broker; the test fails if the broker logged an ERROR meanwhile that the
    test did not expect (`@pytest.mark.expect_broker_errors(pattern, ...)`)."""
    first = len(session_broker.log_lines())
    yield session_broker
    expected = [p for marker in request.node.iter_markers("expect_broker_errors") for p in marker.args]
    errors = session_broker.errors_since(first, expected)
    assert not errors, "the broker logged errors the test did not expect:\n" + "\n".join(errors)


# How long the producers may take to answer or end: a guard against a hang, generous for a
# loaded two-core machine.
PRODUCERS_DEADLINE_S = 120


@pytest.fixture(scope="session")
def producer_classes(kafka: dict[str, Kafka], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """LiveProducers.java compiled against the newest Kafka's client jar (that jar alone on
    javac's class path: the whole tools class path makes javac three times slower)."""
    newest = max(kafka.values(), key=lambda k: k.major)
    clients = [jar for jar in newest.classpath.split(":") if Path(jar).name.startswith("kafka-clients-")]
    javac = shutil.which("javac")
    if javac is None:
        pytest.fail("no `javac` on PATH: scripts/dev setup installs a JDK")
    out = tmp_path_factory.mktemp("live-producers")
    source = Path(__file__).parent / "LiveProducers.java"
    subprocess.run(
        [javac, "-J-XX:TieredStopAtLevel=1", "-J-XX:+UseSerialGC", "-d", str(out), "-cp", clients[0], str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


class Producers:
    """LiveProducers (an idempotent and a transactional producer in one JVM), fed lines."""

    def __init__(self, broker: Broker, classes: Path, transactional_id: str, stderr: Path) -> None:
        command = broker.kafka.command("LiveProducers", broker.bootstrap, transactional_id)
        at = command.index("-cp") + 1
        command[at] = f"{classes}:{command[at]}"
        self.stderr = stderr
        with open(stderr, "wb") as err:
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)

    def line(self, *fields: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(("\t".join(fields) + "\n").encode())

    def send(self, producer: str, topic: str, key: str, value: str, headers: str) -> None:
        self.line("send", producer, topic, key, value, headers)

    def sync(self) -> None:
        """Every record sent so far acknowledged (and a commit or abort before it done)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.line("sync")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], PRODUCERS_DEADLINE_S)
        said = self.process.stdout.readline() if ready else b""
        assert said == b"synced\n", f"the producers did not sync ({said!r}): {self.stderr.read_text()[-3000:]}"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            code = self.process.wait(timeout=PRODUCERS_DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
            raise
        finally:
            if self.process.stdout is not None:
                self.process.stdout.close()
        assert code == 0, f"the producers exited {code}: {self.stderr.read_text()[-3000:]}"
