"""The two data registries, without Spark: column kinds looked up by name, data adapters chosen by container.

Column kinds (:mod:`sparkdl_avg.shared.data.kinds`): each kind is found by the
name a staged column records, chosen for a model input from its field, and
a kind added by a class of its own is used by staging and reading alike.
Data adapters (:mod:`sparkdl_avg.driver.data.adapters`): one lookup chooses
the adapter (users' first), unknown containers and pandas get the messages
they always had, and each adapter answers the driver's questions.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from sparkdl_avg import ConfigurationError, DataError
from sparkdl_avg.driver.data import adapters
from sparkdl_avg.driver.data.adapters import (ArrayAdapter, DataAdapter, DataFrameAdapter, PandasAdapter, RDDAdapter,
                                              find_data_adapter, get_data_adapter, known_data)
from sparkdl_avg.driver.data.inference import add_predictions
from sparkdl_avg.driver.data.staging import data_key
from sparkdl_avg.shared.data.columns import Column, Field, read_column, stage_arrow, stage_numpy
from sparkdl_avg.shared.data.kinds import KINDS, ColumnKind, ImageKind, RawKind, TensorKind, TextKind, kind_for_field

# ------------------------------------------------------------------ column kinds


def test_every_kind_is_found_by_the_name_a_staged_column_records():
    assert KINDS.names() == ("text", "tensor", "image", "raw")
    for cls in (TextKind, TensorKind, ImageKind, RawKind):
        assert isinstance(KINDS.get(cls.name), cls)
        assert isinstance(Column("c", "c", cls.name).handler, cls)
    assert [KINDS.get(n).numeric for n in KINDS.names()] == [False, True, False, False]


def test_an_unknown_kind_name_is_refused_listing_the_kinds():
    with pytest.raises(ValueError, match=r"^Unknown column kind 'sparse'; the column kinds are "
                                         r"\['image', 'raw', 'tensor', 'text'\]\.$"):
        KINDS.get("sparse")
    with pytest.raises(ValueError, match="Unknown column kind"):
        stage_numpy(np.zeros((2, 1)), Column("c", "c", "sparse"))


def test_a_model_inputs_field_chooses_the_kind_of_its_column_in_data_without_a_schema():
    assert kind_for_field(Field((1,), "string")).name == "text"
    assert kind_for_field(Field((), "string")).name == "text"
    for dtype in ("float32", "float64", "int64", "bool"):
        assert kind_for_field(Field((2, 3), dtype)).name == "tensor"


def test_a_kind_needs_a_name_of_its_own_the_names_staged_files_record_stay_theirs():
    class Nameless(ColumnKind):
        pass

    class Tensor(ColumnKind):
        name = "tensor"

    with pytest.raises(ValueError, match=r"^Column kind .*Nameless needs a name of its own matching .* Got ''"):
        KINDS.register(Nameless)
    with pytest.raises(ValueError, match=r"'tensor' is taken by sparkdl_avg\.shared\.data\.kinds\.TensorKind\.$"):
        KINDS.register(Tensor)
    assert type(KINDS.get("tensor")) is TensorKind


def test_a_kind_of_ones_own_stages_and_reads_through_the_registry(monkeypatch):
    monkeypatch.setattr(KINDS, "_entries", dict(KINDS._entries))  # the test's kind leaves with the test

    @KINDS.register
    class Doubled(ColumnKind):
        name = "doubled"

        def stage_arrow(self, column, spec, first_row=0):
            return pc.multiply(column, 2)

        def read(self, array, spec):
            return array.to_numpy() + 0.5

    column = Column("d", "d", "doubled")
    staged = stage_arrow(pa.array([1, 2, 3]), column)
    assert staged.to_pylist() == [2, 4, 6]
    assert read_column(staged, column).tolist() == [2.5, 4.5, 6.5]
    assert KINDS.names()[-1] == "doubled" and kind_for_field(Field((1,), "float32")).name == "tensor"


# ------------------------------------------------------------------ data adapters


def _arrays(n=6):
    x = np.arange(n * 2, dtype=np.float64).reshape(n, 2)
    return x, x.sum(axis=1)


def test_numpy_tuples_and_pairs_of_lists_are_arrays_and_nothing_else_is():
    x, y = _arrays()
    for data in ((x, y), [x, y], (x, y, np.ones(6)), ([x, x], y)):
        assert type(get_data_adapter(data)) is ArrayAdapter
    for data in ([x, y, np.ones(6)], (x,), "data.csv", {"x": 1}, None, 3):
        assert find_data_adapter(data) is None
        with pytest.raises(DataError, match=r"^The validation data must be a Spark DataFrame, an RDD of \(x, y\) pairs "
                                            r"or a tuple \(x, y\) \(or \(x, y, sample_weight\)\) of numpy arrays\. "
                                            rf"Got {type(data).__name__} instead\.$"):
            get_data_adapter(data, "validation")
    assert not DataFrameAdapter.can_handle((x, y)) and not RDDAdapter.can_handle((x, y))


def test_a_pandas_dataframe_is_refused_with_how_to_convert_it_and_is_no_dataframe_to_predict_on():
    pd = pytest.importorskip("pandas")
    pdf = pd.DataFrame({"a": [1.0, 2.0], "label": [0.0, 1.0]})
    adapter = find_data_adapter(pdf, "evaluation")
    assert type(adapter) is PandasAdapter
    for ask in (lambda: known_data(pdf, "evaluation"), lambda: get_data_adapter(pdf, "evaluation"), adapter.known):
        with pytest.raises(DataError, match=r"^The evaluation data must be a Spark DataFrame, an RDD of \(x, y\) pairs "
                                            r"or a tuple \(x, y\) of numpy arrays\. Got a pandas DataFrame instead; "
                                            r"convert it with spark\.createDataFrame\(pdf\)"):
            ask()
    assert adapter.dataframe() is None and not adapter.has_column("a") and adapter.key(()) is None
    with pytest.raises(DataError, match=r"^The data to predict on must be a Spark DataFrame\. Got DataFrame "
                                        r"instead\.$"):
        add_predictions(pdf, None)


def test_arrays_are_counted_cut_and_keyed_by_their_contents():
    x, y = _arrays()
    w = np.linspace(0, 1, 6)
    adapter = get_data_adapter((x, y, w))
    assert adapter.count() == 6 and get_data_adapter(([x, x], y)).count() == 6
    head = adapter.head(2)
    assert len(head) == 3 and [len(a) for a in head] == [2, 2, 2]
    assert [len(a) for a in get_data_adapter(([x, x], [y])).head(4)[0]] == [4, 4]
    assert not adapter.has_column("label") and adapter.dataframe() is None
    key = data_key((x, y), "features", "label")
    assert key == data_key((x.copy(), y.copy()), "features", "label")
    x[0, 0] = -1.0  # changed in place: staged again
    assert key != data_key((x, y), "features", "label")
    assert key != data_key((x, y), "other", "label")
    assert data_key(object(), "features", "label") is None


class _Rows(list):
    """A user's container: a list of ``(features, label)`` records (a list subclass, which arrays' adapter
    would take as a pair when it has two records)."""


class _RowsAdapter(DataAdapter):
    calls = 0

    @classmethod
    def can_handle(cls, data):
        return isinstance(data, _Rows)

    def convert(self):
        _RowsAdapter.calls += 1
        return np.array([r[0] for r in self.data]), np.array([r[1] for r in self.data])


@pytest.fixture
def rows_adapter(monkeypatch):
    monkeypatch.setattr(adapters.ADAPTERS, "_entries", dict(adapters.ADAPTERS._entries))  # leaves with the test
    assert type(find_data_adapter(_Rows([(1.0, 2.0), (3.0, 4.0)]))) is ArrayAdapter  # a list of two: (x, y)
    return adapters.register_data_adapter(_RowsAdapter)


def test_users_adapters_are_asked_first_and_answer_through_the_data_they_convert_to(rows_adapter):
    rows = _Rows([([1.0, 2.0], 3.0), ([4.0, 5.0], 9.0)])
    adapter = find_data_adapter(rows, "evaluation")
    assert type(adapter) is _RowsAdapter and adapter.what == "evaluation"
    rows_adapter.calls = 0
    known = adapter.known()
    assert adapter.known() is known and rows_adapter.calls == 1  # converted once per adapter
    assert type(known) is ArrayAdapter and known.what == "evaluation" and not known.has_column("label")
    assert known.count() == 2 and known.head(1)[0].tolist() == [[1.0, 2.0]]
    assert adapter.key(("features",)) is None  # a converted container is staged again at each call
    assert type(get_data_adapter(rows)) is ArrayAdapter  # every question goes to the data it converts to
    x, y = known_data(rows)
    assert x.tolist() == [[1.0, 2.0], [4.0, 5.0]] and y.tolist() == [3.0, 9.0]
    with pytest.raises(DataError, match=r"^The data to predict on must be a Spark DataFrame\. Got _Rows instead\.$"):
        add_predictions(rows, None)


def test_registering_a_class_again_moves_it_first_and_built_in_adapters_cannot_be_registered(rows_adapter):
    class Other(_RowsAdapter):
        pass

    adapters.register_data_adapter(Other)
    assert type(find_data_adapter(_Rows([]))) is Other
    adapters.register_data_adapter(_RowsAdapter)
    assert type(find_data_adapter(_Rows([]))) is _RowsAdapter
    assert adapters.ADAPTERS.entries()[:2] == [_RowsAdapter, Other]
    with pytest.raises(ConfigurationError, match="register_data_adapter takes a subclass of sparkdl_avg.DataAdapter"):
        adapters.register_data_adapter(ArrayAdapter)
