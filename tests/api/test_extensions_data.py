"""A user's own data container, made usable by a registered ``sparkdl_avg.DataAdapter``.

Written as a user would: only ``sparkdl_avg``'s public names (plus keras,
numpy and pyspark). A toy container (named columns of records, as a user's
own table class) passes through ``fit``, ``evaluate`` and ``predict`` exactly
as the Spark DataFrame its adapter converts it to; one whose adapter converts
to numpy arrays trains and evaluates as arrays do, and ``predict`` refuses it
as it refuses arrays. The registry's refusals need no Spark.
"""

from __future__ import annotations

import numpy as np
import pytest

import keras
import sparkdl_avg
from sparkdl_avg import ConfigurationError, DataAdapter, DataError, ParameterAveragingTrainer, register_data_adapter


class Table:
    """A user's own container: named columns of equal length (not a type the library knows)."""

    def __init__(self, **columns) -> None:
        self.columns = {name: np.asarray(values) for name, values in columns.items()}


class ArrayTable(Table):
    """The same container, for the adapter that converts to numpy arrays."""


@register_data_adapter
class TableAdapter(DataAdapter):
    """Converts a :class:`Table` to a Spark DataFrame of array ``features`` and a ``label`` column."""

    conversions = 0

    @classmethod
    def can_handle(cls, data):
        return type(data) is Table

    def convert(self):
        from pyspark.sql import SparkSession

        TableAdapter.conversions += 1
        spark = SparkSession.getActiveSession()
        x, y = self.data.columns["features"], self.data.columns["label"]
        rows = [(row.tolist(), float(label)) for row, label in zip(x, y)]
        return spark.createDataFrame(rows, "features array<double>, label double")


@register_data_adapter
class ArrayTableAdapter(DataAdapter):
    """Converts an :class:`ArrayTable` to ``(x, y)`` numpy arrays."""

    @classmethod
    def can_handle(cls, data):
        return isinstance(data, ArrayTable)

    def convert(self):
        return self.data.columns["features"], self.data.columns["label"]


def _data(n: int = 64, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4))
    return x, x @ np.array([0.5, -1.0, 2.0, 0.25]) + 0.1


def _model(seed: int = 0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((4,), dtype="float64")
    hidden = keras.layers.Dense(8, activation="tanh", dtype="float64")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1, dtype="float64")(hidden))
    model.compile(keras.optimizers.SGD(0.05), "mse", metrics=["mae"])
    return model


def _trainer(seed: int = 0):
    return ParameterAveragingTrainer(_model(seed), num_workers=2, batch_size=8, averaging_frequency=2, seed=seed)


def test_a_registered_container_fits_evaluates_and_predicts_as_the_dataframe_it_converts_to(spark):
    x, y = _data()
    table, validation = Table(features=x, label=y), Table(features=x[:16], label=y[:16])
    frame = TableAdapter(table).convert()
    TableAdapter.conversions = 0

    with _trainer() as mine, _trainer() as reference:
        history = mine.fit(table, validation_data=validation, epochs=2, verbose=0)
        assert TableAdapter.conversions == 2  # once for the training data, once for the validation data
        expected = reference.fit(frame, validation_data=TableAdapter(validation).convert(), epochs=2, verbose=0)
        assert history.history == expected.history
        for got, want in zip(mine.model.get_weights(), reference.model.get_weights()):
            np.testing.assert_array_equal(got, want)

        assert mine.evaluate(table, return_dict=True) == reference.evaluate(frame, return_dict=True)

        predicted = mine.predict(table)
        assert predicted.columns == ["features", "label", "prediction"]
        got = np.array([r.prediction for r in predicted.orderBy("label").collect()])
        want = np.array([r.prediction for r in reference.predict(frame).orderBy("label").collect()])
        np.testing.assert_array_equal(got, want)


