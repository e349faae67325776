"""``sparkdl_avg.driver.ml``, kept because saved files record it; the code lives in :mod:`sparkdl_avg.driver.api.ml`.

This module *is* that one (``sys.modules`` points here at it), so saved Spark ML
pipelines and MLflow models naming this path keep loading.
"""

import sys as _sys

from .api import ml as _module

_sys.modules[__name__] = _module
