"""Which Spark session a call runs on, and how the jobs it starts are labelled.

This module owns the driver's view of Spark itself (as opposed to the data or
the round): finding the SparkContext for the data a user passes, and
labelling the jobs a fit, a round or an evaluation starts so the Spark UI
names them.
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional

from .errors import DataError


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


def spark_context_for(data: Any):
    """The SparkContext that owns ``data``, or the active one for numpy arrays."""
    from pyspark import RDD, SparkContext
    from pyspark.sql import DataFrame

    if isinstance(data, DataFrame):
        return data.sparkSession.sparkContext
    if isinstance(data, RDD):
        return data.context
    sc = SparkContext._active_spark_context
    if sc is None:
        raise DataError(
            "Training on numpy arrays needs an active SparkSession; create one with "
            "SparkSession.builder.getOrCreate() first."
        )
    return sc
