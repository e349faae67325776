"""The checks that join several trainer options, :data:`JOINTS`: the options table's second half.

Each row of :mod:`.options` checks its own value; these run after them, in
order (``TrainerConfig.__post_init__`` via
:func:`~.constraints.check_joints`), and the first refusal is the error.
Each concerns its first option when that is set (not its default); the
options page and tests/config/test_joints.py (one case per check, with its
message) read them from here.
"""

from __future__ import annotations

from typing import Any, Mapping, Tuple

from ...shared.wire.delta_sums import COMPRESSIONS as UPDATE_COMPRESSIONS
from ...shared.wire.delta_sums import segment_feedback
from ..algorithms.rules import PlainAveraging, as_update_rule
from .constraints import CrossCheck, Joint, Requires


def _most(values: Mapping[str, Any]) -> Any:
    """The most workers a round may have: ``max_workers``, else ``num_workers`` (``None``: not given)."""
    return values["max_workers"] if values["max_workers"] is not None else values["num_workers"]


#: The checks that join several trainer options, in the order they run.
JOINTS: Tuple[CrossCheck, ...] = (
    Requires(
        "reproducible", "synchronization", ("stale",),
        "The 'reproducible' parameter needs synchronization='stale' (a bound: its chunks read the weights "
        "'staleness' rounds back); 'sync' repeats bitwise anyway, and 'async' has no bound. "
        "Got reproducible=True with synchronization={synchronization!r} instead."),
    Requires(
        "staleness", "synchronization", ("stale", "async"),
        "The 'staleness' parameter applies only when 'synchronization' is 'stale' (the bound of its chunks; "
        "'sync' rounds wait for every worker): set 'synchronization' to 'stale' or leave 'staleness' at its "
        "default ({default}). Got staleness={staleness!r} with synchronization='sync' instead."),
    Requires(
        "aggregation_shards", "aggregation", ("shuffle", "storage", "auto"),
        "The 'aggregation_shards' parameter applies only when 'aggregation' is 'shuffle', 'storage' or 'auto' "
        "(the sharded aggregations; 'driver' and 'files' sum every worker's sums on the driver). "
        "Got aggregation_shards={aggregation_shards!r} with aggregation={aggregation!r} instead."),
    Requires(
        "staleness_aware", "synchronization", ("stale", "async"),
        "The 'staleness_aware' parameter applies only when 'synchronization' is 'stale' or 'async' (it scales "
        "updates by their delay; 'sync' updates have none): set 'synchronization' or leave 'staleness_aware' "
        "at its default (True). Got staleness_aware={staleness_aware!r} with synchronization='sync' instead."),
    Requires(
        "aggregation_shards", "state_transport", ("sql", "auto"),
        "The 'aggregation_shards' parameter applies only when 'state_transport' is 'sql' or 'auto' (the sql "
        "round's sharded aggregations; {state_transport!r} sums on the driver): set 'state_transport' to "
        "'sql' or leave 'aggregation_shards' at None. Got aggregation_shards={aggregation_shards!r} with "
        "state_transport={state_transport!r} instead."),
    Requires(
        "aggregation", "state_transport", ("sql", "auto"),
        "The 'aggregation' parameter applies only when 'state_transport' is 'sql' or 'auto' (how the sql "
        "round sums; {state_transport!r} has its own): set 'state_transport' to 'sql' or leave "
        "'aggregation' at 'auto'. Got aggregation={aggregation!r} with state_transport={state_transport!r} "
        "instead."),
    Requires(
        "error_feedback", "update_compression", UPDATE_COMPRESSIONS,
        "The 'error_feedback' parameter applies only with 'update_compression' (it keeps what the codec drops): "
        "set 'update_compression' or leave 'error_feedback' at None. Got error_feedback={error_feedback!r} "
        "with update_compression=None instead."),
    Joint(
        "update_compression",
        lambda v: v["synchronization"] == "async" and any(segment_feedback(v["update_compression"],
                                                                           v["error_feedback"])),
        "Error feedback needs synchronization='sync' or 'stale' (a worker's residual goes to its chunk a fixed "
        "number of rounds later; 'async' chunks have no such predecessor): pass error_feedback=False, "
        "update_compression='bf16' (no feedback by default) or synchronization='stale'. Got "
        "update_compression={update_compression!r} with synchronization='async' instead."),
    Joint(
        "update_compression", lambda v: v["error_feedback"] is False,
        "The 'update_compression' parameter 'threshold' needs error feedback: each worker's threshold adapts from "
        "round to round beside its residual, and what it does not send is sent later from there. Leave "
        "error_feedback at None (or True), or pick another codec. Got update_compression='threshold' with "
        "error_feedback=False instead.", when=("threshold",)),
    Requires(
        "optimizer_state", "synchronization", ("sync",), when=("local",),
        message="The 'optimizer_state' parameter 'local' needs synchronization='sync' (each worker's state "
                "continues from its own previous round; stale and asynchronous chunks have no fixed previous "
                "round). Got optimizer_state='local' with synchronization={synchronization!r} instead."),
    Requires(
        "overlap_rounds", "synchronization", ("sync",),
        "The 'overlap_rounds' parameter needs synchronization='sync': its rounds already run ahead by one "
        "round of averages, each worker standing its own delta in for its share of the average it lacks; "
        "stale and asynchronous chunks have no round to stand in for. Got overlap_rounds=True with "
        "synchronization={synchronization!r} instead."),
    Requires(
        "overlap_rounds", "optimizer_state", ("local", "reset"),
        "The 'overlap_rounds' parameter needs optimizer_state='local' or 'reset': an averaged optimizer state "
        "would reach the workers one round late like the weights, with no own term defined for it (not built). "
        "Got overlap_rounds=True with optimizer_state={optimizer_state!r} instead."),
    Joint(
        "overlap_rounds", lambda v: type(as_update_rule(v["update_rule"])) is not PlainAveraging,
        lambda v: "The 'overlap_rounds' parameter needs update_rule='average': the outer rules' one-round-late "
                  "step with a worker's own term is not built yet. Got overlap_rounds=True with "
                  f"update_rule={v['update_rule']!r} instead."),
    Joint(
        "overlap_rounds", lambda v: v["sync_fragments"] > 1,
        lambda v: "The 'overlap_rounds' parameter with sync_fragments > 1 is not built yet (fragments are "
                  "synchronised in turn from weights the workers keep; their overlap is another protocol): "
                  f"pass one of them. Got overlap_rounds=True with sync_fragments={v['sync_fragments']!r} "
                  "instead."),
    Joint(
        "standing_rounds", lambda v: not v["overlap_rounds"],
        "The 'standing_rounds' parameter 'socket' needs overlap_rounds=True: a classic session's rounds share a "
        "standing job (the one that talks through the driver's socket) only under overlap_rounds. Got "
        "standing_rounds='socket' with overlap_rounds=False instead.", when=("socket",)),
    Requires(
        "sync_fragments", "synchronization", ("sync",),
        "The 'sync_fragments' parameter needs synchronization='sync' (round r synchronises fragment r mod F "
        "from every worker; stale and asynchronous chunks apply one worker at a time, with no such turn). Got "
        "sync_fragments={sync_fragments!r} with synchronization={synchronization!r} instead."),
    Joint(
        "elastic_timeout_s", lambda v: v["min_workers"] is None and v["max_workers"] is None,
        "The 'elastic_timeout_s' parameter applies only to elastic rounds (how long they wait for "
        "'min_workers' task slots): set 'min_workers' or 'max_workers', or leave 'elastic_timeout_s' at its "
        "default. Got elastic_timeout_s={elastic_timeout_s!r} without them instead."),
    Joint(
        "max_workers", lambda v: v["num_workers"] is not None and v["max_workers"] != v["num_workers"],
        "The 'num_workers' and 'max_workers' parameters are both the most workers of an elastic round; give "
        "one of them. Got num_workers={num_workers!r} with max_workers={max_workers!r} instead."),
    Joint(
        "min_workers", lambda v: _most(v) is not None and v["min_workers"] > _most(v),
        lambda v: f"The 'min_workers' parameter must be at most '{'max_workers' if v['max_workers'] else 'num_workers'}' "
                  f"({_most(v)}): a round cannot need more workers than it may have. "
                  f"Got min_workers={v['min_workers']!r} instead."),
)
