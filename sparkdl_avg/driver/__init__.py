"""The driver's side: what runs in the user's Python process (a spark-submit job, a notebook, a pipeline).

Nothing here runs on executors. The public names are re-exported by
:mod:`sparkdl_avg`; import them from there. A round's path through this side:
:mod:`.trainer` (the API and the epoch loop) → :mod:`.rounds` (one round: state
out, the job, the update) → :mod:`.transport` (how state and sums move) → the
executor side (:mod:`sparkdl_avg.executor.worker`).
"""
