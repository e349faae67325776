"""A fit's memory (issue 47): the estimate and refusal before the first round, the peaks recorded in ``trainer.stats``,
no model-sized temporary file, and what a killed fit leaves swept by the next."""

import json
import os
import subprocess
import sys
import tempfile
import types

import numpy as np
import pytest

from conftest import make_model
from sparkdl_avg import ParameterAveragingTrainer
from sparkdl_avg.driver.data import staging_roots
from sparkdl_avg.driver.observe import memory
from sparkdl_avg.errors import ConfigurationError
from sparkdl_avg.shared.model.modelspec import ModelSpec, check_model_loads
from sparkdl_avg.shared.wire.stats import PeakMemory, TrainingStats, WorkerRecord


def _engine(one_host=True, conf=None):
    conf = dict(conf or {})
    return types.SimpleNamespace(one_host=one_host, conf=conf.get)


def test_estimate_counts_the_sums_the_replica_and_training():
    mb = 1 << 20
    est = memory.estimate(100 * mb, 200 * mb, 100 * mb)  # Adam on one table: weights, two moments
    fixed = memory.FIXED_BYTES
    assert est.state_bytes == 300 * mb
    assert est.driver_bytes == pytest.approx(300 * mb + 450 * mb + fixed)  # sums + 4.5 arrays (the state sent: none)
    assert est.worker_bytes == pytest.approx(300 * mb + 225 * mb + 250 * mb + memory.WORKER_FIXED_BYTES)  # replica + training
    local = memory.estimate(100 * mb, 200 * mb, 100 * mb, local_optimizer=True)
    # the weights' sums only, and the state's bases the "spark" transport sends patches against
    assert local.driver_bytes == pytest.approx(100 * mb + 300 * mb + 450 * mb + fixed)
    assert local.worker_bytes == est.worker_bytes  # a replica and its training whatever travels


def test_a_fit_that_cannot_fit_is_refused_naming_the_numbers_and_the_fixes(monkeypatch):
    import keras

    # float64: 4·256 + 256 + 256 + 1 parameters, weights and two Adam moments
    model = make_model(hidden=256, optimizer=keras.optimizers.Adam())
    weights, optimizer, _ = memory.model_state_sizes(model)
    assert weights == 8 * (4 * 256 + 256 + 256 + 1) and optimizer > 2 * weights
    monkeypatch.setattr(memory, "available_memory", lambda: 100_000_000)  # 0.1 GB: the driver's 0.02 GB fits
    with pytest.raises(ConfigurationError) as err:
        memory.check_memory(model, _engine(), num_workers=4, average_optimizer=True, local_optimizer=False)
    text = str(err.value)
    assert "each of the 4 workers per host needs about 0.10 GB, 0.02 GB is available to each" in text
    assert "this machine's available memory (0.10 GB), shared by the driver and its 4 workers" in text
    assert "the driver needs" not in text
    # Only what would make it fit is offered (a fresh trial, issue 60: "local" was offered, and refused again): each
    # worker holds a whole replica and its optimizer's variables whatever travels, and one worker alone is too many.
    assert text.endswith("What would make it fit: a machine with more memory: even one worker needs about 0.12 GB.")
    assert "num_workers=" not in text and "optimizer_state" not in text
    # With 0.3 GB two workers fit: that is what it offers
    monkeypatch.setattr(memory, "available_memory", lambda: 300_000_000)
    with pytest.raises(ConfigurationError, match=r"What would make it fit: num_workers=2 \(fewer workers on a host, "
                                                 r"each with more of its memory\); a machine with more memory: even "
                                                 r"one worker needs about 0\.12 GB\.$"):
        memory.check_memory(model, _engine(), num_workers=4, average_optimizer=True, local_optimizer=False)


def test_an_unbuilt_optimizers_variables_are_counted_without_building_them():
    import keras

    for optimizer, slots in ((keras.optimizers.Adam(), 2), (keras.optimizers.SGD(0.1, momentum=0.9), 1),
                             (keras.optimizers.SGD(0.1), 0), (keras.optimizers.Adam(amsgrad=True), 3)):
        model = make_model(hidden=256, optimizer=optimizer)
        assert not model.optimizer.built
        got = memory.model_state_sizes(model)
        assert not model.optimizer.built  # a fit refused for memory has not allocated the slots
        model.optimizer.build(model.trainable_variables)
        assert got == memory.model_state_sizes(model), optimizer  # the same bytes as the built optimizer's
        assert got[1] >= slots * got[0], optimizer


