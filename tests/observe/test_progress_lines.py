"""Issue 48, part 2, defect 10: on a terminal, a warning during an epoch gets its own line and the bar ends at 100%.

The bar is tqdm's; while it is drawn, the ``sparkdl_avg`` and root loggers' console handlers write
through ``tqdm.write`` (``tqdm.contrib.logging``), which clears the bar, prints the line and redraws it.
"""

from __future__ import annotations

import io
import logging
import sys
from types import SimpleNamespace

import pytest

from sparkdl_avg.driver.observe.progress import Progress, logger


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def terminal(monkeypatch):
    """Makes stderr a terminal, with the library's console handler writing to it (as ensure_visible_logging adds).

    Called in the test's body: pytest points ``sys.stderr`` at its capture after the fixtures are set up.
    """
    added = []
    old_level = logger.level

    def start():
        screen = _Terminal()
        monkeypatch.setattr(sys, "stderr", screen)
        handler = logging.StreamHandler(screen)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        added.append(handler)
        return screen

    yield start
    for handler in added:
        logger.removeHandler(handler)
    logger.setLevel(old_level)


def _round(k):
    return SimpleNamespace(examples=8 * k, averaging_frequency=k)


def test_a_warning_during_the_epoch_is_not_written_onto_the_bar(terminal):
    screen = terminal()
    progress = Progress(verbose=1, epochs=1, steps_per_epoch=11)
    progress.epoch_begin(0)
    progress.round_end(_round(5), {"loss": 0.5})
    logger.warning("This fit is slower than one process would be.")
    progress.round_end(_round(5), {"loss": 0.4})  # 10 of 11: a short epoch, as an elastic one can be
    progress.epoch_end(0, 2, {"loss": 0.4})
    text = screen.getvalue()
    assert "This fit is slower" in text
    for line in text.split("\n"):
        if "This fit is slower" in line:  # what the terminal shows of the line: after its last carriage return
            assert line.split("\r")[-1].startswith("This fit is slower"), repr(line)
    assert "100%" in text  # the bar ended full, not at 91%
    assert "Epoch 1/1 - 2 rounds" in text
    assert all(not isinstance(h, logging.StreamHandler) or h.stream is screen
               for h in logger.handlers)  # the redirection ended with the bar: the handler is the console's again


def test_a_failed_epoch_ends_the_redirection(terminal):
    terminal()
    progress = Progress(verbose=1, epochs=2, steps_per_epoch=4)
    progress.epoch_begin(0)
    handlers = list(logger.handlers)
    assert any(type(h).__name__ == "_TqdmLoggingHandler" for h in handlers)
    progress.close()  # the fit's end after a failed round
    assert not any(type(h).__name__ == "_TqdmLoggingHandler" for h in logger.handlers)

