"""What stands for a Spark broadcast where rounds run without Spark (the in-process engine).

Tasks read a broadcast's ``value``; on the in-process engine (:mod:`sparkdl_avg.driver.runtime.inprocess`) the state
and the model's spec travel as a :class:`LocalBroadcast` instead, which the executor code reads the same way.
"""

from __future__ import annotations

from typing import Any, Optional


class LocalBroadcast:
    """What stands for a Spark broadcast where rounds run without Spark (the in-process engine,
    :mod:`sparkdl_avg.driver.runtime.inprocess`): the value pickled once, each read unpickling a copy of its own.

    A copy per read, as each Python worker of a Spark job unpickles its own: a task that changes what it loaded in
    place cannot change what the next worker loads, and a value that could not cross to an executor fails here too.
    """

    def __init__(self, value: Any) -> None:
        from pyspark import cloudpickle

        self._bytes: Optional[bytes] = cloudpickle.dumps(value)

    @property
    def value(self) -> Any:
        import pickle

        if self._bytes is None:
            raise RuntimeError("This broadcast was destroyed.")
        return pickle.loads(self._bytes)

    def unpersist(self, blocking: bool = False) -> None:
        """Nothing is cached apart from the value itself (as Spark's, it can still be read)."""

    def destroy(self, blocking: bool = False) -> None:
        """Drops the value: a later read fails, as a destroyed Spark broadcast's."""
        self._bytes = None
