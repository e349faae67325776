"""``sparkdl_avg.ml``, the path users import the Spark ML stages from (``KerasAveragingEstimator``, ``KerasAveragingModel``); the code lives in :mod:`sparkdl_avg.driver.api.ml`.

This module *is* that one (``sys.modules`` points here at it), so ``import
sparkdl_avg.ml``, ``from sparkdl_avg.ml import ...``, pickles and saved pipelines
naming this path keep working.
"""

import sys as _sys

from .driver.api import ml as _module

_sys.modules[__name__] = _module
