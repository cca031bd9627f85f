"""A real S3 server on loopback for the object-storage tests: s3proxy (the jar `scripts/dev setup`
resolved with Maven, tests/interop/pom.xml) with its filesystem back-end in a temporary directory,
requests signed with a key pair of the test's. One server a worker process (its start costs
about 4 s of a JVM); each test gets a bucket of its own. The server is stopped with SIGTERM in
teardown, and a test fails if it logged an error the test did not expect (`server.expect`).

The environment the CLI and Spark read (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
`AWS_ENDPOINT_URL`, `AWS_REGION`) is set for the test's processes by `s3` (`monkeypatch`)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, listen_port
from tests.fs.conftest import mount  # noqa: F401 (a fixture: a mount point as the source of a backup)

CLASSPATH = REPO / "build" / "interop" / "s3proxy-4.1.0.classpath"
IDENTITY = "seglogfs-test-identity"
CREDENTIAL = "seglogfs-test-credential-not-secret"
REGION = "us-east-1"


class S3Server:
    """s3proxy serving the objects kept below `root`."""

    def __init__(self, root: Path) -> None:
        java = shutil.which("java")
        if java is None:
            pytest.fail("no `java` on PATH: the object-storage tests run s3proxy (scripts/dev setup installs a JRE)")
        if not CLASSPATH.is_file():
            pytest.fail(f"{CLASSPATH} is missing: run scripts/dev setup (it resolves s3proxy with Maven)")
        jar = CLASSPATH.read_text().strip()
        if not Path(jar).is_file():
            pytest.fail(f"s3proxy's jar is gone ({jar}): run scripts/dev setup")
        self.root = root
        self.data = root / "objects"
        self.data.mkdir(parents=True)
        self.port = listen_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        properties = root / "s3proxy.properties"
        properties.write_text(
            f"s3proxy.endpoint={self.endpoint}\n"
            "s3proxy.authorization=aws-v2-or-v4\n"
            f"s3proxy.identity={IDENTITY}\n"
            f"s3proxy.credential={CREDENTIAL}\n"
            "jclouds.provider=filesystem\n"
            f"jclouds.filesystem.basedir={self.data}\n"
        )
        self.log = root / "s3proxy.log"
        self._log_file = open(self.log, "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [
                java,
                "-Xmx256m",
                "-XX:TieredStopAtLevel=1",
                "-XX:+UseSerialGC",
                "-cp",
                jar,
                "org.gaul.s3proxy.Main",
                "--properties",
                str(properties),
            ],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "LOG_LEVEL": "warn"},
        )
        self._expected: list[re.Pattern[str]] = []
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.endpoint, timeout=1)
            except urllib.error.HTTPError:
                break  # (it answers: 403 to an unsigned request)
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"s3proxy did not start:\n{self.log.read_text(errors='replace')}") from None
                time.sleep(0.1)
            else:
                break

    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": IDENTITY,
            "AWS_SECRET_ACCESS_KEY": CREDENTIAL,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": REGION,
        }

    def new_bucket(self) -> str:
        """A bucket of its own (s3proxy's filesystem back-end: a directory below its root)."""
        name = f"b-{uuid.uuid4().hex[:16]}"
        (self.data / name).mkdir()
        return name

    def objects(self, bucket: str, prefix: str = "") -> dict[str, int]:
        """The objects of a bucket below `prefix` (as its back-end keeps them), with their sizes."""
        base = self.data / bucket
        return {
            str(path.relative_to(base)): path.stat().st_size
            for path in base.rglob("*")
            if path.is_file() and str(path.relative_to(base)).startswith(prefix) and ".mpus-" not in path.name
        }

    def pause(self) -> None:
        """A stalled server: it holds its connections and answers nothing (until `resume`)."""
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def expect(self, pattern: str) -> None:
        """An error line of the server's log the test expects (others fail it)."""
        self._expected.append(re.compile(pattern))

    def errors(self) -> list[str]:
        """The server's log lines at ERROR the test did not expect; forgets the expected."""
        text = self.log.read_text(errors="replace")
        found = [
            line
            for line in text.splitlines()
            if re.search(r"\bERROR\b", line) and not any(p.search(line) for p in self._expected)
        ]
        self._expected = []
        return found

    def stop(self) -> None:
        if self.process.poll() is None:
            self.resume()
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        self._log_file.close()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("s3proxy"))
    try:
        yield server
    finally:
        server.stop()


class S3:
    """The server, a bucket of the test's, and the environment set for the test's processes."""

    def __init__(self, server: S3Server, bucket: str) -> None:
        self.server = server
        self.bucket = bucket

    def uri(self, prefix: str = "backup") -> str:
        return f"s3://{self.bucket}/{prefix}"

    def uri_with_keys(self, prefix: str = "backup") -> str:
        """The URI with the endpoint and keys in its query: for processes started before the
        server was (a Spark JVM and its Python workers keep the environment they started with)."""
        return (
            f"{self.uri(prefix)}?endpoint_override=127.0.0.1:{self.server.port}&scheme=http&region={REGION}"
            f"&access_key={IDENTITY}&secret_key={CREDENTIAL}"
        )

    def objects(self, prefix: str = "") -> dict[str, int]:
        return self.server.objects(self.bucket, prefix)


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3]:
    if s3_server.process.poll() is not None:
        pytest.fail(f"s3proxy exited {s3_server.process.returncode}:\n{s3_server.log.read_text(errors='replace')}")
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    yield S3(s3_server, s3_server.new_bucket())
    s3_server.resume()  # (a test that paused it and failed)
    errors = s3_server.errors()
    assert not errors, "s3proxy logged errors:\n" + "\n".join(errors[:20])
