"""``sparkdl_avg.driver.pyfunc``, kept because saved files record it; the code lives in :mod:`sparkdl_avg.driver.observe.pyfunc`.

This module *is* that one (``sys.modules`` points here at it), so saved Spark ML
pipelines and MLflow models naming this path keep loading.
"""

import sys as _sys

from .observe import pyfunc as _module

_sys.modules[__name__] = _module
