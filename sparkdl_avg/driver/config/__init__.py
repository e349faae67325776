"""Configuration: the one table of options and its machinery, from which signatures, CLI flags, ML Params and docs derive.

:mod:`.options` is the table: the trainer's rows and the checks that join them (``JOINTS``), with ``fit``'s and
MLflow's rows from :mod:`.fit_options`. Its machinery is apart: :mod:`.rows` (what a row declares),
:mod:`.constraints` (the constraint types, the flags' parsers, the checks across options), :mod:`.codegen`
(signatures, keyword checks, docstrings' Args), :mod:`.messages` (the messages in flags' and Params' words).
:mod:`.trainer_config` validates one configuration.

The bottom of the driver's layers: imports only :mod:`..algorithms`, the shared side and :mod:`sparkdl_avg.errors`.

Its other modules:

* :mod:`.joints`: the checks that join several trainer options, :data:`JOINTS`: the options table's second
  half.
"""
