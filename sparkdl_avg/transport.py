"""How a round's state reaches the workers and their sums come back: the driver's half.

This module owns the ``state_transport`` option: :func:`choose` turns it
into one :class:`StateTransport` per fit, and the round runner
(:mod:`sparkdl_avg.round`) asks that object to send each round's state
(:meth:`StateTransport.send`), to bring the workers' sums back as one
:class:`~sparkdl_avg.aggregation.PartialResult` (:meth:`StateTransport.gather`)
and to clean up (:meth:`StateTransport.end_round`, :meth:`StateTransport.close`).
What the tasks themselves carry (state sources, result sinks) and the file
format live in :mod:`sparkdl_avg.exchange`, the executor-visible half.

* :class:`SparkTransport` — ``sc.broadcast`` out, ``treeAggregate`` back
  (depth ``aggregation_depth``): works on any cluster.
* :class:`FileTransport` — one file out and one file per worker back, under
  the staging directory: cheaper wherever driver and executors share a fast
  filesystem (always on one host; measured in docs/benchmarks.md).
"""

from __future__ import annotations

import functools
import logging
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from . import exchange
from .aggregation import PartialResult, merge
from .errors import PathError, WorkerError
from .fs import join, remove_tree
from .remote import run_job

logger = logging.getLogger("sparkdl_avg")


class StateTransport:
    """One fit's way of moving round state out to the workers and their sums back.

    Attributes:
        name: ``"spark"`` or ``"files"`` (what ``state_transport="auto"`` chose).
    """

    name = ""

    def send(self, round_name: str, weights: Sequence[np.ndarray], optimizer: Sequence[np.ndarray]) -> Tuple[Any, Any]:
        """Publishes a round's state; returns the ``(state source, result sink)`` its tasks carry."""
        raise NotImplementedError

    def gather(self, results, epoch: int, rnd: int) -> PartialResult:
        """Runs round ``rnd`` of ``epoch``'s job (``results``: the RDD of what its tasks yield) and sums it.

        Raises:
            DataError, WorkerError: decoded from the failed job (:mod:`sparkdl_avg.remote`).
        """
        raise NotImplementedError

    def end_round(self) -> None:
        """Releases what :meth:`send` published for the round that just ended."""

    def close(self) -> None:
        """Releases everything left at the end of the fit, however it ends."""


class SparkTransport(StateTransport):
    """State as a Spark broadcast; sums as task results, summed by ``treeAggregate(depth)``."""

    name = "spark"

    def __init__(self, sc, depth: int) -> None:
        self.sc = sc
        self.depth = depth
        self._broadcast = None

    def send(self, round_name, weights, optimizer):
        self._broadcast = self.sc.broadcast((weights, optimizer))
        return exchange.BroadcastState(self._broadcast), exchange.ReturnSums()

    def gather(self, results, epoch, rnd):
        return run_job(lambda: results.treeAggregate(None, merge, merge, self.depth), _what(epoch, rnd))

    def end_round(self) -> None:
        if self._broadcast is not None:
            self._broadcast.unpersist()
            self._broadcast = None


class FileTransport(StateTransport):
    """State and sums as files under ``directory``, one subdirectory per round.

    The driver collects the workers' small :class:`~sparkdl_avg.exchange.StoredResult`\\ s
    (no tree: the arrays never pass through Spark) and adds their files in
    the tasks' order. Deleting a round's directory also takes the files of
    failed or speculative attempts; :meth:`close` deletes the fit's.
    """

    name = "files"

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._round_dir: Optional[str] = None

    def send(self, round_name, weights, optimizer):
        self._round_dir = join(self.directory, round_name)
        state = exchange.store_state(self._round_dir, "state", weights, optimizer)
        return state, exchange.StoreSums(self._round_dir)

    def gather(self, results, epoch, rnd):
        delivered: List[exchange.StoredResult] = run_job(results.collect, _what(epoch, rnd))
        total = functools.reduce(merge, [d.result for d in delivered], None)
        try:
            weight_sums, optimizer_sums = _add_stored([d.sums for d in delivered if d.sums is not None])
        except (OSError, PathError) as exc:  # PathError: the staging URI cannot be opened from here
            raise WorkerError(
                f"Could not read the workers' results of epoch {epoch}, round {rnd} under {self._round_dir!r}: {exc}. With "
                "state_transport='files' the driver must read what executors write under staging_dir; use a "
                "filesystem both see, or state_transport='spark'."
            ) from exc
        total.weight_sums, total.optimizer_sums = weight_sums, optimizer_sums
        return total

    def end_round(self) -> None:
        if self._round_dir is not None:
            _remove_quietly(self._round_dir)
            self._round_dir = None

    def close(self) -> None:
        # Files of rounds cut short by an error, and of task attempts that outlived their round.
        _remove_quietly(self.directory)


def _what(epoch: int, rnd: int) -> str:
    return f"Round {rnd} of epoch {epoch}"


def _add_stored(stored: Sequence[exchange.StoredState]):
    """The element-wise sums of the stored states' weights and optimizer variables, in order; deletes their files."""
    weight_sums = optimizer_sums = None
    try:
        for item in stored:
            weights, opt = exchange.load_state(item)
            weight_sums = _accumulate(weight_sums, weights)
            if opt is not None:
                optimizer_sums = _accumulate(optimizer_sums, opt)
            del weights, opt  # drop the views so the memory map closes
    finally:
        for item in stored:
            exchange.remove(item.arrays)
    return weight_sums, optimizer_sums


def _accumulate(acc: Optional[List[np.ndarray]], arrays: List[np.ndarray]) -> List[np.ndarray]:
    """Adds ``arrays`` (read-only views) into ``acc``; copies them when ``acc`` is ``None``."""
    if acc is None:
        return [np.array(a) for a in arrays]
    for x, y in zip(acc, arrays):
        np.add(x, y, out=x)
    return acc


def _remove_quietly(uri: str) -> None:
    """Deletes a tree of exchange files; a failure is logged, not raised (it must not hide the fit's own error)."""
    try:
        remove_tree(uri)
    except OSError as exc:
        logger.warning("Could not delete %s: %s", uri, exc)


def choose(mode: str, sc, staging_root: str, fit_name: str, depth: int) -> StateTransport:
    """The transport of one fit for ``state_transport=mode`` (``"auto"``, ``"spark"`` or ``"files"``).

    ``"auto"`` takes files when every executor runs on the driver's host
    (``local[N]``, ``local-cluster``) and the staging directory is local,
    else Spark. ``fit_name`` names the fit's directory under ``staging_root``.
    """
    if mode == "spark":
        return SparkTransport(sc, depth)
    # By the URI's scheme: resolving an hdfs:// or s3:// root would connect to it.
    local_fs = "://" not in staging_root or staging_root.startswith("file://")
    one_host = sc.master.startswith("local")  # local[N] and local-cluster[...]
    if mode == "auto" and not (local_fs and one_host):
        return SparkTransport(sc, depth)
    if local_fs and not one_host:
        logger.warning(
            "state_transport='files' with the local staging directory %s while the master is %s: "
            "the driver and every executor must read each other's files there (e.g. one host, or NFS).",
            staging_root,
            sc.master,
        )
    return FileTransport(join(staging_root, fit_name))
