"""``sparkdl_avg.testing``, the path tests and benchmarks import ``Straggler`` from; the code lives in :mod:`sparkdl_avg.executor.testing`.

This module *is* that one (``sys.modules`` points here at it), so ``import
sparkdl_avg.testing``, ``from sparkdl_avg.testing import ...``, pickles and saved objects
naming this path keep working.
"""

import sys as _sys

from .executor import testing as _module

_sys.modules[__name__] = _module
