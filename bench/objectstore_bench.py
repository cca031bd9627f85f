"""Backups into object storage against a real S3 server on loopback (s3proxy, as the tests run it:
tests/objectstore/conftest.py), each ratio from one run against the same server.

    .venv/bin/python -m bench.objectstore_bench [--mib 512] [--partitions 4] [--rounds 1] [--dir DIR]

A data dir of `--partitions` partitions holding `--mib` MiB of 200-byte records in all (segments
of 64 MiB) is written with `seglogfs produce`. Then, into fresh prefixes of one bucket:

* backup: `seglogfs backup DATA s3://…` (its default of four uploads at once) vs the copy `aws s3
  sync` makes, done with pyarrow alone: `pyarrow.fs.copy_files` of the data dir's files to the
  bucket, with threads (every file as it is on disk, no catalogue, no consistency), in MiB/s of
  the data dir's bytes; and a second `seglogfs backup` with nothing new (what an incremental run
  costs when nothing changed), in seconds.

The server writes what it receives to the temporary dir's disk, as both sides' objects are: the
figures are of one machine, client and server sharing its cores (the load average is printed).
Results print as a table and are written to bench/results/objectstore.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.fs as pafs

from tests.objectstore.conftest import S3Server

RESULTS = Path(__file__).resolve().parent / "results"
SEGLOGFS = str(Path(sys.executable).parent / "seglogfs")
RECORD_BYTES = 200


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def produce(data: Path, mib: int, partitions: int) -> None:
    line = b"x" * (RECORD_BYTES - 1) + b"\n"
    per_partition = mib * 2**20 // RECORD_BYTES // partitions
    subprocess.run(
        [SEGLOGFS, "topics", str(data), "create", "--topic", "bench", "--partitions", str(partitions)],
        check=True,
        capture_output=True,
    )
    for partition in range(partitions):
        with subprocess.Popen(
            [
                SEGLOGFS,
                "produce",
                str(data),
                "--topic",
                "bench",
                "--partition",
                str(partition),
                "--override",
                f"log.segment.bytes={64 << 20}",
            ],
            stdin=subprocess.PIPE,
        ) as process:
            assert process.stdin is not None
            chunk = line * 10_000
            for _ in range(per_partition // 10_000):
                process.stdin.write(chunk)
            process.stdin.close()
            if process.wait() != 0:
                raise SystemExit("seglogfs produce failed")


def timed(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:3])} … exited {done.returncode}: {done.stderr[-2000:]}")
    return time.perf_counter() - started


def pyarrow_sync(data: Path, server: S3Server, bucket: str, prefix: str) -> float:
    """`aws s3 sync DATA s3://bucket/prefix`, with pyarrow alone (threads, its multipart)."""
    fs = pafs.S3FileSystem(
        access_key=server.env()["AWS_ACCESS_KEY_ID"],
        secret_key=server.env()["AWS_SECRET_ACCESS_KEY"],
        endpoint_override=server.endpoint.removeprefix("http://"),
        scheme="http",
        region="us-east-1",
    )
    started = time.perf_counter()
    pafs.copy_files(
        str(data),
        f"{bucket}/{prefix}",
        source_filesystem=pafs.LocalFileSystem(),
        destination_filesystem=fs,
        use_threads=True,
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--dir", type=Path, default=None, help="work dir (default: a temporary dir, removed after)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="seglog-objectstore-bench-", dir=args.dir))
    server = None
    try:
        data = work / "data"
        print(f"producing {args.mib} MiB into {args.partitions} partitions (load {load()}) ...", flush=True)
        produce(data, args.mib, args.partitions)
        size = sum(path.stat().st_size for path in data.rglob("*") if path.is_file())
        server = S3Server(work / "s3")
        bucket = server.new_bucket()
        env = {**os.environ, **server.env()}
        ours = theirs = again = float("inf")
        for round_ in range(args.rounds):
            theirs = min(theirs, pyarrow_sync(data, server, bucket, f"sync-{round_}"))
            ours = min(ours, timed([SEGLOGFS, "backup", str(data), f"s3://{bucket}/backup-{round_}"], env))
            again = min(again, timed([SEGLOGFS, "backup", str(data), f"s3://{bucket}/backup-{round_}"], env))
        mib = size / 2**20
        results = {
            "data_mib": round(mib, 1),
            "partitions": args.partitions,
            "rounds": args.rounds,
            "seglogfs_backup_mib_s": round(mib / ours, 1),
            "pyarrow_sync_mib_s": round(mib / theirs, 1),
            "ratio": round(theirs / ours, 2),
            "incremental_nothing_new_s": round(again, 2),
            "load": load(),
        }
        print(f"{'':28} {'seglogfs':>10} {'pyarrow':>10} {'ratio':>7}")
        print(
            f"{'backup, MiB/s':28} {results['seglogfs_backup_mib_s']:>10} {results['pyarrow_sync_mib_s']:>10} "
            f"{results['ratio']:>7}"
        )
        print(f"{'backup again, nothing new':28} {again:>9.2f}s")
        print(f"load {load()}")
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "objectstore.json").write_text(json.dumps(results, indent=2) + "\n")
    finally:
        if server is not None:
            server.stop()
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
