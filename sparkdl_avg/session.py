"""Which Spark a call runs on — a classic session or Spark Connect — and how its jobs are launched and labelled.

This module owns the driver's view of Spark itself (as opposed to the data or
the round). :func:`engine_for` finds the session that owns the data a user
passes and wraps it in an :class:`Engine`, the one object the rest of the
driver asks for the master, the default parallelism, job labels and
"``n`` tasks of this Arrow function" jobs. Only a classic engine has a
``SparkContext`` (:attr:`Engine.sc`); under Spark Connect there is none, and
everything a fit needs goes through DataFrame APIs
(``spark.range(n, numPartitions=n).mapInArrow(...)``), which run the same on both.
"""

from __future__ import annotations

import contextlib
import functools
import re
from typing import Any, Callable, Optional

from .errors import DataError

_TAG = re.compile(r"[^A-Za-z0-9_.-]+")


def is_connect(spark) -> bool:
    """Whether ``spark`` is a Spark Connect session (no SparkContext, no RDDs, no broadcasts)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


class Engine:
    """One Spark session as the trainer uses it.

    Attributes:
        spark: The ``SparkSession`` (classic or Connect).
        connect: Whether it is a Spark Connect session.
        sc: The ``SparkContext`` of a classic session; ``None`` under Connect.
    """

    def __init__(self, spark) -> None:
        self.spark = spark
        self.connect = is_connect(spark)
        self.sc = None if self.connect else spark.sparkContext
        self._parallelism: Optional[int] = None

    @property
    def master(self) -> str:
        """The master URL (``local[2]``, ``spark://...``, ``yarn``)."""
        if self.sc is not None:
            return self.sc.master
        return self.spark.conf.get("spark.master", "") or ""

    @property
    def one_host(self) -> bool:
        """Whether every executor runs on the driver's host: ``local[N]`` and ``local-cluster[...]``.

        Under Connect the "driver" is the server's; the client may be elsewhere.
        """
        return self.master.startswith("local")

    @property
    def default_parallelism(self) -> int:
        """The cluster's default parallelism (task slots), which ``num_workers=None`` means.

        Connect has no ``defaultParallelism``: it is read from the master
        (``local[N]``, ``local-cluster[W,C,M]``) or ``spark.default.parallelism``,
        else measured once with a small job (the partitions of ``spark.range``,
        which the server sizes by its default parallelism).
        """
        if self._parallelism is None:
            self._parallelism = self._find_parallelism()
        return self._parallelism

    def _find_parallelism(self) -> int:
        if self.sc is not None:
            return int(self.sc.defaultParallelism)
        configured = self.spark.conf.get("spark.default.parallelism", None)
        if configured:
            return int(configured)
        m = re.fullmatch(r"local\[(\d+)(?:,\s*\d+)?\]", self.master)
        if m:
            return int(m.group(1))
        m = re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*\d+\]", self.master)
        if m:
            return int(m.group(1)) * int(m.group(2))
        from pyspark.sql import functions as F

        row = self.spark.range(1 << 16).select(F.spark_partition_id().alias("p")).agg(F.max("p")).first()
        return int(row[0]) + 1

    @contextlib.contextmanager
    def labels(self, description: str, group: Optional[str] = None):
        """Labels the Spark jobs started inside the block, restoring the caller's labels.

        Classic: the job description and group the Spark UI shows. Connect
        has neither; the jobs get tags instead (``spark.addTag``: the group,
        and the description made tag-safe), which its UI lists and
        ``spark.interruptTag`` can cancel.
        """
        if self.sc is not None:
            with spark_job_labels(self.sc, description, group):
                yield
            return
        tags = [t for t in (group, _TAG.sub("_", description)[:120]) if t]
        tags = [t for t in tags if t not in self.spark.getTags()]
        for tag in tags:
            self.spark.addTag(tag)
        try:
            yield
        finally:
            for tag in tags:
                self.spark.removeTag(tag)

    def run_tasks(self, n: int, body: Callable, schema: str, start: int = 0):
        """Runs ``body`` (a ``mapInArrow`` function) in ``n`` tasks, task ``i`` getting the ids ``[start + i]``.

        Returns the lazy DataFrame of what the tasks yield (``schema``, a
        DDL string), for the caller to transform further or bring back with
        ``toArrow()``.
        """
        return self.spark.range(start, start + n, numPartitions=n).mapInArrow(body, struct_type(schema))

    def broadcast(self, value: Any):
        """A Spark broadcast of ``value`` (classic sessions only)."""
        if self.sc is None:
            raise RuntimeError("Spark Connect has no broadcasts; ship the value through the staging directory.")
        return self.sc.broadcast(value)


@functools.lru_cache(maxsize=64)
def struct_type(ddl: str):
    """The ``StructType`` of a DDL string, parsed once per process.

    ``mapInArrow(f, "a int, ...")`` parses its string schema on every call,
    and under Spark Connect that is a round trip to the server (an
    ``AnalyzePlan`` request): once per round, before this cache.
    """
    from pyspark.sql.types import DataType

    return DataType.fromDDL(ddl)


@contextlib.contextmanager
def spark_job_labels(sc, description: str, group: Optional[str] = None):
    """Labels the Spark jobs started inside the block (Spark UI), restoring the caller's labels."""
    keys = ("spark.job.description", "spark.jobGroup.id")
    saved = [sc.getLocalProperty(k) for k in keys]
    sc.setLocalProperty("spark.job.description", description)
    if group is not None:
        sc.setLocalProperty("spark.jobGroup.id", group)
    try:
        yield
    finally:
        for key, value in zip(keys, saved):
            sc.setLocalProperty(key, value)


def engine_for(data: Any) -> Engine:
    """The :class:`Engine` of the session that owns ``data``, or of the active session for numpy arrays.

    Raises:
        DataError: RDD input under Spark Connect (there are no RDDs: pass a
            DataFrame), or numpy arrays without an active session.
    """
    from pyspark import RDD
    from pyspark.sql import DataFrame, SparkSession

    if isinstance(data, DataFrame):
        return Engine(data.sparkSession)
    active = SparkSession.getActiveSession()
    if isinstance(data, RDD):
        if active is not None and is_connect(active):
            raise DataError(
                "The data must be a Spark DataFrame or a tuple (x, y) of numpy arrays under Spark Connect, "
                "which has no RDDs (spark.createDataFrame(...) with 'features' and 'label' columns). "
                "Got an RDD instead."
            )
        return Engine(SparkSession(data.context) if active is None else active)
    if active is None:
        from pyspark import SparkContext

        sc = SparkContext._active_spark_context
        if sc is None:
            raise DataError(
                "Training on numpy arrays needs an active SparkSession; create one with "
                "SparkSession.builder.getOrCreate() first."
            )
        active = SparkSession(sc)
    return Engine(active)
