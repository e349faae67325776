"""The checks that join several trainer options (``options.JOINTS``): declared once in the table, each fires with its message.

``TrainerConfig.__post_init__`` runs every row's own check, then the ``JOINTS`` in their declared
order; these tests pin each one's exact message (the words users, the jobs and the estimator
see), that a combination several of them refuse gets the first one's, and that the
declarations are the one source (no other check, their options' rows and docs, the jobs' flags).
Without Spark.
"""

from __future__ import annotations

import pytest

from sparkdl_avg import ConfigurationError, TrainerConfig
from sparkdl_avg.driver.api.cli import flag_message
from sparkdl_avg.driver.config import options
from sparkdl_avg.driver.config.constraints import Joint, OneOf, Requires, check_joints

# One refused combination per declaration, in JOINTS' order, with the whole message.
CASES = [
    (dict(reproducible=True),
     "The 'reproducible' parameter needs synchronization='stale' (a bound: its chunks read the weights 'staleness' "
     "rounds back); 'sync' repeats bitwise anyway, and 'async' has no bound. Got reproducible=True with "
     "synchronization='sync' instead."),
    (dict(staleness=5),
     "The 'staleness' parameter applies only when 'synchronization' is 'stale' (the bound of its chunks; 'sync' "
     "rounds wait for every worker): set 'synchronization' to 'stale' or leave 'staleness' at its default (2). "
     "Got staleness=5 with synchronization='sync' instead."),
    (dict(aggregation="driver", aggregation_shards=4),
     "The 'aggregation_shards' parameter applies only when 'aggregation' is 'shuffle', 'storage' or 'auto' (the "
     "sharded aggregations; 'driver' and 'files' sum every worker's sums on the driver). Got aggregation_shards=4 "
     "with aggregation='driver' instead."),
    (dict(staleness_aware=False),
     "The 'staleness_aware' parameter applies only when 'synchronization' is 'stale' or 'async' (it scales updates "
     "by their delay; 'sync' updates have none): set 'synchronization' or leave 'staleness_aware' at its default "
     "(True). Got staleness_aware=False with synchronization='sync' instead."),
    (dict(state_transport="files", aggregation_shards=2),
     "The 'aggregation_shards' parameter applies only when 'state_transport' is 'sql' or 'auto' (the sql round's "
     "sharded aggregations; 'files' sums on the driver): set 'state_transport' to 'sql' or leave "
     "'aggregation_shards' at None. Got aggregation_shards=2 with state_transport='files' instead."),
    (dict(state_transport="spark", aggregation="shuffle"),
     "The 'aggregation' parameter applies only when 'state_transport' is 'sql' or 'auto' (how the sql round sums; "
     "'spark' has its own): set 'state_transport' to 'sql' or leave 'aggregation' at 'auto'. Got "
     "aggregation='shuffle' with state_transport='spark' instead."),
    (dict(error_feedback=True),
     "The 'error_feedback' parameter applies only with 'update_compression' (it keeps what the codec drops): set "
     "'update_compression' or leave 'error_feedback' at None. Got error_feedback=True with update_compression=None "
     "instead."),
    (dict(update_compression="int8", synchronization="async"),
     "Error feedback needs synchronization='sync' or 'stale' (a worker's residual goes to its chunk a fixed number "
     "of rounds later; 'async' chunks have no such predecessor): pass error_feedback=False, "
     "update_compression='bf16' (no feedback by default) or synchronization='stale'. Got "
     "update_compression='int8' with synchronization='async' instead."),
    (dict(update_compression="threshold", error_feedback=False),
     "The 'update_compression' parameter 'threshold' needs error feedback: each worker's threshold adapts from round "
     "to round beside its residual, and what it does not send is sent later from there. Leave error_feedback at "
     "None (or True), or pick another codec. Got update_compression='threshold' with error_feedback=False "
     "instead."),
    (dict(optimizer_state="local", synchronization="stale"),
     "The 'optimizer_state' parameter 'local' needs synchronization='sync' (each worker's state continues from its "
     "own previous round; stale and asynchronous chunks have no fixed previous round). Got optimizer_state='local' "
     "with synchronization='stale' instead."),
    (dict(overlap_rounds=True, synchronization="stale", optimizer_state="reset"),
     "The 'overlap_rounds' parameter needs synchronization='sync': its rounds already run ahead by one round of "
     "averages, each worker standing its own delta in for its share of the average it lacks; stale and "
     "asynchronous chunks have no round to stand in for. Got overlap_rounds=True with synchronization='stale' "
     "instead."),
    (dict(overlap_rounds=True),
     "The 'overlap_rounds' parameter needs optimizer_state='local' or 'reset': an averaged optimizer state would "
     "reach the workers one round late like the weights, with no own term defined for it (not built). Got "
     "overlap_rounds=True with optimizer_state='average' instead."),
    (dict(overlap_rounds=True, optimizer_state="local", update_rule="bmuf"),
     "The 'overlap_rounds' parameter needs update_rule='average': the outer rules' one-round-late step with a "
     "worker's own term is not built yet. Got overlap_rounds=True with update_rule='bmuf' instead."),
    (dict(overlap_rounds=True, optimizer_state="local", sync_fragments=4),
     "The 'overlap_rounds' parameter with sync_fragments > 1 is not built yet (fragments are synchronised in turn "
     "from weights the workers keep; their overlap is another protocol): pass one of them. Got "
     "overlap_rounds=True with sync_fragments=4 instead."),
    (dict(standing_rounds="socket"),
     "The 'standing_rounds' parameter 'socket' needs overlap_rounds=True: a classic session's rounds share a "
     "standing job (the one that talks through the driver's socket) only under overlap_rounds. Got "
     "standing_rounds='socket' with overlap_rounds=False instead."),
    (dict(sync_fragments=2, synchronization="async"),
     "The 'sync_fragments' parameter needs synchronization='sync' (round r synchronises fragment r mod F from every "
     "worker; stale and asynchronous chunks apply one worker at a time, with no such turn). Got sync_fragments=2 "
     "with synchronization='async' instead."),
    (dict(elastic_timeout_s=10),
     "The 'elastic_timeout_s' parameter applies only to elastic rounds (how long they wait for 'min_workers' task "
     "slots): set 'min_workers' or 'max_workers', or leave 'elastic_timeout_s' at its default. Got "
     "elastic_timeout_s=10 without them instead."),
    (dict(num_workers=4, max_workers=2),
     "The 'num_workers' and 'max_workers' parameters are both the most workers of an elastic round; give one of "
     "them. Got num_workers=4 with max_workers=2 instead."),
    (dict(num_workers=2, min_workers=3),
     "The 'min_workers' parameter must be at most 'num_workers' (2): a round cannot need more workers than it may "
     "have. Got min_workers=3 instead."),
]


