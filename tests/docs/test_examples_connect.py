"""The code blocks of the guides that say they work under Spark Connect, run on a Spark Connect session.

A local Connect server (``SparkSession.builder.remote("local[2, 2]")``, as
tests/runtime/test_connect.py starts it) takes the place of the page's classic ``local[2]``
session: the setup's session line (:data:`examples.SESSION_LINE`) is replaced by this module's
session, and every other line runs as written.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import examples  # noqa: E402

pytestmark = pytest.mark.integration  # tests/conftest.py: not in make test-fast's unit tier

#: The pages that say their examples run under Spark Connect, and where they say it.
CONNECT_PAGES = {
    "guides/stragglers.md": "it runs the same under Spark\nConnect",
    "guides/compression.md": "and under Spark Connect",
}


@pytest.fixture(scope="module")
def connect(tmp_path_factory):
    from pyspark.sql import SparkSession

    from sparkdl_avg import RECOMMENDED_CONF

    from pyspark import SparkContext

    active = SparkSession.getActiveSession()  # one JVM runs one SparkContext: the classic one goes first
    if active is not None:
        active.stop()
    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
    spark = (SparkSession.builder.remote("local[2, 2]")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.local.dir", str(tmp_path_factory.mktemp("connect-local")))
             .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
             .config(map=RECOMMENDED_CONF)
             .getOrCreate())
    try:
        yield spark
    finally:
        spark.stop()


@pytest.mark.parametrize("page", sorted(CONNECT_PAGES))
def test_the_pages_code_blocks_run_under_connect(connect, page, tmp_path, monkeypatch):
    text = (examples.DOCS / page).read_text(encoding="utf-8")
    assert " ".join(CONNECT_PAGES[page].split()) in " ".join(text.split()), f"docs/{page} no longer says it works under Connect"
    assert any(examples.SESSION_LINE in b for b in examples.blocks(page)), f"docs/{page}'s setup has no session line"
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__", "_connect_session": connect}
    warnings = [m for _b, m in examples.run(page, namespace, session_line="spark = _connect_session")
                if "slower than one process" not in m]  # the page says so: digits are too few for two workers
    assert namespace["spark"] is connect
    assert namespace["trainer"].stats.records, f"docs/{page}'s fit trained no round under Connect"
    assert not warnings, f"docs/{page}'s examples logged warnings under Connect: {warnings}"
