"""Per-round timing records of a fit, as data and as JSON.

One record per round. Times are seconds measured on the driver
(``perf_counter``) unless the field says ``worker``; worker fields come from
the executors' own clocks. The driver-side phases add up to ``wall_s``:
``broadcast_s + job_s + update_s + other_s``, where ``job_s`` covers
scheduling, the workers' setup, data loading and compute, and the tree
aggregation.
"""

from __future__ import annotations

import json
import statistics
from typing import Dict, List, Optional


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
            with open(path, "w") as f:
                f.write(text)
        return text

    def summary(self) -> Dict[str, float]:
        """Totals and medians over all rounds.

        ``compute_share`` is the slowest worker's compute time over the round
        wall time, summed over rounds; ``overhead_s_median`` is the median of
        (round wall time − slowest worker's setup, load and compute);
        ``straggler_ratio_median`` is the median slowest/fastest compute ratio.
        """
        if not self.records:
            return {}
        wall = sum(r["wall_s"] for r in self.records)
        return {
            "rounds": len(self.records),
            "wall_s": wall,
            "examples": sum(r["examples"] for r in self.records),
            "compute_share": sum(r["compute_max_s"] for r in self.records) / wall if wall else 0.0,
            "overhead_s_median": statistics.median(r["overhead_s"] for r in self.records),
            "straggler_ratio_median": statistics.median(
                r["compute_max_s"] / r["compute_min_s"] if r["compute_min_s"] > 0 else 1.0
                for r in self.records
            ),
            "replicas_built": sum(r["replicas_built"] for r in self.records),
        }
