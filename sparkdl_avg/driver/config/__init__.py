"""Configuration: :mod:`.options` is the one table of options (from which signatures, CLI flags, ML Params and docs derive); :mod:`.trainer_config` validates one configuration.

The bottom of the driver's layers: imports only the shared side and :mod:`sparkdl_avg.errors`.
"""
