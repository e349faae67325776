"""The round-entry seam (``sparkdl_avg.testing.RoundEntry``): what rounds run on the executors, installed by a block."""

import functools
import sys

from pyspark import cloudpickle

from sparkdl_avg import testing
from sparkdl_avg.executor import worker


def _entry(task, workers):
    return worker.run_round_partition(task, workers)


def test_the_innermost_installed_entry_runs_and_leaving_restores_the_one_outside():
    straggler = testing.Straggler(slot=0, factor=2.0)
    assert testing.round_entry() is worker.run_round_partition
    with straggler:
        assert testing.round_entry() is straggler  # a Straggler is its own entry
        with testing.RoundEntry(_entry) as inner:
            assert testing.round_entry() is _entry and inner.installed() is _entry
        assert testing.round_entry() is straggler
    assert testing.round_entry() is worker.run_round_partition


def test_a_test_modules_entry_travels_by_value_while_installed_and_the_packages_by_reference():
    this = sys.modules[__name__]
    by_value = cloudpickle.cloudpickle._PICKLE_BY_VALUE_MODULES  # the module names pickled by value
    assert __name__ not in by_value
    with testing.RoundEntry(functools.partial(_entry)):  # a partial: its function's module
        assert __name__ in by_value
        with testing.RoundEntry(lambda task, workers: _entry(task, workers)):
            assert __name__ in by_value
        assert __name__ in by_value  # still installed outside: not unregistered by the inner block
    assert __name__ not in by_value and this is sys.modules[__name__]
    with testing.Sleeper(0.0):
        assert not {m for m in by_value if m.startswith("sparkdl_avg")}
