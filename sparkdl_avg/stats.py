"""Per-round timing records of a fit, as data and as JSON.

One record per round; times are seconds. The phases add up to the round's
wall time: ``wall_s = broadcast_s + schedule_s + workers_s + aggregate_s +
update_s + other_s`` (``job_s = schedule_s + workers_s + aggregate_s``), where

* ``broadcast_s``: reading the model's state and broadcasting it;
* ``schedule_s``: from submitting the job until the first worker starts;
* ``workers_s``: first worker start to last worker end;
* ``aggregate_s``: the rest of the job — results, ``treeAggregate``, transfer;
* ``update_s``: averaging and setting the new state on the driver's model;
* ``other_s``: bookkeeping (normally well under a millisecond).

Per round also: ``compute_{min,max,mean}_s`` and ``load_{max,mean}_s``,
``setup_max_s`` (replica lookup or build plus state assignment),
``overhead_s`` (wall time minus the slowest worker's busy time), ``loss``,
``examples``, ``examples_per_s``, ``averaging_frequency``, ``replicas_built``
and ``workers``: one record per worker with ``host``, ``pid``, ``start``,
``end`` (its wall clock), ``setup_s``, ``load_s``, ``compute_s``.
"""

from __future__ import annotations

import json
import statistics
from typing import Dict, List, Optional

from .files import replace_atomically


class TrainingStats:
    """The round records of one trainer (all its fits), in order."""

    def __init__(self) -> None:
        self.records: List[Dict] = []

    def add(self, record: Dict) -> None:
        self.records.append(record)

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self):
        return iter(self.records)

    def to_json(self, path: Optional[str] = None) -> str:
        """The records as a JSON array; also written to ``path`` when given."""
        text = json.dumps(self.records, indent=1)
        if path is not None:
            with replace_atomically(path, suffix=".json") as tmp:
                with open(tmp, "w", encoding="utf-8") as f:
                    f.write(text)
        return text

    def summary(self, first: int = 0) -> Dict[str, float]:
        """Totals and medians over the rounds from index ``first`` on (default: all).

        ``compute_share`` is the slowest worker's compute time over the round
        wall time, summed over rounds; ``overhead_s_median`` is the median of
        (round wall time − slowest worker's setup, load and compute);
        ``straggler_ratio_median`` is the median slowest/fastest compute ratio.
        """
        records = self.records[first:]
        if not records:
            return {}
        wall = sum(r["wall_s"] for r in records)
        return {
            "rounds": len(records),
            "wall_s": wall,
            "examples": sum(r["examples"] for r in records),
            "compute_share": sum(r["compute_max_s"] for r in records) / wall if wall else 0.0,
            "overhead_s_median": statistics.median(r["overhead_s"] for r in records),
            "straggler_ratio_median": statistics.median(
                r["compute_max_s"] / r["compute_min_s"] if r["compute_min_s"] > 0 else 1.0
                for r in records
            ),
            "replicas_built": sum(r["replicas_built"] for r in records),
        }
