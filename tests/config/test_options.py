"""Every row of the option table (sparkdl_avg.driver.config.options) reaches the three entry points, without Spark.

The entry points: ``TrainerConfig``/``ParameterAveragingTrainer``, the jobs'
flags (``jobs/train.py``'s parser, ``cli.trainer_options``) and
``KerasAveragingEstimator``'s Params. Each row must be a config field (or a
``fit`` argument), a flag and, where it has one, a Param, each with the
row's default; a bad value must give the same error through all three (the
estimator's naming the camelCase Param), and the jobs' errors name the flag
(``--batch-size``), never the option.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import os

import pytest

from conftest import make_model
from sparkdl_avg import ConfigurationError, ParameterAveragingTrainer, SlowMo, TrainerConfig, cli
from sparkdl_avg.driver.config import options
from sparkdl_avg.ml import _SNAKE_TO_PARAM, KerasAveragingEstimator, _camel_case_message
from sparkdl_avg.driver.algorithms.rules import as_update_rule

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REQUIRED = ["--data", "d.parquet", "--model", "m.keras", "--output-dir", "out"]


def _train_job():
    spec = importlib.util.spec_from_file_location("train_job", os.path.join(ROOT, "jobs", "train.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def parse():
    job = _train_job()
    return lambda *flags: job.parse_args([*REQUIRED, *flags])


@pytest.fixture(scope="module")
def model():
    return make_model(seed=0)


def _flag(row) -> str:
    return row.cli.flag or "--" + row.name.replace("_", "-")


# ------------------------------------------------------------------ the table


def test_names_are_unique_and_scopes_known():
    names = [o.name for o in options.OPTIONS]
    assert len(names) == len(set(names))
    assert {o.scope for o in options.OPTIONS} == {options.TRAINER, options.RULE, options.FIT, options.TRACKING}
    params = [o.param.name for o in options.OPTIONS if o.param]
    assert len(params) == len(set(params))
    for o in options.of(options.TRAINER):
        assert o.doc and o.check is not None, o.name


# ------------------------------------------------------------- TrainerConfig


def test_trainer_rows_are_the_config_fields_with_their_defaults():
    fields = dataclasses.fields(TrainerConfig)
    assert [f.name for f in fields] == [o.name for o in options.of(options.TRAINER)]
    assert {f.name: f.default for f in fields} == {o.name: o.default for o in options.of(options.TRAINER)}
    for o in options.of(options.TRAINER):
        assert f"{o.name}:" in TrainerConfig.__doc__ and f"{o.name}:" in ParameterAveragingTrainer.__doc__


def test_trainer_signature_and_fit_defaults_come_from_the_table():
    params = inspect.signature(ParameterAveragingTrainer).parameters
    assert list(params)[0] == "model" and params["model"].default is inspect.Parameter.empty
    assert {n: p.default for n, p in params.items() if n != "model"} == {
        o.name: o.default for o in options.of(options.TRAINER)
    }
    fit = inspect.signature(ParameterAveragingTrainer.fit).parameters
    for o in options.of(options.FIT):
        assert fit[o.name].default == o.default, o.name


def test_the_mlflow_logger_takes_the_tracking_rows_but_the_switch():
    from sparkdl_avg.tracking import MlflowLogger

    params = inspect.signature(MlflowLogger).parameters
    rows = [o for o in options.of(options.TRACKING) if o.name != "mlflow"]
    assert {n: p.default for n, p in params.items()} == {o.name: o.default for o in rows}
    for o in rows:
        assert f"{o.name}:" in MlflowLogger.__doc__, o.name


def test_trainer_takes_options_by_keyword_or_position_and_names_unknown_ones(model):
    trainer = ParameterAveragingTrainer(model, 2, 4, seed=3)
    assert trainer.config == TrainerConfig(num_workers=2, batch_size=4, seed=3)
    with pytest.raises(TypeError, match=r"'bacth_size'.*Valid options: num_workers, batch_size"):
        ParameterAveragingTrainer(model, bacth_size=4)
    with pytest.raises(TypeError, match=r"multiple values for argument 'num_workers'"):
        ParameterAveragingTrainer(model, 2, num_workers=3)


# ------------------------------------------------------------------------ CLI


def test_every_row_with_a_flag_is_a_flag_of_the_train_job_with_its_default(parse):
    args = parse()
    for o in options.OPTIONS:
        if o.cli is None:
            continue
        assert hasattr(args, o.cli.dest or o.name), _flag(o)
        expected = o.default if o.cli.default is options.SAME else o.cli.default
        if o.cli.to_option is not None:
            expected = o.cli.to_option(False if o.cli.action == "store_true" else expected)
        assert cli.flag_value(args, o) == expected, _flag(o)
    # every trainer option has a flag, and the flags' defaults are the trainer's
    assert all(o.cli is not None for o in options.of(options.TRAINER, options.RULE))
    assert TrainerConfig(**cli.trainer_options(args)) == TrainerConfig(update_rule=as_update_rule(None))
    assert cli.tracker(args) is None  # no --mlflow* flag: no tracking (and mlflow need not be installed)


def test_flags_set_the_options(parse):
    args = parse("--batch-size", "4", "--no-check-data", "--state-transport", "files", "--update-rule", "slowmo",
                 "--block-momentum", "0.7", "--no-shuffle", "--verbose", "0")
    config = TrainerConfig(**cli.trainer_options(args))
    assert (config.batch_size, config.check_data, config.state_transport) == (4, False, "files")
    assert config.update_rule == SlowMo(0.7, 1.0)
    assert cli.flag_value(args, options.option("shuffle")) is False
    assert cli.flag_value(args, options.option("verbose")) == 0
    pytest.importorskip("mlflow")
    tracker = cli.tracker(parse("--mlflow-experiment", "e", "--mlflow-run-name", "r", "--mlflow-no-log-model"))
    assert (tracker.experiment, tracker.run_name, tracker.tracking_uri, tracker.log_model) == ("e", "r", None, False)
    assert cli.tracker(parse("--mlflow")).experiment is None


# ------------------------------------------------------------------ estimator


def test_every_row_with_a_param_is_an_estimator_param_with_its_default():
    est = KerasAveragingEstimator()
    names = {p.name for p in est.params}
    signature = inspect.signature(KerasAveragingEstimator.__init__).parameters
    for o in options.OPTIONS:
        if o.param is None:
            continue
        name = o.param.name
        assert name in names and name in signature, name
        assert signature[name].kind is inspect.Parameter.KEYWORD_ONLY
        default = o.param_default()
        assert signature[name].default == default, name
        if o.param.shared and o.name == "seed":
            assert not est.isSet(est.seed)  # HasSeed's default: a hash of the class name
        elif default is None:
            assert not est.isDefined(est.getParam(name)), name
        else:
            assert est.getOrDefault(name) == default, name
        setter = getattr(est, "set" + name[0].upper() + name[1:])
        getter = getattr(est, "get" + name[0].upper() + name[1:])
        assert callable(getter)
        if default is not None:
            assert setter(default) is est
    for snake, camel in _SNAKE_TO_PARAM.items():
        assert est.hasParam(camel), (snake, camel)
    assert {"onNonfinite", "checkData", "stateTransport"} <= names


def test_estimator_defaults_are_the_trainers():
    est = KerasAveragingEstimator()
    got = est._trainer_options()
    assert sorted(got) == sorted(o.name for o in options.of(options.TRAINER))
    assert TrainerConfig(**got) == TrainerConfig(update_rule=as_update_rule(None), seed=got["seed"])
    with pytest.raises(TypeError, match=r"'batch_size'.*Valid options: .*batchSize"):
        KerasAveragingEstimator(batch_size=3)


# --------------------------------------------------- the same error everywhere


@pytest.mark.parametrize(
    "name,value",
    [("batch_size", 0), ("num_workers", 0), ("aggregation_depth", 0), ("averaging_frequency", 0),
     ("optimizer_state", "bogus"), ("on_nonfinite", "bogus"), ("seed", -1), ("update_rule", "nope")],
)
def test_a_bad_value_gets_the_same_error_through_every_entry_point(parse, model, name, value):
    row = options.option(name)
    with pytest.raises(ConfigurationError) as direct:
        TrainerConfig(**{name: value})
    message = str(direct.value)
    assert f"'{name}'" in message

    with pytest.raises(ConfigurationError) as through_flags:
        TrainerConfig(**cli.trainer_options(parse(_flag(row), str(value))))
    assert str(through_flags.value) == message

    est = KerasAveragingEstimator(kerasModel=model, **{row.param.name: value})
    with pytest.raises(ConfigurationError) as through_estimator:
        est.fit(None)  # the trainer's validator raises before the data is looked at
    assert str(through_estimator.value) == _camel_case_message(message)
    assert f"'{row.param.name}'" in str(through_estimator.value)
    if row.param.name != name:
        assert f"'{name}'" not in str(through_estimator.value)


# ----------------------------------------------------- the jobs' errors name the flag
# Issue 16, user-reported surprise A: errors that named the option where the user had written a flag.


def _bad_flag_values():
    """One bad value per option with a flag and a check, as the command line would give it."""
    bad = {"averaging_frequency": "0", "optimizer_state": "bogus", "on_nonfinite": "bogus", "seed": "-1",
           "update_rule": "nope", "staging_dir": "", "checkpoint_every": "soon", "checkpoint_dir": "",
           "state_transport": None, "aggregation": None, "check_data": None, "resume": None, "slow_warning": None,
           "mlflow": None, "log_model": None, "experiment": "", "tracking_uri": "", "run_name": "",
           "error_feedback": None, "preprocess": None, "class_weight": None, "sample_weight_col": ""}
    # None: a flag argparse checks itself (choices, store_true/store_false, a type that parses)
    for row in options.OPTIONS:
        if row.cli is None or row.check is None or bad.get(row.name, "") is None:
            continue
        if row.cli.choices is not None or row.cli.action is not None:
            continue  # argparse checks choices and switches itself
        yield row, bad.get(row.name, "-1")


def test_every_flag_error_names_the_flag_not_the_option(capsys):
    job = _train_job()
    seen = []
    for row, value in _bad_flag_values():
        flag = row.cli.flag or "--" + row.name.replace("_", "-")
        args = job.parse_args(["--data", "d", "--model", "m.keras", "--output-dir", "o", flag, value])

        def main(argv, args=args):
            config_args = cli.trainer_options(args)
            from sparkdl_avg import TrainerConfig

            TrainerConfig(**config_args)
            cli.check_fit_flags(args)
            cli.tracker(args)

        assert cli.run(main) == 2, flag
        line = capsys.readouterr().err
        assert flag in line and f"'{row.name}'" not in line, (flag, line)
        seen.append(flag)
    assert {"--batch-size", "--epochs", "--initial-epoch", "--num-workers", "--checkpoint-every",
            "--mlflow-experiment", "--mlflow-tracking-uri"} <= set(seen)


def test_train_job_names_batch_size_and_epochs_the_same_way(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "jobs"))
    job = _train_job()
    common = ["--data", str(tmp_path / "none.parquet"), "--output-dir", str(tmp_path / "out"),
              "--model-builder", "digits_model:build"]
    lines = {}
    for flags in (["--batch-size", "-1"], ["--epochs", "0"], ["--epochs", "2", "--initial-epoch", "2"]):
        assert cli.run(job.main, [*common, *flags]) == 2
        lines[flags[-2]] = capsys.readouterr().err.strip().splitlines()[-1]
    assert lines["--batch-size"] == "error: The --batch-size flag must be an int in the range [1, inf). Got -1 instead."
    assert lines["--epochs"] == "error: The --epochs flag must be an int in the range [1, inf). Got 0 instead."
    assert lines["--initial-epoch"].startswith("error: The --initial-epoch flag must be less than --epochs (2)")


# ---------------------------------------------------------- one message style


@pytest.mark.parametrize("constraint, bad, what", [
    (options.Ints(1), 0, "an int in the range [1, inf)"),
    (options.Ints(1), True, "an int in the range [1, inf)"),  # a bool is not a count
    (options.Ints(0, allow_none=True), 1.5, "an int in the range [0, inf) or None"),
    (options.OneOf(("sync", "stale")), "Sync", "one of 'sync', 'stale'"),
    (options.Bool(), 1, "a bool"),
    (options.Text(), "", "a non-empty str or None"),
    (options.Text("a local path or a pyarrow.fs URI"), 3, "a non-empty str (a local path or a pyarrow.fs URI) or None"),
    (options.RoundsOrEpoch(), 0, "'epoch' or an int in the range [1, inf) (rounds)"),
    (options.BoolOrPath(), None, "a bool or the path of a checkpoint"),
])
def test_a_constraint_refuses_with_the_one_message(constraint, bad, what):
    with pytest.raises(ConfigurationError) as info:
        constraint("opt", bad)
    assert str(info.value) == f"The 'opt' parameter must be {what}. Got {bad!r} instead."


@pytest.mark.parametrize("constraint, good", [
    (options.Ints(1), 1), (options.Ints(0, allow_none=True), None), (options.OneOf(("a", 0)), 0),
    (options.Bool(), False), (options.Text(), None), (options.RoundsOrEpoch(), "epoch"),
    (options.RoundsOrEpoch(), 3), (options.BoolOrPath(), "ckpt-2"),
])
def test_a_constraint_accepts_what_it_says(constraint, good):
    constraint("opt", good)  # no error


def test_every_checked_row_holds_a_constraint():
    assert all(row.check is None or isinstance(row.check, options.Constraint) for row in options.OPTIONS)
    unchecked = sorted(row.name for row in options.OPTIONS if row.check is None)
    # the columns are checked against the data; the rule's numbers by the rule they build
    assert unchecked == ["block_lr", "block_momentum", "features_col", "label_col"]


# ------------------------------------------------------------ fit's options


def test_check_fit_args_checks_each_option_and_the_pairs():
    from sparkdl_avg.driver.config.trainer_config import check_fit_args

    assert check_fit_args(epochs=3, initial_epoch=1, verbose=0) == {"epochs": 3, "initial_epoch": 1, "verbose": 0}
    assert check_fit_args(verbose="auto")["verbose"] == 2  # pytest's stdout is not a terminal
    cases = [
        ({"epochs": 0}, "The 'epochs' parameter must be an int in the range [1, inf). Got 0 instead."),
        ({"verbose": 3}, "The 'verbose' parameter must be one of 'auto', 0, 1, 2. Got 3 instead."),
        ({"shuffle": "yes"}, "The 'shuffle' parameter must be a bool. Got 'yes' instead."),
        ({"epochs": 2, "initial_epoch": 2}, "The 'initial_epoch' parameter must be less than 'epochs' (2)"),
        ({"resume": True}, "The 'resume' parameter is True but no 'checkpoint_dir' was given; resuming needs the "
                           "'checkpoint_dir' the interrupted fit wrote its checkpoints to."),
    ]
    for values, message in cases:
        with pytest.raises(ConfigurationError) as info:
            check_fit_args(**values)
        assert str(info.value).startswith(message), (values, str(info.value))
    with pytest.raises(ConfigurationError, match="'checkpoint_every' parameter must be 'epoch' with synchronization='stale'"):
        check_fit_args("stale", checkpoint_dir="/tmp/c", checkpoint_every=4)
    check_fit_args("sync", checkpoint_dir="/tmp/c", checkpoint_every=4)  # sync rounds all end together


def test_the_jobs_check_the_fit_flags_together_before_spark_starts(parse):
    with pytest.raises(ConfigurationError) as info:
        cli.check_fit_flags(parse("--epochs", "2", "--initial-epoch", "2"))
    assert cli.flag_message(str(info.value)).startswith(
        "The --initial-epoch flag must be less than --epochs (2)")
    with pytest.raises(ConfigurationError) as info:
        cli.check_fit_flags(parse("--synchronization", "stale", "--checkpoint-dir", "/tmp/c", "--checkpoint-every", "3"))
    assert cli.flag_message(str(info.value)).startswith("The --checkpoint-every flag must be 'epoch' with --synchronization='stale'")
    # the API's way to resume reads as the jobs' flag
    assert cli.flag_message("It cannot be resumed from; fit(resume=True) takes the previous one. Pass resume=True "
                            "or give another 'checkpoint_dir'.") == (
        "It cannot be resumed from; --resume takes the previous one. Pass --resume or give another --checkpoint-dir.")
    with pytest.raises(ConfigurationError) as info:  # issue 38: nothing was checkpointed, without a word
        cli.check_fit_flags(parse("--checkpoint-every", "2"))
    assert cli.flag_message(str(info.value)).startswith(
        "The --checkpoint-every flag applies only with a --checkpoint-dir (where the checkpoints go; without one "
        "nothing is checkpointed)")


def test_parsed_rows_hand_none_to_their_parser():
    # averaging_frequency=None is no schedule; update_rule=None and network_rate=None are the defaults
    with pytest.raises(ConfigurationError, match="The 'averaging_frequency' parameter must be an int in the range"):
        TrainerConfig(averaging_frequency=None)
    TrainerConfig(update_rule=None, network_rate=None)


def test_a_value_that_is_also_an_option_name_stays_a_value_in_the_jobs_messages():
    """Issue 38 item 6: aggregation='shuffle' read 'Got aggregation=--no-shuffle' in the jobs' errors."""
    with pytest.raises(ConfigurationError) as err:
        TrainerConfig(aggregation="shuffle", state_transport="spark")
    message = cli.flag_message(str(err.value))
    assert "--aggregation='shuffle'" in message or "aggregation='shuffle'" in message, message
    assert "--no-shuffle" not in message and "--state-transport" in message, message
    with pytest.raises(ConfigurationError) as err:
        TrainerConfig(aggregation_shards=2, aggregation="driver")
    message = cli.flag_message(str(err.value))
    assert "'shuffle'" in message and "--no-shuffle" not in message and "--aggregation-shards" in message, message