def test_a_container_converted_to_numpy_arrays_trains_as_arrays_and_predict_refuses_it_as_arrays(spark):
    x, y = _data(48, seed=1)
    table = ArrayTable(features=x, label=y)
    with _trainer(1) as mine, _trainer(1) as reference:
        mine.fit(table, epochs=1, verbose=0)
        reference.fit((x, y), epochs=1, verbose=0)
        for got, want in zip(mine.model.get_weights(), reference.model.get_weights()):
            np.testing.assert_array_equal(got, want)
        assert mine.evaluate(table) == reference.evaluate((x, y))
        with pytest.raises(DataError, match=r"^The data to predict on must be a Spark DataFrame\. Got ArrayTable "
                                            r"instead\.$"):
            mine.predict(table)
        with pytest.raises(DataError, match=r"^The data to predict on must be a Spark DataFrame\. Got tuple "
                                            r"instead\.$"):
            reference.predict((x, y))


def test_registering_what_is_not_an_adapter_is_refused_naming_what_is_missing():
    with pytest.raises(ConfigurationError, match=r"register_data_adapter takes a subclass of "
                                                 r"sparkdl_avg\.DataAdapter\. Got <class 'dict'> instead\."):
        register_data_adapter(dict)

    class Incomplete(DataAdapter):
        @classmethod
        def can_handle(cls, data):
            return False

    with pytest.raises(ConfigurationError, match=r"^The data adapter Incomplete must implement convert "
                                                 r"\(see sparkdl_avg\.DataAdapter\)\.$"):
        register_data_adapter(Incomplete)


def test_an_adapter_that_converts_to_an_unknown_container_is_refused_before_any_job():
    class Odd:
        pass

    @register_data_adapter
    class OddAdapter(DataAdapter):
        @classmethod
        def can_handle(cls, data):
            return isinstance(data, Odd)

        def convert(self):
            return {"features": [1.0]}

    trainer = ParameterAveragingTrainer(_model(), num_workers=2, batch_size=8)
    with pytest.raises(DataError, match=r"^The data adapter OddAdapter converted the evaluation data \(Odd\) to dict; "
                                        r"it must convert to a Spark DataFrame, an RDD of \(x, y\) pairs or a tuple "
                                        r"\(x, y\) \(or \(x, y, sample_weight\)\) of numpy arrays\.$"):
        trainer.evaluate(Odd())


def test_containers_no_adapter_takes_keep_the_message_that_lists_what_data_may_be():
    trainer = ParameterAveragingTrainer(_model(), num_workers=2, batch_size=8)
    with pytest.raises(DataError, match=r"^The training data must be a Spark DataFrame, an RDD of \(x, y\) pairs or a "
                                        r"tuple \(x, y\) \(or \(x, y, sample_weight\)\) of numpy arrays\. Got set "
                                        r"instead\.$"):
        trainer.fit({1, 2}, verbose=0)
    assert "DataAdapter" in sparkdl_avg.__all__ and "register_data_adapter" in sparkdl_avg.__all__


def test_a_can_handle_that_is_not_a_classmethod_is_refused_at_registration():
    class Plain(DataAdapter):
        def can_handle(self, data):  # the data would arrive as ``self``
            return False

        def convert(self):
            return self.data

    with pytest.raises(ConfigurationError, match=r"^The data adapter Plain's can_handle must be a classmethod "
                                                 r"\(@classmethod def can_handle\(cls, data\)\): it is asked before "
                                                 r"any instance exists\.$"):
        register_data_adapter(Plain)


def test_an_adapter_whose_can_handle_raises_is_named_for_any_data():
    @register_data_adapter
    class Fussy(DataAdapter):
        @classmethod
        def can_handle(cls, data):
            return data.columns == ["features"]  # AttributeError for anything without .columns

        def convert(self):
            return self.data

    try:
        trainer = ParameterAveragingTrainer(_model(), num_workers=2, batch_size=8)
        x = np.zeros((16, 4))
        with pytest.raises(ConfigurationError, match=r"^The data adapter Fussy's can_handle raised AttributeError: "
                                                     r"'tuple' object has no attribute 'columns' \(asked about tuple\)\. "
                                                     r"can_handle must answer False for data that is not its "
                                                     r"container, without raising; fix it, or register a corrected "
                                                     r"class\.$"):
            trainer.fit((x, x[:, 0]), verbose=0)
    finally:
        @register_data_adapter
        class Fussy(DataAdapter):  # noqa: F811 (the same name: the corrected class takes the broken one's place)
            @classmethod
            def can_handle(cls, data):
                return False

            def convert(self):
                return self.data
