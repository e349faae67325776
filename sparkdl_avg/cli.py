"""``sparkdl_avg.cli``, the path the spark-submit jobs in ``jobs/`` import their plumbing from; the code lives in :mod:`sparkdl_avg.driver.api.cli`.

This module *is* that one (``sys.modules`` points here at it), so ``import
sparkdl_avg.cli``, ``from sparkdl_avg.cli import ...``, pickles and saved objects
naming this path keep working.
"""

import sys as _sys

from .driver.api import cli as _module

_sys.modules[__name__] = _module
