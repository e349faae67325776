"""Algorithms on the driver: update rules (how the replicas' average becomes the next weights) and averaging schedules (k per round).

Pure numerics and their parameters: imports only the shared side, :mod:`sparkdl_avg.errors`
and :mod:`..config.options` (the constraint types rules declare their parameters with).
"""