def test_a_fit_that_fits_is_not_refused_and_a_cluster_reads_the_executors_memory(monkeypatch):
    model = make_model(hidden=256)
    monkeypatch.setattr(memory, "available_memory", lambda: 16 << 30)
    est = memory.check_memory(model, _engine(), num_workers=2, average_optimizer=True, local_optimizer=False)
    assert est.problems() == [] and est.workers_per_host == 2
    cluster = _engine(one_host=False, conf={"spark.executor.memory": "800m", "spark.executor.cores": "4"})
    est = memory.check_memory(model, cluster, num_workers=8, average_optimizer=True, local_optimizer=False)
    assert (est.workers_per_host, est.worker_available) == (4, 200 << 20)
    cluster = _engine(one_host=False, conf={"spark.executor.pyspark.memory": "200m", "spark.executor.cores": "4"})
    with pytest.raises(ConfigurationError, match=r"spark.executor.pyspark.memory=200m shared by 4 task slots"):
        memory.check_memory(model, cluster, num_workers=8, average_optimizer=True, local_optimizer=False)
    assert memory.parse_size("2g") == 2 << 30 and memory.parse_size("512") == 512 << 20


def test_peak_memory_is_the_peak_since_its_start_above_the_level_then():
    PeakMemory()  # an earlier, higher peak of this process must not count
    held = np.ones(64 << 20, np.uint8)
    del held
    memory_ = PeakMemory()
    if memory_.start is None:
        pytest.skip("no /proc/self/clear_refs here")
    assert memory_.above() < 16 << 20  # the 64 MB freed before the start does not count
    held = np.ones(64 << 20, np.uint8)
    assert memory_.above() >= 60 << 20
    del held


def test_worker_peaks_are_above_each_workers_level_at_its_first_task_of_the_fit():
    def worker(pid, start, peak):
        return WorkerRecord(worker=0, host="h", pid=pid, examples=1, start=0.0, end=1.0, memory_start=start,
                            memory_peak=peak)

    stats = TrainingStats()
    for workers in ([worker(1, 100, 500), worker(2, 100, 300)], [worker(1, 400, 450), worker(2, 300, 900)],
                    [worker(3, None, None)]):  # a worker that could not say
        stats.add(types.SimpleNamespace(workers=workers))  # the rounds' records, as far as memory goes
    assert stats.worker_peak_memory() == {("h", 1): 400, ("h", 2): 800}
    assert stats.driver_peak_memory is None


def test_the_spec_and_the_replica_write_no_temporary_file(monkeypatch):
    """Issue 47: each worker wrote the whole model with its optimizer state to a temporary .keras file."""

    def refuse(*args, **kwargs):
        raise AssertionError("a temporary file was made")

    for name in ("mkstemp", "mkdtemp", "TemporaryDirectory", "NamedTemporaryFile", "TemporaryFile"):
        monkeypatch.setattr(tempfile, name, refuse)
    spec = ModelSpec.from_model(make_model(hidden=64))
    check_model_loads(spec)
    spec.build()


def test_a_fit_records_its_peak_memory_and_sweeps_what_a_killed_fit_left(spark, tmp_path):
    base = tmp_path / "staging"
    dead = base / "sparkdl_avg-20250101-000000-abc"
    state = dead / "exchange-1" / "e0-r0"
    state.mkdir(parents=True)
    (state / "state-0.bin").write_bytes(b"\0" * (1 << 20))  # a round's state file of a driver killed mid-fit
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with open(dead / staging_roots.MARKER, "w") as f:
        json.dump({**staging_roots.owner_record(), "pid": gone.pid}, f)

    x = np.random.default_rng(0).normal(size=(64, 4))
    with ParameterAveragingTrainer(make_model(), num_workers=2, batch_size=8, staging_dir=str(base),
                                   state_transport="files") as trainer:
        trainer.fit((x, x.sum(axis=1)), epochs=1, verbose=0)
        summary = trainer.stats.summary()
        report = trainer.write_report(str(tmp_path / "report.html"))
        leftovers = os.listdir(trainer._staging_root)
    assert not dead.exists()
    if PeakMemory().start is None:
        pytest.skip("no /proc/self/clear_refs here")
    assert 0 <= summary["driver_peak_memory_bytes"] < 2 << 30
    assert 0 < summary["worker_peak_memory_bytes"] < 2 << 30
    assert len(trainer.stats.worker_peak_memory()) >= 1
    assert "peak memory above the fit's start: driver +" in open(report).read()
    assert not [name for name in leftovers if name.startswith("exchange")]  # a fit's round files go with its rounds
