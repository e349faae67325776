"""Issue 48, part 2, defect 9: a worker's late result cannot make a deleted staging root again.

A killed fit's root was deleted (by the sweep of dead drivers' roots, or ``close()``), then a task that
outlived the fit wrote its round's sums under it: the write made the root again, without its owner
marker, and the sweep never took it. Workers now make only their round's directory, below a parent
that must exist.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from sparkdl_avg.driver.data.staging_roots import StagingRoot, remove_orphans
from sparkdl_avg.shared.wire import exchange


@dataclass(frozen=True)
class _Result:  # what StoreSums reads of a worker's result
    deltas: Any = None
    weight_sums: Any = None
    optimizer_sums: Any = None


def _result():
    return _Result(weight_sums=[np.ones(3)])


def test_a_late_result_does_not_make_the_removed_root_again(tmp_path):
    root = StagingRoot.new(str(tmp_path), 1)
    root.make(private=True)
    round_dir = os.path.join(root.uri, "files", "round-3")
    exchange.store_state(round_dir, "state", [np.zeros(3)], None)  # the driver publishes the round
    exchange.StoreSums(round_dir).deliver(_result(), "w0")  # a worker delivers in time
    root.remove()  # the fit ends (or the sweep takes a dead driver's root)
    with pytest.raises(FileNotFoundError, match="is gone with its parent"):
        exchange.StoreSums(round_dir).deliver(_result(), "w1")  # the straggler's result
    assert not os.path.exists(root.uri)
    assert remove_orphans(str(tmp_path)) == []  # nothing left for the sweep to miss


def test_a_worker_still_makes_its_rounds_directory_below_a_live_one(tmp_path):
    parent = tmp_path / "exchange-0"
    parent.mkdir()
    stored = exchange.StoreSums(str(parent / "round-1")).deliver(_result(), "w0")
    assert os.path.isfile(stored.sums.arrays.uri)
