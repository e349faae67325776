"""Progress of a fit on the driver: a tqdm bar per epoch and log lines.

``verbose=1`` on a terminal shows a bar per epoch (minibatches done, examples/s,
current loss), which ends at 100% when the epoch does; while it is drawn, the
console handlers of the ``sparkdl_avg`` and root loggers write through
``tqdm.write`` (``tqdm.contrib.logging``), so a warning during the epoch (the
slow-fit warning) gets its own line above the bar instead of being written
onto the bar's. Any ``verbose > 0`` logs one line per epoch and a time summary
at the end through the ``sparkdl_avg`` logger. When the application has not
configured logging at all, that logger gets a handler printing bare messages
to stderr, so progress is visible by default, as with ``keras.Model.fit``.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Dict, Optional

logger = logging.getLogger("sparkdl_avg")


def ensure_visible_logging() -> None:
    """Adds a plain stderr handler if neither our logger nor the root has one."""
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


def _console(handler: logging.Handler) -> bool:
    """Whether ``handler`` prints to the terminal (what ``tqdm.contrib.logging`` redirects)."""
    return isinstance(handler, logging.StreamHandler) and handler.stream in (sys.stdout, sys.stderr)


def format_logs(logs: Dict[str, float]) -> str:
    return " - ".join(f"{k}: {v:.4f}" for k, v in logs.items())


class Progress:
    """Reports a fit's progress; every method is a no-op when ``verbose == 0``.

    Args:
        verbose: 0 silent, 1 bar on a terminal plus epoch lines, 2 epoch lines.
        epochs: Epochs of the fit.
        steps_per_epoch: Minibatches per worker in an epoch (the bar's total;
            a round advances it by its ``k``, which a schedule may vary).
    """

    def __init__(self, verbose: int, epochs: int, steps_per_epoch: int) -> None:
        self.verbose = verbose
        self.epochs = epochs
        self.steps = steps_per_epoch
        self._bar = None
        self._redirect = None  # tqdm's logging redirection while the bar is drawn
        self._t_epoch = 0.0
        self._examples = 0
        if verbose:
            ensure_visible_logging()

    def epoch_begin(self, epoch: int) -> None:
        if not self.verbose:
            return
        self._t_epoch = time.perf_counter()
        self._examples = 0
        if self.verbose == 1 and sys.stderr.isatty():
            from tqdm.auto import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            self._bar = tqdm(
                total=self.steps, desc=f"Epoch {epoch + 1}/{self.epochs}", unit="minibatch", leave=False
            )
            # only the loggers that print to the console: tqdm adds its handler to each logger it is given
            consoles = [lg for lg in (logger, logging.getLogger()) if any(_console(h) for h in lg.handlers)]
            self._redirect = logging_redirect_tqdm(loggers=consoles)
            self._redirect.__enter__()

    def round_end(self, record: dict, logs: Dict[str, float], steps: Optional[float] = None) -> None:
        """Counts a round (or an asynchronous chunk: ``steps`` minibatches per worker, a fraction) on the bar."""
        if not self.verbose:
            return
        self._examples += record.examples
        if self._bar is not None:
            elapsed = time.perf_counter() - self._t_epoch
            self._bar.set_postfix(
                loss=f"{logs.get('loss', float('nan')):.4f}",
                ex_s=f"{self._examples / elapsed:.0f}" if elapsed > 0 else "-",
            )
            self._bar.update(record.averaging_frequency if steps is None else steps)

    def epoch_end(self, epoch: int, rounds_run: int, logs: Dict[str, float], resumed_after: int = 0) -> None:
        """Logs the epoch's line: ``rounds_run`` rounds in this fit, after ``resumed_after`` a checkpoint had."""
        if not self.verbose:
            return
        self._close_bar(done=True)
        elapsed = time.perf_counter() - self._t_epoch
        rounds = f"{rounds_run} round{'s' if rounds_run != 1 else ''}"
        if resumed_after:
            rounds += f" after the checkpoint's {resumed_after}"
        logger.info(
            "Epoch %d/%d - %s - %.1fs - %.0f examples/s - %s",
            epoch + 1,
            self.epochs,
            rounds,
            elapsed,
            self._examples / elapsed if elapsed > 0 else 0.0,
            format_logs(logs),
        )

    def _close_bar(self, done: bool) -> None:
        """Closes the epoch's bar (at 100% first when the epoch is ``done``) and ends the logging redirection."""
        if self._bar is not None:
            if done and self._bar.n < self._bar.total:  # a short last round, an elastic epoch: the epoch is whole
                self._bar.update(self._bar.total - self._bar.n)
            self._bar.refresh()
            self._bar.close()
            self._bar = None
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None

    def close(self) -> None:
        """Ends a bar a failed or interrupted epoch left open (the fit's end calls it; harmless otherwise)."""
        self._close_bar(done=False)

    def train_end(self, summary: Optional[dict]) -> None:
        self.close()
        if not self.verbose or not summary:
            return
        logger.info(
            "Time in rounds: %.1fs over %d round%s; compute %.0f%% (slowest worker), overhead "
            "%.0f ms per round (median), straggler ratio %.2f (median), replicas built %d",
            summary["wall_s"],
            summary["rounds"],
            "s" if summary["rounds"] != 1 else "",
            100 * summary["compute_share"],
            1000 * summary["overhead_s_median"],
            summary["straggler_ratio_median"],
            summary["replicas_built"],
        )