def _values(**kwargs):
    return {**{o.name: o.default for o in options.of(options.TRAINER)}, **kwargs}


def test_every_declaration_has_a_case_in_order():
    assert len(CASES) == len(options.JOINTS)


@pytest.mark.parametrize("index", range(len(CASES)))
def test_each_check_across_options_fires_with_its_message(index):
    kwargs, message = CASES[index]
    with pytest.raises(ConfigurationError) as err:
        TrainerConfig(**kwargs)
    assert str(err.value) == message
    # ... and it is that declaration's: it alone refuses the combination, with the same words
    refusing = [j for j in options.JOINTS if j.is_set(_values(**kwargs)[j.name], options.DEFAULTS[j.name])
                and j.refused(_values(**kwargs))]
    assert refusing == [options.JOINTS[index]]
    with pytest.raises(ConfigurationError) as own:
        options.JOINTS[index].check(_values(**kwargs), options.DEFAULTS)
    assert str(own.value) == message


def test_min_workers_names_max_workers_when_given():
    with pytest.raises(ConfigurationError, match=r"^The 'min_workers' parameter must be at most 'max_workers' \(2\)"):
        TrainerConfig(min_workers=3, max_workers=2)


def test_the_first_declared_check_wins_when_several_refuse():
    kwargs = dict(reproducible=True, synchronization="async", optimizer_state="local", elastic_timeout_s=10)
    with pytest.raises(ConfigurationError, match=r"^The 'reproducible' parameter needs"):
        TrainerConfig(**kwargs)
    with pytest.raises(ConfigurationError, match=r"^The 'reproducible' parameter needs"):
        check_joints(options.JOINTS, _values(**kwargs), options.DEFAULTS)
    kwargs.pop("reproducible")
    with pytest.raises(ConfigurationError, match=r"^The 'optimizer_state' parameter 'local'"):
        TrainerConfig(**kwargs)


def test_combinations_each_check_lets_through_are_accepted():
    for kwargs in (dict(reproducible=True, synchronization="stale"), dict(staleness=5, synchronization="async"),
                   dict(aggregation="storage", aggregation_shards=4), dict(error_feedback=False, update_compression="bf16"),
                   dict(update_compression="int8", error_feedback=False, synchronization="async"),
                   dict(update_compression="bf16", synchronization="async"), dict(optimizer_state="reset",
                   synchronization="stale"), dict(elastic_timeout_s=10, min_workers=1), dict(num_workers=2, max_workers=2),
                   dict(min_workers=2, max_workers=2), dict(standing_rounds="off"),
                   dict(standing_rounds="socket", overlap_rounds=True, optimizer_state="local")):
        TrainerConfig(**kwargs)


def test_the_declarations_join_rows_of_the_table_and_values_they_take():
    trainer = {o.name for o in options.of(options.TRAINER)}
    for joint in options.JOINTS:
        assert isinstance(joint, (Requires, Joint))
        assert joint.name in trainer
        if isinstance(joint, Requires):
            assert joint.other in trainer and joint.other != joint.name
            check = options.option(joint.other).check
            assert isinstance(check, OneOf) and set(joint.among) <= set(check.choices), joint
            assert f"'{joint.name}'" in joint.message and joint.other in joint.message


@pytest.mark.parametrize("joint", [j for j in options.JOINTS if isinstance(j, Requires)], ids=lambda j: j.name)
def test_the_docs_of_a_requiring_option_say_what_it_needs(joint):
    row = options.option(joint.name)
    text = row.doc + " " + row.help
    assert joint.other in text or any(f'"{v}"' in text or f"'{v}'" in text or f" {v} " in text
                                      for v in joint.among), (joint.name, joint.other)


def test_the_jobs_name_the_flags_of_both_options():
    with pytest.raises(ConfigurationError) as err:
        TrainerConfig(state_transport="spark", aggregation="shuffle")
    assert flag_message(str(err.value)).startswith(
        "The --aggregation flag applies only when --state-transport is 'sql' or 'auto'")
    assert "Got --aggregation='shuffle' with --state-transport='spark' instead." in flag_message(str(err.value))


def test_post_init_is_the_table_s_checks_and_nothing_else():
    import inspect

    from sparkdl_avg.driver.config import trainer_config

    source = inspect.getsource(trainer_config._post_init)
    assert "ConfigurationError" not in source and len(source.splitlines()) <= 8
