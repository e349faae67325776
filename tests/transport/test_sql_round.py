"""The Spark SQL round on a classic session: its formats, its sharding, and that every path sums the same.

``state_transport="sql"`` runs each round as ``spark.range(N).mapInArrow``;
the workers' sums come back as raw Arrow bytes, summed on the driver, by
``S`` shuffle reducers or by ``S`` reducers reading the workers' files
(:mod:`sparkdl_avg.driver.transport.sql_paths`). Every path adds the same numbers in worker
order, so at 3 workers (where a tree could add in another order) the
trained float64 weights must be bitwise those of the other transports.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import make_model, regression_data
from sparkdl_avg import ParameterAveragingTrainer
from sparkdl_avg.shared.wire import exchange
from sparkdl_avg.driver.transport import murmur3, policy as transport
from sparkdl_avg.driver.transport.base import TransportSettings
from sparkdl_avg.driver.transport.spark import SparkTransport
from sparkdl_avg.driver.transport.sql import SqlTransport
from sparkdl_avg.shared.wire.aggregation import PartialResult, merge

X, Y = regression_data(288, seed=8)


def _sums(seed, n):
    rng = np.random.default_rng(seed)
    weights = [rng.normal(size=(5, 3)).astype(np.float32) * n, rng.normal(size=7) * n, np.array(float(n))]
    optimizer = [np.array(4.0 * n), rng.normal(size=(2, 2)).astype(np.float32) * n]
    return weights, optimizer


@pytest.mark.parametrize("shards", [1, 2, 3, 7, 40])
def test_shards_of_a_flat_layout_join_back_to_the_arrays(shards):
    weights, optimizer = _sums(1, 3)
    layout = exchange.FlatLayout.of(weights, optimizer)
    assert layout.sizes == (15 + 4, 7 + 1 + 1)
    assert layout.nbytes == 4 * 19 + 8 * 9
    f32, f64 = layout.flatten(weights, optimizer)
    pieces = [layout.parse_shard(layout.shard_bytes(f32, f64, j, shards), j, shards) for j in range(shards)]
    assert sum(len(p[0]) + len(p[1]) for p in pieces) == 28  # every element in exactly one shard
    got_w, got_o = layout.join(pieces)
    for got, want in zip(got_w + got_o, weights + optimizer):
        assert got.shape == np.shape(want) and got.dtype == (np.float32 if want.dtype == np.float32 else np.float64)
        np.testing.assert_array_equal(got, want)


def test_summing_shard_by_shard_equals_summing_whole_partials_in_worker_order():
    parts = [_sums(seed, n) for seed, n in enumerate([3, 5, 8, 2])]
    layout = exchange.FlatLayout.of(*parts[0])
    expected = None
    for w, o in parts:
        expected = merge(expected, PartialResult(1, [np.array(a) for a in w], [np.array(a) for a in o]))
    shards = 3
    flat = [layout.flatten(w, o) for w, o in parts]
    summed = []
    for j in range(shards):
        acc = None
        for f32, f64 in flat:
            acc = exchange.add_slices(acc, layout.parse_shard(layout.shard_bytes(f32, f64, j, shards), j, shards))
        summed.append(acc)
    got_w, got_o = layout.join(summed)
    for got, want in zip(got_w + got_o, expected.weight_sums + expected.optimizer_sums):
        np.testing.assert_array_equal(got, want)  # bitwise: the same additions in the same order


def test_plan_aggregation_sums_small_rounds_on_the_driver_and_shards_large_ones():
    assert transport.plan_aggregation("auto", None, 2, 24 << 20) == ("driver", 1)  # 48 MB in all
    assert transport.plan_aggregation("auto", None, 2, 50 << 20) == ("storage", 2)
    assert transport.plan_aggregation("auto", None, 8, 100 << 10) == ("driver", 1)
    assert transport.plan_aggregation("auto", None, 8, 12 << 20) == ("storage", 8)
    assert transport.plan_aggregation("auto", None, 16, 4 << 20) == ("storage", 16)
    assert transport.plan_aggregation("auto", None, 64, 1 << 20) == ("storage", 4)  # slices of at least 256 kB
    assert transport.plan_aggregation("shuffle", 5, 2, 1 << 10) == ("shuffle", 5)
    assert transport.plan_aggregation("driver", 5, 16, 1 << 30) == ("driver", 1)
    assert transport.plan_aggregation("storage", None, 2, 300 << 20) == ("storage", 5)  # slices of at most 64 MB


def test_on_hosts_of_their_own_auto_weighs_the_drivers_link_against_a_sharded_round():
    gbit = 125e6  # bytes/s
    # (N - 1)²/N · S / rate (the tree's N·S in, less the sharded round's exchange and its one S in) against the
    # sharded round's second stage, 0.3 s (measured, docs/benchmarks.md "On a shaped network")
    assert transport.plan_aggregation("auto", None, 8, 1_200_000, gbit) == ("driver", 1)  # 8 × 1e5 Adam: 59 ms
    assert transport.plan_aggregation("auto", None, 4, 12_000_000, gbit) == ("driver", 1)  # 4 × 1e6: 0.22 s
    assert transport.plan_aggregation("auto", None, 8, 12_000_000, gbit) == ("shuffle", 8)  # 8 × 1e6: 0.59 s
    assert transport.plan_aggregation("auto", None, 8, 7_000_000, gbit) == ("shuffle", 8)  # 8 × 7 MB: 0.34 s
    assert transport.plan_aggregation("auto", None, 8, 6_000_000, gbit) == ("driver", 1)  # 8 × 5e5: 0.29 s
    assert transport.plan_aggregation("auto", None, 3, 4_000_000, 12.5e6) == ("shuffle", 3)  # 100 Mbit/s: 0.43 s
    assert transport.plan_aggregation("auto", None, 4, 36_000_000, gbit) == ("shuffle", 4)  # 4 × 3e6: 0.65 s
    assert transport.plan_aggregation("storage", None, 8, 12_000_000, gbit) == ("storage", 8)  # asked for: kept
    # However fast the link, the driver does not take more than 64 MB of sums at once (2 workers × 40 MB).
    assert transport.plan_aggregation("auto", None, 2, 40_000_000, 100 * gbit) == ("shuffle", 2)


class _Engine:
    """What :func:`transport.choose` reads of an engine: a classic session whose executors are elsewhere."""

    connect = False
    in_process = False
    one_host = False
    master = "spark://elsewhere:7077"


def test_auto_on_a_multi_host_master_keeps_the_tree_for_small_rounds_and_shards_large_ones(tmp_path):
    root = f"s3://bucket/{tmp_path.name}"  # a URI: no directory is made for the tree
    small = transport.choose(TransportSettings(depth=1, num_workers=8, sums_bytes=1_200_000), _Engine(), root, "fit-1")
    assert isinstance(small, SparkTransport)
    big = transport.choose(TransportSettings(depth=1, num_workers=8, sums_bytes=12_000_000), _Engine(), str(tmp_path),
                           "fit-2")
    assert isinstance(big, SqlTransport) and big.plan(8, 12_000_000) == ("shuffle", 8)
    fast = transport.choose(TransportSettings(depth=1, num_workers=8, sums_bytes=6_000_000, network_rate="10gbit"),
                            _Engine(), root, "fit-3")
    assert isinstance(fast, SparkTransport)


def test_a_bad_network_rate_is_refused_naming_it():
    from sparkdl_avg.errors import ConfigurationError

    for bad in ("fast", "0gbit", -1, True):
        with pytest.raises(ConfigurationError, match=r"The 'network_rate' parameter must be a link rate .* Got "):
            ParameterAveragingTrainer(make_model(), network_rate=bad)
    assert ParameterAveragingTrainer(make_model(), network_rate="800mbit").config.network_rate == "800mbit"


def test_shard_keys_send_shard_j_to_spark_partition_j(spark):
    from pyspark.sql import functions as F

    for shards in (1, 2, 3, 8, 16, 33):
        keys = murmur3.shard_keys(shards)
        df = spark.createDataFrame([(j, k) for j, k in enumerate(keys)], "shard int, key int")
        got = {r.shard: r.p for r in df.repartition(shards, "key").select("shard", F.spark_partition_id().alias("p")).collect()}
        assert got == {j: j for j in range(shards)}
        hashed = df.select(F.hash("key").alias("h")).collect()
        assert [r.h for r in hashed] == [murmur3.spark_int_hash(k) for k in keys]


def _fit(spark_df, **options):
    model = make_model(seed=6)
    trainer = ParameterAveragingTrainer(model, num_workers=3, batch_size=8, averaging_frequency=3, seed=2, **options)
    history = trainer.fit(spark_df, epochs=1, verbose=0)
    return model.get_weights(), history.history, trainer


def test_every_path_trains_bitwise_the_same_weights_at_three_workers(spark):
    df = spark.createDataFrame([(a.tolist(), float(b)) for a, b in zip(X, Y)], ["features", "label"])
    ref_weights, ref_history, _ = _fit(df, state_transport="files")
    for options in (
        {"state_transport": "spark", "aggregation_depth": 1},
        {"state_transport": "sql", "aggregation": "driver"},
        {"state_transport": "sql", "aggregation": "files"},
        {"state_transport": "sql", "aggregation": "shuffle", "aggregation_shards": 4},
        {"state_transport": "sql", "aggregation": "storage", "aggregation_shards": 2},
    ):
        weights, history, trainer = _fit(df, **options)
        for got, want in zip(weights, ref_weights):
            np.testing.assert_array_equal(got, want, err_msg=str(options))
        assert history == ref_history
        record = trainer.stats.records[-1]
        assert record.transport == options["state_transport"]
        # The driver's own CPU: its summing (none on Spark's tree) and the update, within the round's wall time.
        assert 0 < record.driver_cpu_s < 2 * record.wall_s
        assert (record.driver_sum_s > 0) == (options["state_transport"] != "spark")
        if options["state_transport"] == "sql":
            layout_bytes = 8 * sum(w.size for w in make_model(seed=6).get_weights())
            assert record.aggregation == options["aggregation"]
            # The driver gets every worker's sums, or one model's in shards (plus small metadata rows).
            factor = 3 if options["aggregation"] in ("driver", "files") else 1
            assert factor * layout_bytes < record.received_bytes < factor * layout_bytes + 4096 + 3 * layout_bytes // 2
    assert not any(f.startswith("exchange") for f in _listdir(trainer._staging_root))  # the fit's files are gone


def _listdir(path):
    import os

    return os.listdir(path) if os.path.isdir(path) else []


def test_optimizer_state_reset_sums_only_the_weights_on_every_path(spark):
    """With optimizer_state="reset" workers return no optimizer sums (Adam's moments start afresh each round)."""
    import keras

    df = spark.createDataFrame([(a.tolist(), float(b)) for a, b in zip(X, Y)], ["features", "label"])

    def fit(**options):
        model = make_model(seed=6, optimizer=keras.optimizers.Adam(0.01))
        ParameterAveragingTrainer(model, num_workers=3, batch_size=8, averaging_frequency=3, seed=2,
                                  optimizer_state="reset", **options).fit(df, epochs=1, verbose=0)
        return model.get_weights()

    reference = fit(state_transport="files")
    for aggregation in ("driver", "files", "shuffle", "storage"):
        shards = 2 if aggregation in ("shuffle", "storage") else None  # driver and files refuse shards
        for got, want in zip(fit(state_transport="sql", aggregation=aggregation, aggregation_shards=shards), reference):
            np.testing.assert_array_equal(got, want, err_msg=aggregation)


def test_a_layout_refuses_sums_of_another_shape():
    weights, optimizer = _sums(1, 3)
    with pytest.raises(ValueError, match="The sums hold 3 arrays; their layout has 5"):
        exchange.FlatLayout.of(weights, optimizer).flatten(weights, None)
