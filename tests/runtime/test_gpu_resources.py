"""GPU scheduling with fake GPUs: each task's process is bound to the GPUs Spark assigned to it.

A discovery script reports two GPUs ("0" and "1") for the worker of a
``local-cluster[1,2,1024]`` (one executor JVM with two cores), executors ask
for both and each task for one (``spark.task.resource.gpu.amount=1``), so
two tasks run at once on different GPUs. Every task runs
``sparkdl_avg.shared.model.devices.configure_task_devices`` (what the executor-side
worker calls before it builds a replica) and reports what Spark assigned and
what the process' ``CUDA_VISIBLE_DEVICES`` became. Python workers are not
reused here, so every task starts a fresh process (as the first task of a
reused worker does). No GPU or TensorFlow is involved.
"""

import os
import stat
import time

import pytest

from conftest import spark_session

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory):
    script = str(tmp_path_factory.mktemp("gpu") / "discover_gpus.sh")
    with open(script, "w") as f:
        f.write('#!/usr/bin/env bash\necho \'{"name": "gpu", "addresses": ["0", "1"]}\'\n')
    os.chmod(script, os.stat(script).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    with spark_session(
        "local-cluster[1,2,1024]",
        "sparkdl_avg-gpu-test",
        **{
            "spark.executor.memory": "768m",
            "spark.executor.cores": "2",
            "spark.worker.resource.gpu.amount": "2",
            "spark.worker.resource.gpu.discoveryScript": script,
            "spark.executor.resource.gpu.amount": "2",
            "spark.executor.resource.gpu.discoveryScript": script,
            "spark.task.resource.gpu.amount": "1",
            "spark.python.worker.reuse": "false",
        },
    ) as session:
        yield session


def test_each_task_sees_exactly_the_gpu_spark_assigned(gpu_cluster):
    sc = gpu_cluster.sparkContext

    # Defined here so that cloudpickle ships it by value (executors cannot import test modules).
    def _probe(index):
        import os
        import time

        from pyspark import TaskContext

        from sparkdl_avg.shared.model import devices

        before = os.environ.get(devices.VISIBLE_DEVICES_ENV)
        ctx = TaskContext.get()
        binding = devices.configure_task_devices()
        time.sleep(1.0)  # overlap with the other task, so the two GPUs are in use at once
        return {
            "partition": ctx.partitionId(),
            "assigned": list(ctx.resources()["gpu"].addresses),
            "action": binding.action,
            "before": before,
            "visible": os.environ.get(devices.VISIBLE_DEVICES_ENV),
            "growth": os.environ.get(devices.MEMORY_GROWTH_ENV),
            "pid": os.getpid(),
        }

    start = time.time()
    results = sc.parallelize(range(4), 4).map(_probe).collect()
    print(f"probe job: {time.time() - start:.1f} s")
    assert len(results) == 4
    for r in results:
        assert len(r["assigned"]) == 1 and r["assigned"][0] in {"0", "1"}, r
        assert r["before"] is None, r  # nothing set it before the task
        assert r["action"] == "bind", r
        assert r["visible"] == r["assigned"][0], r
        assert r["growth"] == "true", r
    # Tasks ran two at a time on different GPUs: both addresses were handed out.
    assert {r["assigned"][0] for r in results} == {"0", "1"}
    assert len({r["pid"] for r in results}) == 4  # one process per task (no reuse)
