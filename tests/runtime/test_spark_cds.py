"""scripts/spark_cds.py: the class-data-sharing archive the suite's Spark JVMs map.

docs/benchmarks/test_suite_time.md says what it saves.
"""

import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import spark_cds  # noqa: E402


def test_the_archive_is_named_for_its_venv_its_pysparks_jars_and_its_java(monkeypatch, tmp_path):
    import pyspark

    path = spark_cds.archive_path()
    assert path.startswith(os.path.join(sys.prefix, "spark-cds", f"spark-{pyspark.__version__}-"))
    assert path.endswith(".jsa")
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text("")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))  # another java: another archive
    assert spark_cds.archive_path() not in (None, path)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "none"))  # no java there: no archive
    assert spark_cds.archive_path() is None


def test_an_archive_that_cannot_be_built_leaves_none_behind_and_says_why(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sys, "prefix", str(tmp_path))  # where a new archive would go
    assert spark_cds.ensure_archive(python="/bin/false") is None
    assert "scripts/spark_cds.py: no class-data-sharing archive, Spark JVMs start without one: the probe session " \
           "failed (1)" in capsys.readouterr().err
    assert os.listdir(tmp_path / "spark-cds") == []  # no partial archive


def test_the_suites_spark_jvm_maps_the_archive(spark):
    found = re.search(r"-XX:SharedArchiveFile=(\S+)", os.environ.get("SPARK_SUBMIT_OPTS", ""))
    if found is None:
        pytest.skip("SPARK_SUBMIT_OPTS was set outside the suite without an archive")
    pid = spark._jvm.java.lang.ProcessHandle.current().pid()
    with open(f"/proc/{pid}/maps") as f:
        assert found.group(1) in f.read()
