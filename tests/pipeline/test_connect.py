"""The issue's sequences over Spark Connect: a DataFrame and a temp view queried again and again
from a Connect client answer each query from its own filters and see appended records, as a
classic session's do (tests/pipeline/test_queries.py). The client runs in its own process
(`connect_job`): pyspark's local Connect server needs a JVM of its own. The server is the
`spark-connect` jar pyspark ships; the client's packages (`pyspark[connect]`: grpcio, pandas…)
come with the test extra at set-up, so nothing is downloaded when the test runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.pipeline.test_queries import REPO, new_orders


def test_a_connect_client_answers_each_query_from_its_own_filters(tmp_path: Path) -> None:
    data = new_orders(tmp_path / "data")
    job = subprocess.run(
        [sys.executable, "-m", "tests.pipeline.connect_job", str(data)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,  # its stderr shown below
    )
    assert job.returncode == 0, job.stderr[-4000:]
    answers = json.loads(job.stdout.strip().splitlines()[-1])
    assert answers["session"] == "pyspark.sql.connect.session"
    assert answers["dataframe"] == [300, 150, 300]
    assert answers["partition_then_all"] == [100, 300]
    assert answers["temp_view"] == [15, 300]
    assert answers["after_append"] == [310, 310]
