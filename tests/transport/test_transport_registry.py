"""The transports' and aggregation paths' registries, the settings record, and every path's assembly, without Spark.

Each aggregation path of the Spark SQL round is a class found by name; its
assembly is written once against the sums' layout protocol, for plain and
compressed sums alike. Here every path runs in-process (the workers' sinks,
the reducers' body, the driver's assembly) and must give bitwise the sums
of the others.
"""

from __future__ import annotations

import types

import numpy as np
import pyarrow as pa
import pytest

from sparkdl_avg import ConfigurationError
from sparkdl_avg.driver.config import options
from sparkdl_avg.driver.config.options import AGGREGATIONS, TRANSPORTS
from sparkdl_avg.driver.transport import base, policy, sql_paths
from sparkdl_avg.driver.transport.base import TransportSettings
from sparkdl_avg.shared.registry import Registry
from sparkdl_avg.shared.wire import round_rows
from sparkdl_avg.shared.wire.aggregation import PartialResult
from sparkdl_avg.shared.wire.delta_sums import DeltaLayout
from sparkdl_avg.shared.wire.exchange import FlatLayout
from sparkdl_avg.shared.wire.stats import WorkerRecord


def test_the_options_values_are_auto_and_the_registered_names_each_naming_its_class():
    for option, registry in (("state_transport", TRANSPORTS), ("aggregation", AGGREGATIONS)):
        row = options.option(option)
        assert tuple(row.check.choices) == tuple(row.cli.choices) == ("auto", *registry.names())
        for name in registry.names():
            assert registry.get(name).name == name and name in registry
    assert TRANSPORTS.names() == ("spark", "files", "sql") and "auto" not in TRANSPORTS


def test_the_registered_paths_are_these():
    assert {n: TRANSPORTS.get(n).__name__ for n in TRANSPORTS.names()} == {
        "spark": "SparkTransport", "files": "FileTransport", "sql": "SqlTransport"}
    assert {n: (AGGREGATIONS.get(n).__name__, AGGREGATIONS.get(n).sharded) for n in AGGREGATIONS.names()} == {
        "driver": ("DriverSum", False), "files": ("FilesSum", False), "shuffle": ("ShuffleSum", True),
        "storage": ("StorageSum", True)}
    assert [n for n in TRANSPORTS.names() if TRANSPORTS.get(n).connect] == ["sql"]
    assert [n for n in AGGREGATIONS.names() if AGGREGATIONS.get(n).standing] == ["files"]
    assert [n for n in AGGREGATIONS.names() if AGGREGATIONS.get(n).inline] == ["driver"]


def test_an_unknown_name_is_refused_naming_the_option_and_the_names_there_are():
    with pytest.raises(ConfigurationError, match=r"The 'aggregation' parameter names no aggregation path: it must be "
                                                 r"one of 'driver', 'files', 'shuffle', 'storage' \(or 'auto'\). "
                                                 r"Got 'tree' instead\."):
        AGGREGATIONS.get("tree")
    with pytest.raises(ConfigurationError, match=r"'state_transport' parameter names no state transport: .*'spark'.* "
                                                 r"Got 'mpi' instead\."):
        TRANSPORTS.get("mpi")
    engine = types.SimpleNamespace(master="local[2]", one_host=True, connect=False, in_process=False)
    with pytest.raises(ConfigurationError, match=r"Got 'mpi' instead"):
        policy.choose(TransportSettings("mpi"), engine, "/tmp", "exchange-1")
    with pytest.raises(ConfigurationError, match=r"Got 'tree' instead"):
        policy.plan_aggregation("tree", None, 2, 1000)


