"""``optimizer_state="local"``: each worker's own optimizer variables between its rounds, as files.

DiLoCo (Douillard et al. 2023) and its descendants keep each replica's inner
optimizer state (AdamW's moments) on the replica and average only the
weights. Here worker ``i`` of a round reads the optimizer variables it ended
its previous round with and writes those it ends this round with, in a file
under the fit's staging directory: ``<directory>/<round>-w<i>.bin``, the
variables' raw bytes in ``optimizer.variables`` order. A task that Spark
retries (on this executor or another) reads the same file and writes the
same bytes, and a lost executor loses nothing: the files are on the storage
every executor shares. The driver's side (which round reads which, when
files go, what a checkpoint carries) is
:class:`~sparkdl_avg.driver.feedback.FeedbackLedger`'s, as for error
feedback's residuals.

A worker that has no file yet (the fit's first round, or a worker index an
elastic round adds) starts from the optimizer variables the driver sent: the
driver's own, which these fits never update but for the iteration counter.
Files rather than the executors' memory: PySpark hands consecutive tasks to
different Python workers and Spark moves tasks between executors, so a
worker's memory is not where its next round runs (measured in
docs/benchmarks.md, "DiLoCo: each worker's own optimizer state").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np

from .delta_sums import WorkerRoundFiles


def to_bytes(arrays: Sequence[np.ndarray]) -> bytes:
    """The arrays' raw bytes, one after another (C order; 0-d counters as one value)."""
    return b"".join(np.ascontiguousarray(np.asarray(a)).reshape(-1).view(np.uint8).tobytes() for a in arrays)


def from_bytes(data: bytes, template: Sequence[np.ndarray]) -> List[np.ndarray]:
    """Arrays shaped and typed as ``template`` from :func:`to_bytes`' output (copies, writable)."""
    out, offset = [], 0
    for t in template:
        t = np.asarray(t)
        n = t.size * t.dtype.itemsize
        if offset + n > len(data):
            raise ValueError(f"a local optimizer state of {len(data)} bytes is shorter than its variables' "
                             f"{sum(np.asarray(x).nbytes for x in template)}")
        out.append(np.frombuffer(data, np.uint8, count=n, offset=offset).view(t.dtype).reshape(t.shape).copy())
        offset += n
    if offset != len(data):
        raise ValueError(f"a local optimizer state of {len(data)} bytes does not match its variables' {offset}")
    return out


@dataclass(frozen=True)
class LocalStateFiles(WorkerRoundFiles):
    """Where a round's workers read and write their own optimizer variables (``optimizer_state="local"``).

    ``fresh`` workers (an elastic round's new ones) have no state yet and start from the sent variables.
    """

    what = "optimizer state (optimizer_state='local')"

    def load(self, worker: int, template: Sequence[np.ndarray]) -> Optional[List[np.ndarray]]:
        """Worker ``worker``'s optimizer variables from its previous round (``None``: it has none yet)."""
        data = self.read_bytes(worker)
        return None if data is None else from_bytes(data, template)

    def save(self, worker: int, variables: Sequence[np.ndarray]) -> None:
        """Writes worker ``worker``'s optimizer variables after this round."""
        self.write_bytes(worker, to_bytes(variables))
