"""``sparkdl_avg.tracking``, the path users import ``MlflowLogger`` from; the code lives in :mod:`sparkdl_avg.driver.observe.tracking`.

This module *is* that one (``sys.modules`` points here at it), so ``import
sparkdl_avg.tracking``, ``from sparkdl_avg.tracking import ...``, pickles and saved objects
naming this path keep working.
"""

import sys as _sys

from .driver.observe import tracking as _module

_sys.modules[__name__] = _module
