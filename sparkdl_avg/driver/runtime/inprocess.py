"""The in-process engine: a fit's rounds run in the calling process, one worker after another, without Spark.

For tests of the arithmetic (the identities with Keras, every update rule, compression's error feedback, what workers
keep between rounds) where Spark is not what is tested: each round runs the executors' own round body
(:func:`sparkdl_avg.executor.worker.run_round_partition`, or a test's :class:`~sparkdl_avg.testing.RoundEntry`) for
each worker in turn, in this process, and sums the results as the ``"spark"`` transport's tree does
(:class:`~sparkdl_avg.driver.transport.inprocess.InProcessTransport`). What a task carries and what it returns are
pickled and unpickled on the way, as a Spark task's closure and result are: a worker cannot change another's input,
and what could not cross to an executor fails here too. No JVM starts, and a round costs no Spark job: on two busy
cores the suite's arithmetic modules ran in 0.84× their time on ``local[2]`` (docs/benchmarks/test_suite_time.md).

Inside ``with in_process(num_workers):`` a fit (or ``evaluate``) on numpy arrays runs on this engine instead of the
active Spark session; a DataFrame is always run by its own session. The engine runs the rounds with the default
``state_transport`` and ``aggregation`` (``"auto"``), a stale or asynchronous fit's chunks one job at a time (so no
worker runs ahead: stragglers are tested on Spark); the options only Spark
runs (another transport or aggregation path, ``overlap_rounds``' standing job, ``elastic`` membership) are refused
before any round, naming the option. Every state transport and aggregation path keeps its own tests on real Spark.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import threading
from typing import Any, Callable, Iterator, List, Optional, Sequence

from ...errors import ConfigurationError
from ...shared.wire.local_broadcast import LocalBroadcast
from .session import Engine

_installed: List["InProcessEngine"] = []  # the engines of the open ``in_process`` blocks, innermost last
_ids = itertools.count()


class InProcessEngine(Engine):
    """A stand-in for a Spark session whose jobs run in this process, partition after partition.

    Attributes:
        num_workers: Its task slots (``default_parallelism``): the fit's workers unless ``num_workers`` says.
        in_process: ``True`` (a Spark :class:`~sparkdl_avg.driver.runtime.session.Engine` has ``False``).
    """

    in_process = True

    def __init__(self, num_workers: int = 2) -> None:  # noqa: D107 - no Spark session to wrap
        if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
            raise ConfigurationError(f"The 'num_workers' parameter of in_process must be an integer >= 1. "
                                     f"Got {num_workers!r} instead.")
        self.spark = None
        self.connect = False
        self.sc = None
        self.num_workers = num_workers
        self._id = next(_ids)
        self._parallelism = num_workers
        self._ranges = {}
        # One job at a time: the workers share this process's replica (as a Python worker running several tasks
        # one after another does), so two jobs from a stale fit's threads must not train it at once.
        self._lock = threading.Lock()

    @property
    def master(self) -> str:
        return f"inprocess[{self.num_workers}]"

    @property
    def one_host(self) -> bool:
        return True

    @property
    def version(self) -> str:
        return "in-process"

    @property
    def key(self) -> str:
        return f"inprocess:{self._id}"

    def conf(self, key: str) -> Optional[str]:
        return None

    @contextlib.contextmanager
    def labels(self, description: str, group: Optional[str] = None):
        yield

    def carried_labels(self, description: str) -> Callable[[], Any]:
        return contextlib.nullcontext

    def cancel(self, group: Optional[str]) -> None:
        """Nothing to cancel: a job runs in the calling thread, which a Ctrl-C interrupts itself."""

    def broadcast(self, value: Any) -> LocalBroadcast:
        return LocalBroadcast(value)

    def warm_up(self, model=None) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result([])  # this process is the workers' one; it has TensorFlow already
        return future

    def cancel_warm_up(self) -> None:
        """No warm-up runs."""

    def run_tasks(self, n: int, body: Callable, schema: str, start: int = 0, places=None):
        raise ConfigurationError("This call needs a Spark session: the in-process engine runs a fit's rounds and "
                                 "evaluations on numpy arrays only.")

    def located(self, items, places):
        raise ConfigurationError("The in-process engine has no hosts to place tasks on.")

    def map_partitions(self, body: Callable[..., Iterator[Any]], parts: Sequence[Any]) -> List[Any]:
        """``body(part_items)``'s results for each partition of ``parts`` (one item each), in order.

        ``body`` and each result cross a pickle, as a Spark task's closure and results do.
        """
        import pickle

        from pyspark import cloudpickle

        shipped = cloudpickle.dumps(body)
        results = []
        with self._lock:
            for part in parts:
                out = list(pickle.loads(shipped)([part]))
                results.extend(pickle.loads(cloudpickle.dumps(out)))
        return results

    def check_options(self, config) -> None:
        """Refuses, before any round, the options the in-process engine cannot run, naming each.

        Raises:
            ConfigurationError: a ``state_transport`` or ``aggregation`` other than ``"auto"``, ``overlap_rounds``,
                ``elastic``.
        """
        for name, default in (("state_transport", "auto"), ("aggregation", "auto")):
            value = getattr(config, name)
            if value != default:
                raise ConfigurationError(f"The {name!r} parameter must be {default!r} on the in-process engine, which "
                                         f"sums the workers' results itself; got {value!r}. Run on a Spark session to "
                                         f"test {value!r}.")
        for name in ("overlap_rounds", "elastic"):
            if getattr(config, name, False):
                raise ConfigurationError(f"The {name!r} parameter must be off on the in-process engine: it runs only "
                                         "on a Spark session.")


def installed() -> Optional[InProcessEngine]:
    """The engine of the innermost open :func:`in_process` block in this process, or ``None``."""
    return _installed[-1] if _installed else None


@contextlib.contextmanager
def in_process(num_workers: int = 2) -> Iterator[InProcessEngine]:
    """Inside the block, fits and evaluations on numpy arrays run their rounds in this process, without Spark.

    An :class:`InProcessEngine` of ``num_workers`` task slots stands in for the active Spark session: each round runs
    the executors' code for each worker in turn, what its tasks carry and return pickled as Spark's are, and the
    weights come out bit for bit those of a ``local[num_workers]`` fit with the default transport. For testing a
    rule, a callback or a preprocessing function of one's own without a JVM::

        with sparkdl_avg.in_process(2):
            trainer.fit((x, y), epochs=1)

    Only ``state_transport`` and ``aggregation`` ``"auto"`` run there, without ``overlap_rounds`` or ``elastic``
    (refused before any round, naming the option); a DataFrame always runs on its own session. Yields the engine.

    Args:
        num_workers: The engine's task slots (Spark's ``default_parallelism``): the fit's workers where
            ``num_workers`` is not given to the trainer. Default 2.

    Raises:
        ConfigurationError: ``num_workers`` is not an integer >= 1.
    """
    engine = InProcessEngine(num_workers)
    _installed.append(engine)
    try:
        yield engine
    finally:
        _installed.remove(engine)
