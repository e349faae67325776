"""Issue 48, part 2: what a fresh user's trial found that needs a session.

The estimator's ``classWeight`` Param (defect 14: declared in the options table, given as a dict or
``0=1,1=5``, persisted, checked as ``fit``'s ``class_weight``), the report's legend (defect 14: each
phase once), all-zero sample weights (defect 12) and the preprocessing function's label message
(defect 13's grammar).
"""

from __future__ import annotations

import json
import logging
import math
import re

import numpy as np
import pyarrow as pa
import pytest

import keras

from sparkdl_avg import ConfigurationError, DataError, ParameterAveragingTrainer
from sparkdl_avg.ml import KerasAveragingEstimator, KerasAveragingModel


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy")
    return model


def _data(n=64):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 4)).astype("float32"), (np.arange(n) % 3).astype("int32")


def _frame(spark, **extra):
    x, y = _data()
    return spark.createDataFrame(pa.table({"features": list(x), "label": y, **extra}))


# ------------------------------------------------------- defect 14: the estimator's classWeight


def test_class_weight_param_takes_a_dict_or_the_flags_text_and_is_persisted(spark, tmp_path):
    est = KerasAveragingEstimator(kerasModel=_model(), classWeight={0: 1, 1: 5.0})
    assert est.getClassWeight() == "0=1.0,1=5.0"  # text: a saved stage's JSON keeps no int keys
    assert est._fit_options()["class_weight"] == {0: 1.0, 1: 5.0}
    assert est.setClassWeight("0=2,2=0.5") is est and est._fit_options()["class_weight"] == {0: 2.0, 2: 0.5}
    assert KerasAveragingEstimator(kerasModel=_model())._fit_options()["class_weight"] is None
    est.save(str(tmp_path / "est"))
    loaded = KerasAveragingEstimator.load(str(tmp_path / "est"))
    assert loaded._fit_options()["class_weight"] == {0: 2.0, 2: 0.5}
    with pytest.raises(ConfigurationError, match=r"The 'classWeight' parameter must be a non-empty dict of class "
                                                 r"index .* Got \[1, 5\] instead"):
        KerasAveragingEstimator(kerasModel=_model(), classWeight=[1, 5])


def test_class_weight_param_weighs_the_classes_as_the_trainers_option(spark):
    df = _frame(spark)
    common = dict(numWorkers=2, batchSize=8, averagingFrequency=2, epochs=1, seed=3, shuffle=False)
    fitted = KerasAveragingEstimator(kerasModel=_model(), classWeight={0: 1.0, 1: 5.0, 2: 0.0}, **common).fit(df)
    trainer = ParameterAveragingTrainer(_model(), num_workers=2, batch_size=8, averaging_frequency=2, seed=3)
    with trainer:
        trainer.fit(df, epochs=1, shuffle=False, verbose=0, class_weight={0: 1.0, 1: 5.0, 2: 0.0})
    for a, b in zip(fitted.kerasModel.get_weights(), trainer.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    unweighted = KerasAveragingEstimator(kerasModel=_model(), **common).fit(df)
    assert any(not np.array_equal(a, b) for a, b in zip(unweighted.kerasModel.get_weights(),
                                                         trainer.model.get_weights()))
    with pytest.raises(ConfigurationError, match=r"The 'classWeight' parameter gives class 0 the weight inf"):
        KerasAveragingEstimator(kerasModel=_model(), classWeight={0: math.inf}, **common).fit(df)


# ------------------------------------------------------------ defect 14: the report's legend


def test_the_reports_legend_lists_each_phase_once(spark, tmp_path):
    x, y = _data()
    trainer = ParameterAveragingTrainer(_model(), num_workers=2, batch_size=8, averaging_frequency=2, seed=0)
    with trainer:
        trainer.fit((x, y), epochs=1, verbose=0)
        page = open(trainer.write_report(str(tmp_path / "report.html")), encoding="utf-8").read()
    data = json.JSONDecoder().raw_decode(page[page.index("Plotly.newPlot(") + len("Plotly.newPlot("):].split(",", 1)[1]
                                         .lstrip())[0]
    listed = [t["name"] for t in data if t.get("showlegend", True) and t.get("name")]
    assert len(listed) == len(set(listed)), sorted(listed)
    for phase in ("broadcast", "scheduling", "aggregation"):
        bars = [t for t in data if t.get("name") == phase]
        assert len(bars) == 2 and len({t["legendgroup"] for t in bars}) == 1  # the timeline's and the breakdown's


# ------------------------------------------------------- defect 12: all-zero sample weights


def test_all_zero_sample_weights_are_refused_with_the_column(spark):
    trainer = ParameterAveragingTrainer(_model(), num_workers=2, batch_size=8, seed=0)
    with trainer, pytest.raises(DataError, match=r"Column 'w' \('sample_weight_col'\) gives every one of the 64 "
                                                 r"examples the sample weight 0, so the fit would train nothing"):
        trainer.fit(_frame(spark, w=np.zeros(64)), sample_weight_col="w", verbose=0)
    x, y = _data()
    with trainer, pytest.raises(DataError, match=r"The training sample weights gives every one of the 64 examples"):
        trainer.fit((x, y, np.zeros(64)), verbose=0)
    with trainer, pytest.raises(DataError, match=r"The training sample weights have shape \(64, 2\); expected one "
                                                 r"weight per example, shape \(64,\)"):
        trainer.fit((x, y, np.ones((64, 2))), verbose=0)
    with trainer:  # one weight above 0 is enough
        trainer.fit(_frame(spark, w=np.eye(64)[5]), sample_weight_col="w", verbose=0)


# ---------------------------------------------------------- defect 13: the labels' grammar


def test_a_preprocess_label_out_of_range_reads_as_a_sentence(spark):
    def relabel(batch):
        return {"features": np.stack(batch["features"]), "label": np.full(len(batch["label"]), 7)}

    trainer = ParameterAveragingTrainer(_model(), num_workers=2, batch_size=8, seed=0, preprocess=relabel)
    with trainer, pytest.raises(DataError) as info:
        trainer.fit(_frame(spark), verbose=0)
    message = str(info.value)
    assert re.match(r"The labels 'label' of the preprocessing function '.*relabel' holds the label 7; expected a "
                    r"class index in 0\.\.2", message), message


def test_a_preprocess_whose_weights_are_all_zero_in_the_dry_run_is_warned(spark, caplog):
    """The dry run sees 8 rows: all-zero weights there are a warning (later rows may weigh more, as here)."""
    def weigh(batch):
        return {"features": np.stack(batch["features"]), "w": batch["w"]}

    weights = np.ones(64)
    weights[:8] = 0.0  # the rows the dry run reads
    trainer = ParameterAveragingTrainer(_model(), num_workers=2, batch_size=8, seed=0, preprocess=weigh)
    with trainer, caplog.at_level(logging.WARNING, logger="sparkdl_avg"):
        trainer.fit(_frame(spark, w=weights), sample_weight_col="w", verbose=0)
    assert re.search(r"The sample weights 'w' of the first 8 rows of the training data \(what the preprocessing "
                     r"function '.*weigh' returned\) are all 0", caplog.text), caplog.text