def test_a_name_is_registered_once():
    registry = Registry("aggregation", "aggregation path")

    class One:
        name = "one"

    class Other:
        name = "one"

    assert registry.register(One) is One and registry.register(One) is One  # again: the same class, fine
    with pytest.raises(ValueError, match=r"^Aggregation path Other needs a name of its own: 'one' is taken by "
                                         r"\S*test_transport_registry\.test_a_name_is_registered_once\.<locals>\.One\.$"):
        registry.register(Other)
    with pytest.raises(ValueError, match="needs a name of its own"):
        registry.register(type("Nameless", (), {"name": ""}))

    class One:  # noqa: F811  (defined again, as a notebook cell run twice: replaces itself)
        name = "one"

    registry.register(One)
    assert registry.get("one") is One and registry.names() == ("one",)


def test_settings_are_one_frozen_record_and_shape_the_layout():
    settings = TransportSettings("sql", "shuffle", shards=3, compression="int8", feedback=(True, False, False))
    with pytest.raises(AttributeError):
        settings.mode = "spark"
    weights, optimizer = [np.zeros((4, 3), np.float32)], [np.zeros((), np.int64), np.zeros((4, 3), np.float32)]
    layout = settings.layout(weights, optimizer)
    assert isinstance(layout, DeltaLayout) and layout.flat == FlatLayout.of(weights, optimizer)
    plain = TransportSettings(optimizer_sums=False).layout(weights, optimizer)
    assert plain == FlatLayout.of(weights, None)


# ------------------------------------------------- every path's assembly, in-process


def _state(seed):
    rng = np.random.default_rng(seed)
    weights = [rng.normal(size=(300, 5)).astype(np.float32), rng.normal(size=7)]
    optimizer = [np.array(seed, np.float64), rng.normal(size=(300, 5)).astype(np.float32)]
    return weights, optimizer


def _result(layout, worker, sent):
    n = 3 + worker
    record = WorkerRecord(worker=worker, host="h", pid=1, examples=n, start=0.0, end=1.0)
    weights, optimizer = _state(10 + worker)
    if layout.compressed:
        packed, _ = layout.pack(weights, optimizer, *sent, examples=n, residual=None)
        return PartialResult(n, metric_sums={"loss": float(n)}, workers=[record], deltas=[(worker, packed)])
    sums = [np.array(a, np.float32 if a.dtype == np.float32 else np.float64) * n for a in weights + optimizer]
    return PartialResult(n, sums[:2], sums[2:], metric_sums={"loss": float(n)}, workers=[record])


@pytest.mark.parametrize("compression", [None, "int8"])
def test_every_aggregation_path_assembles_bitwise_the_same_sums(compression, tmp_path):
    sent = _state(0)
    layout = TransportSettings(compression=compression, feedback=(False, False, False)).layout(*sent)
    sums = {}
    for name in AGGREGATIONS.names():
        path = AGGREGATIONS.get(name)()
        shards = 3 if path.sharded else 1
        directory = str(tmp_path / name)
        sink = path.sink(directory, layout, shards)
        batches = [sink.deliver(_result(layout, w, sent), f"w{w}") for w in range(4)]
        if path.sharded:  # the reducers' body, all shards in one call
            batches = list(round_rows.reduce_shuffled(layout, shards, batches))
        table = pa.Table.from_batches(batches, round_rows.round_arrow_schema())
        results, pieces, _ = sql_paths.read_rows(table)
        total, read = sql_paths.assemble(results, pieces, layout, path, shards, "Round 0", directory)
        assert total.examples == 3 + 4 + 5 + 6 and total.delta_sums == (compression is not None)
        assert read == (4 * layout.nbytes if name == "files" else 0) or name not in ("driver", "files", "shuffle", "storage")
        sums[name] = total.weight_sums + total.optimizer_sums
    for name, arrays in sums.items():
        for got, want in zip(arrays, sums["driver"]):
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name


def test_both_layouts_follow_the_sums_protocol():
    sent = _state(0)
    for layout in (FlatLayout.of(*sent), DeltaLayout(FlatLayout.of(*sent), "bf16", (False,) * 3)):
        for method in ("encode", "value_bytes", "store_file", "read_shard", "add", "summed_bytes", "parse_summed",
                       "sums"):
            assert callable(getattr(layout, method)), (type(layout).__name__, method)
        assert isinstance(layout.compressed, bool) and layout.nbytes > 0
