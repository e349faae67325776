"""The one table of trainer options, :data:`OPTIONS`: every entry point derives its options from it.

Each :class:`~.rows.Option` row declares an option once: its snake_case name, default, type, documentation, check,
how the jobs' command line spells it (:class:`~.rows.Flag`) and which Spark ML Param carries it
(:class:`~.rows.SparkParam`); :data:`JOINTS` (:mod:`.joints`) declares the checks that join several of them. The
trainer's rows are here, ``fit``'s and MLflow's in :mod:`.fit_options`; the machinery is apart: the row types in
:mod:`.rows`, the constraints and parsers in :mod:`.constraints`, the code generation in :mod:`.codegen`, the renaming
of messages in :mod:`.messages`. From the rows derive:

- :class:`~sparkdl_avg.driver.config.trainer_config.TrainerConfig` (the :data:`TRAINER` rows: its fields, defaults,
  docstring and the checks ``__post_init__`` runs);
- ``ParameterAveragingTrainer.__init__``'s signature, its unknown-keyword error and its docstring's Args
  (:func:`~.codegen.constructor`, :func:`~.codegen.document`);
- the jobs' flags (``sparkdl_avg.driver.api.cli.add_trainer_args``, ``add_data_args``) and ``cli.trainer_options``;
- ``KerasAveragingEstimator``'s Params, keyword arguments, defaults, setters, getters, ``_trainer_options`` and the
  snake_case → camelCase map of its error messages (``sparkdl_avg.driver.api.ml``);
- :class:`~sparkdl_avg.driver.observe.tracking.MlflowLogger`'s signature and Args (the :data:`TRACKING` rows but the
  ``mlflow`` switch), the jobs' ``--mlflow-*`` flags and the estimator's ``mlflow*`` Params, made into one logger by
  :func:`sparkdl_avg.driver.observe.tracking.from_options`;
- the site's options page (docs/hooks/options_page.py, checked by tests/docs/test_site.py) and
  tests/config/test_options.py (every row reaches all three entry points with the same default and the same error).

Where an entry point gives an option another default or form, the row says so: the CLI and the estimator name the
update rule (``update_rule="average"``, or a spec) and give its numbers flat (the :data:`RULE` rows ``block_momentum``
and ``block_lr``, whose help derives from the rules' declared parameters, combined by :func:`from_flat`); the CLI
prints one line per epoch (``verbose=2``), the estimator is silent (``verbose=0``). Values that name classes are read
from their registries (the rules', :data:`TRANSPORTS`, :data:`AGGREGATIONS`).

Every row's ``check`` is a :class:`~.constraints.Constraint`, which renders the one message style
(:func:`~.constraints.must_be`). The trainer's rows are checked by ``TrainerConfig`` (with the checks across options,
:data:`JOINTS`), the :data:`FIT` rows by :func:`sparkdl_avg.driver.config.trainer_config.check_fit_args`, which ``fit``
and, before Spark starts, the jobs (``sparkdl_avg.driver.api.cli.check_fit_flags``) call. Whatever the check, the CLI's
message names the flag (``--batch-size``, :func:`~.messages.flag_names`) and the estimator's the Param (``batchSize``)
where the trainer's names the option. Besides its row, an option's name appears only where it is used, in messages and
in other callables' own options such as ``evaluate``'s ``batch_size``
(``grep -rn "batch_size\\|batchSize\\|batch-size" sparkdl_avg/``).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

from ...shared.registry import Registry
from ...shared.wire.delta_sums import COMPRESSIONS
from ..algorithms.rules import as_update_rule, flat_option, names_help
from ..algorithms.schedules import as_schedule
from .constraints import (  # noqa: F401 (API: the row types and constraints, importable from the table)
    Bool, BoolOrPath, ClassWeights, Constraint, CrossCheck, Function, Ints, Joint, OneOf, Parsed, PathText, Requires,
    RoundsOrEpoch, Seconds, Text, check_joints, import_function, must_be, on_off, parse_class_weight,
    parse_optional_rate, parse_rate, require, rounds_or_epoch)
from .fit_options import FIT_OPTIONS, TRACKING_OPTIONS
from .joints import JOINTS  # noqa: F401 (API: the checks across the rows, declared beside them)
from .rows import FIT, RULE, SAME, TRACKING, TRAINER, Flag, Option, SparkParam  # noqa: F401 (API)

OPTIMIZER_STATE_POLICIES = ("average", "reset", "local")
NONFINITE_POLICIES = ("raise", "skip")
#: The state transports and the Spark SQL round's aggregation paths by value, registered by the transport modules.
TRANSPORTS = Registry("state_transport", "state transport", also=("auto",))
AGGREGATIONS = Registry("aggregation", "aggregation path", also=("auto",))
STANDING_ROUNDS = ("auto", "off", "socket")
#: The most ``aggregation_shards`` a fit takes. Each slice is a reducer task of every round, so thousands of
#: slices make rounds far slower and a million stall the fit (docs/benchmarks/aggregation.md).
MAX_AGGREGATION_SHARDS = 1024
SYNCHRONIZATIONS = ("sync", "stale", "async")
UPDATE_COMPRESSIONS = COMPRESSIONS  # the executors' codecs (sparkdl_avg.shared.wire.delta_sums)


OPTIONS: Tuple[Option, ...] = (
    Option(
        "num_workers", None, "Optional[int]",
        help="replicas per round, one Spark task each",
        unset="Spark's defaultParallelism",
        doc="Replicas trained in parallel per round, one Spark task each. Default ``None``: Spark's "
            "``defaultParallelism``, resolved when the trainer first needs it (under Spark Connect from the master URL or "
            "a one-off small job). More than the task slots: ``fit`` warns that only that many run at once, "
            "so the rounds take proportionally longer.",
        check=Ints(1, allow_none=True),
        cli=Flag(type=int),
        param=SparkParam("numWorkers", "toInt"),
    ),
    Option(
        "batch_size", 32, "int",
        help="examples per minibatch, per worker",
        doc="Examples per minibatch, per worker. Default 32.",
        check=Ints(1),
        cli=Flag(type=int),
        param=SparkParam("batchSize", "toInt"),
    ),
    Option(
        "averaging_frequency", 8, "Any",
        help="minibatches each worker trains between averagings",
        doc="Minibatches each worker trains between two averagings (DL4J's ``averagingFrequency``; "
            "\"k\"). Default 8. Also a schedule from :mod:`sparkdl_avg.driver.algorithms.schedules` (``PostLocalSGD``, "
            "``AdaComm``) or a callable ``(epoch, round, logs) -> k``, asked before every round.",
        check=Parsed(as_schedule, "an int in the range [1, inf) or a schedule"),
        cli=Flag(type=int),
        param=SparkParam("averagingFrequency", "toInt"),
    ),
    Option(
        "aggregation_depth", 1, "int",
        help="depth of the treeAggregate",
        doc="Depth of the ``treeAggregate`` that sums the rounds' results with ``state_transport=\"spark\"`` "
            "and evaluation's metric sums with ``\"spark\"`` and ``\"files\"`` (the ``\"sql\"`` round uses "
            "``aggregation``). Default 1: the driver merges every worker's result. Deeper levels are shuffles "
            "of pickled partials between Python workers and measured slower (docs/benchmarks.md, \"Aggregation "
            "paths\"); go deeper only where your cluster's driver merge is measured to be the bottleneck "
            "(docs/benchmarks/scaling.md, \"What it implies\").",
        check=Ints(1),
        cli=Flag(type=int),
        param=SparkParam("aggregationDepth", "toInt"),
    ),
    Option(
        "optimizer_state", "average", "str",
        help="'average' (average the optimizer variables), 'reset' (fresh each round) or 'local' (each worker "
             "keeps its own, as DiLoCo does; only the weights travel)",
        doc="``\"average\"`` (default) averages every optimizer variable (Adam moments, momentum) "
            "like DL4J's ``saveUpdater``; ``\"reset\"`` starts every round from the optimizer's "
            "initial state; ``\"local\"`` lets each worker keep its own optimizer variables from round to "
            "round, never sent (DiLoCo's inner optimizer state), so a round moves the weights alone: with Adam "
            "a third of ``\"average\"``'s bytes. Classic sessions keep each worker's state in a file on its host "
            "and place its next task there (a lost host's workers restart from the driver's optimizer state, "
            "counted in ``local_states_restarted``); Spark Connect keeps them under the staging directory "
            "(:mod:`sparkdl_avg.shared.wire.local_state`). The driver's optimizer then keeps its state from before the fit (a "
            "saved model holds it) but for the iteration counter; ``synchronization=\"sync\"`` only. Either way "
            "the optimizer's iteration counter follows the global step (minibatches per worker so far), so "
            "learning-rate schedules see the same step as in single-machine training.",
        check=OneOf(OPTIMIZER_STATE_POLICIES),
        cli=Flag(),
        param=SparkParam("optimizerState", "toString"),
    ),
    Option(
        "sync_fragments", 1, "int",
        help="synchronise the trainable variables in this many fragments, one per round in turn (Streaming DiLoCo)",
        doc="Fragments ``F`` of the trainable variables (contiguous groups in ``model.trainable_variables`` "
            "order, balanced by element count, a variable never split), synchronised one per round in turn "
            "(Streaming DiLoCo, Douillard et al. 2025): round ``r`` averages fragment ``r mod F`` (and the "
            "non-trainable variables), so a round's sums are about ``1/F`` of the model's. Each worker keeps "
            "its own weights between rounds, as ``optimizer_state=\"local\"`` keeps its optimizer variables, "
            "and adopts a fragment's new global values at the start of the round after its synchronisation "
            "(docs/guides/rounds.md, \"Fragments\"). Default 1: every round synchronises every variable. "
            "``synchronization=\"sync\"`` only; ``F`` at most the model's trainable variables.",
        check=Ints(1),
        cli=Flag(type=int),
        param=SparkParam("syncFragments", "toInt"),
    ),
    Option(
        "update_rule", None, "Any",
        help=f"how the average becomes the next weights: {names_help()}",
        doc="How the replicas' average becomes the next global weights (:mod:`sparkdl_avg.driver.algorithms.rules`). "
            "``None`` or ``\"average\"``: plain averaging; ``\"bmuf\"`` / ``\"bmuf_nesterov\"``: "
            "block momentum with ``η = 1 − 1/num_workers``, ``ζ = 1``; ``\"slowmo\"``: SlowMo with "
            "``β = 0.5``, ``α = 1``; ``\"diloco\"``: DiLoCo's outer Nesterov SGD with ``lr = 0.7``, "
            "``μ = 0.9`` (0.5 with a sparse ``update_compression``: ``\"topk\"``, ``\"threshold\"``); or a "
            "``BlockMomentum(...)`` / ``SlowMo(...)`` / ``DiLoCo(...)`` with your "
            "parameters, an ``OuterOptimizer(keras_optimizer)`` (any Keras optimizer on the outer gradient) "
            "or your own :class:`~sparkdl_avg.UpdateRule`. The rule's state (block momentum ``Δ``) carries "
            "over to the next ``fit`` of this trainer. The CLI and the estimator take the name or a spec "
            "(``\"slowmo:slow_momentum=0.7\"``, ``\"outer:sgd:lr=0.7,momentum=0.9,nesterov\"``), with "
            "``block_momentum`` and ``block_lr``.",
        check=Parsed(as_update_rule, "an update rule"),
        cli=Flag(default="average"),
        param=SparkParam("updateRule", "toString", default="average"),
    ),
    Option(
        "block_momentum", None, "Optional[float]", scope=RULE,
        **flat_option("block_momentum", "the rule's momentum"),  # help, unset, aliases: from the rules' params
        cli=Flag(type=float),
        param=SparkParam("blockMomentum", "toFloat"),
    ),
    Option(
        "block_lr", None, "Optional[float]", scope=RULE,
        **flat_option("block_lr", "the rule's learning rate"),
        cli=Flag(type=float),
        param=SparkParam("blockLearningRate", "toFloat"),
    ),
    Option(
        "seed", None, "Optional[int]",
        help="seed of the data order",
        unset="random",
        doc="Seed of the data order; ``None`` draws one.",
        check=Ints(0, allow_none=True),
        cli=Flag(type=int, help="seed of the data order (and of --model-builder, --validation-split)"),
        param=SparkParam("seed", "toInt", shared=True, unset="the stage's default seed (Spark's hash of the class name)"),
    ),
    Option(
        "staging_dir", None, "Optional[str]",
        help="where the data is staged once per fit (a local path or pyarrow.fs URI); on a multi-host "
             "cluster a filesystem every executor reads (hdfs://..., s3://...)",
        unset="the system temp dir",
        doc="Where the data is staged once per fit (a local path or a ``pyarrow.fs`` URI every "
            "executor can read: HDFS, S3, NFS on a multi-host cluster). Default: the system temp dir. "
            "On a master other than ``local[N]``/``local-cluster`` a local path is checked once with a "
            "small job (:func:`sparkdl_avg.driver.data.staging.check_shared_root`): executors that cannot see it (hosts "
            "with their own ``/tmp``) make the fit fail at once with a ``ConfigurationError`` naming "
            "``staging_dir``, before anything is staged. "
            "The trainer writes into a new subdirectory and deletes it on :meth:`close` or when the "
            "trainer is garbage-collected.",
        check=PathText(),
        cli=Flag(metavar="PATH_OR_URI"),
        param=SparkParam("stagingDir", "toString"),
    ),
    Option(
        "on_nonfinite", "raise", "str",
        help="a replica with NaN/Inf loss or weights: 'raise' (stop, keep the last good weights) or "
             "'skip' (leave it out of that round's average)",
        doc="``\"raise\"`` (default): a replica whose loss or weights become NaN/Inf stops ``fit`` "
            "with a ``WorkerError`` naming the epoch, round and worker; the model keeps the last good "
            "weights. ``\"skip\"``: such replicas are left out of that round's average, with a "
            "warning (all of them: raise).",
        check=OneOf(NONFINITE_POLICIES),
        cli=Flag(),
        param=SparkParam("onNonfinite", "toString"),
    ),
    Option(
        "check_data", True, "bool",
        help="check while staging that features and labels are finite and labels fit the loss",
        doc="Check while staging that features and labels are finite and that labels fit the loss "
            "(class indices in ``[0, classes)`` for a sparse categorical cross-entropy, ``[0, 1]`` "
            "for a binary one); a ``DataError`` names the column. Default True.",
        check=Bool(),
        cli=Flag("--no-check-data", action="store_false",
                 help="skip the NaN/Inf and label-range checks made while staging"),
        param=SparkParam("checkData", "toBoolean"),
    ),
    Option(
        "state_transport", "auto", "str",
        help="how each round's weights reach workers and their sums the driver: 'sql' (a DataFrame job, "
             "state as a staging file, sums as Arrow rows; the only one under Spark Connect), 'spark' "
             "(broadcast + treeAggregate), 'files' (files under the staging dir), 'auto' (files when all "
             "executors run on the driver's host, else spark while the driver's link is cheaper than sharding, "
             "sql above)",
        doc="How a round's state moves between driver and workers (:mod:`sparkdl_avg.driver.transport`). "
            "``\"sql\"``: the round is a DataFrame job (``spark.range(N).mapInArrow``), the state a file under "
            "the staging directory, the workers' sums raw bytes in Arrow rows, summed as ``aggregation`` says; "
            "the only one under Spark Connect. ``\"spark\"``: broadcast out, ``treeAggregate`` back (classic "
            "sessions). ``\"files\"``: both directions as files under the staging directory, summed by the "
            "driver (classic sessions whose driver and executors share a fast filesystem). ``\"auto\"`` "
            "(default): files when every executor runs on the driver's host (``local[N]``, ``local-cluster``) "
            "and the staging directory is local; on hosts of their own Spark's tree while bringing every "
            "worker's sums through the driver's link (``network_rate``) costs less than a sharded round, else "
            "sql; always sql under Connect (the whole rule: :func:`sparkdl_avg.driver.transport.policy.choose`). On hosts of "
            "their own without ``network_rate``, ``\"auto\"`` then measures the link from the rounds' own records "
            "and switches between the two paths between rounds when the other is clearly cheaper (at most once per "
            "10 rounds, said in one INFO line; each round's ``transport`` is in ``trainer.stats``: "
            ":mod:`sparkdl_avg.driver.transport.link_rate`, docs/benchmarks/network_auto.md). Name one only "
            "to compare them, or ``\"files\"`` with a fast shared filesystem. Measurements: docs/benchmarks.md, "
            "\"On a shaped network\" and \"Aggregation paths\".",
        check=OneOf(TRANSPORTS.choices),
        cli=Flag(choices=TRANSPORTS.choices),
        param=SparkParam("stateTransport", "toString"),
    ),
    Option(
        "aggregation", "auto", "str",
        help="how the sql round sums the workers' sums: 'driver' (all to the driver), 'files' (the driver reads "
             "the workers' files), 'shuffle' (S reducers through Spark's shuffle), 'storage' (S reducers reading "
             "the workers' files), 'auto'",
        doc="How ``state_transport=\"sql\"`` sums the workers' sums. ``\"driver\"``: every worker's "
            "sums reach the driver (``N`` models' bytes). ``\"files\"``: workers write their sums under the "
            "staging directory and the driver reads them (``N`` models' bytes, through the page cache on one "
            "host). ``\"shuffle\"``: sums cut into ``aggregation_shards`` slices, slice ``j`` of every worker "
            "summed by reducer task ``j`` after a shuffle. ``\"storage\"``: workers write their sums under the "
            "staging directory and ``aggregation_shards`` reducer tasks sum them slice by slice (ranged reads). "
            "Sharded, the driver receives one model's bytes. ``\"auto\"`` (default): files under Spark Connect "
            "when its master and the staging directory are local (client and executors share its files); on hosts of their own the driver while "
            "that costs less than sharding (``network_rate``), else shuffle; on one host the driver up to "
            ":data:`sparkdl_avg.driver.transport.policy.DRIVER_SUM_BYTES` of sums in all, else storage (the whole rule: "
            ":func:`sparkdl_avg.driver.transport.policy.plan_aggregation`; measurements: docs/benchmarks.md, \"Aggregation "
            "paths\" and \"On a shaped network\"). All give bitwise the same sums, so name one only to compare "
            "them. Anything but ``\"auto\"`` is refused with ``state_transport=\"spark\"`` or ``\"files\"``, "
            "which sum on the driver.",
        check=OneOf(AGGREGATIONS.choices),
        cli=Flag(choices=AGGREGATIONS.choices),
        param=SparkParam("aggregation", "toString"),
    ),
    Option(
        "aggregation_shards", None, "Optional[int]",
        help="slices S the sql round's sharded aggregation cuts the sums into",
        unset="one per worker, each at least 256 kB",
        doc="Slices (reducer tasks) of the sharded aggregations (``aggregation=\"shuffle\"`` or "
            "``\"storage\"``; refused with ``\"driver\"`` or ``\"files\"``). At most "
            f"{MAX_AGGREGATION_SHARDS} (:data:`~sparkdl_avg.driver.config.options.MAX_AGGREGATION_SHARDS`) and at most "
            "the model's parameters. Default ``None``: one per worker, each slice at least 256 kB.",
        check=Ints(1, allow_none=True, high=MAX_AGGREGATION_SHARDS),
        cli=Flag(type=int),
        param=SparkParam("aggregationShards", "toInt"),
    ),
    Option(
        "slow_warning", True, "bool",
        help="warn early in a fit when one process would have trained an epoch faster",
        doc="Early in a fit, warn (once, with the numbers) when an epoch takes longer than one "
            "process would at one worker's measured speed per minibatch: the rounds' fixed cost outweighs "
            "what the workers add (:func:`sparkdl_avg.driver.api.advisor.slower_than_one_process`, the cost model of "
            ":func:`sparkdl_avg.advise`). It reads rounds where no worker built its replica or traced its "
            "step function, at the end of the first epoch that brings 3 of them (or of the last). Also, once "
            "per application, say how long the first fit waited for new executor workers to import TensorFlow "
            "and what removes that (a session without RECOMMENDED_CONF). Default True.",
        check=Bool(),
        cli=Flag("--no-slow-warning", action="store_false",
                 help="do not warn when the fit is slower than one process would be"),
        param=SparkParam("slowWarning", "toBoolean"),
    ),
    Option(
        "synchronization", "sync", "str",
        help="'sync' (every round waits for every worker), 'stale' (a worker may run up to 'staleness' rounds "
             "ahead of the slowest) or 'async' (no bound)",
        doc="How workers wait for each other (:mod:`sparkdl_avg.driver.fit.stale_async`). ``\"sync\"`` (default): rounds, each "
            "waiting for its slowest worker. ``\"stale\"``: stale-synchronous parallel (Ho et al. 2013); each "
            "worker trains its own chunks of ``averaging_frequency`` minibatches as small Spark jobs and the "
            "driver applies each worker's update as it arrives, so a worker gets the current weights and its "
            "next chunk at once; a chunk of round ``r`` starts only when every round before ``r - staleness`` "
            "is applied (``staleness=0`` is ``\"sync\"``). ``\"async\"``: no bound. Epochs still end "
            "together (validation, callbacks and checkpoints see every chunk of the epoch applied); "
            "``checkpoint_every`` must be ``\"epoch\"``.",
        check=OneOf(SYNCHRONIZATIONS),
        cli=Flag(choices=SYNCHRONIZATIONS),
        param=SparkParam("synchronization", "toString"),
    ),
    Option(
        "staleness", 2, "int",
        help="with synchronization='stale': how many rounds a worker may run ahead of the slowest",
        doc="With ``synchronization=\"stale\"``, the bound ``s``: rounds a worker's chunk may run ahead of "
            "the oldest chunk not yet applied, which is also the most rounds the weights a chunk starts from "
            "can lack; another value than the default is refused with ``\"sync\"``. Default 2 (measured in "
            "docs/benchmarks.md, \"Stragglers\").",
        check=Ints(0),
        cli=Flag(type=int),
        param=SparkParam("staleness", "toInt"),
    ),
    Option(
        "staleness_aware", True, "bool",
        help="scale each asynchronous update by 1/delay (Zhang et al. 2016)",
        doc="With ``synchronization=\"stale\"`` or ``\"async\"``, scale each worker's update by "
            "``1/max(1, τ)`` where ``τ`` is the updates applied since the worker read the weights, in "
            "rounds (``num_workers`` updates; Zhang, Gupta, Lian & Liu, IJCAI 2016). Default True.",
        check=Bool(),
        cli=Flag("--no-staleness-aware", action="store_false",
                 help="apply asynchronous updates unscaled, whatever their delay"),
        param=SparkParam("stalenessAware", "toBoolean"),
    ),
    Option(
        "reproducible", False, "bool",
        help="with synchronization='stale': apply updates in chunk order, each chunk reading the weights after "
             "exactly the rounds before its own minus 'staleness', so runs repeat bitwise",
        doc="With ``synchronization=\"stale\"``: apply the workers' updates in chunk order and have a chunk of "
            "round ``r`` read the weights after exactly the rounds before ``r - staleness``, so the run does not "
            "depend on the workers' timing and repeats bitwise. The workers still run ahead; each chunk reads "
            "weights ``staleness`` rounds old even when newer ones exist. Default False (updates applied as they "
            "arrive, each chunk reading the newest weights).",
        check=Bool(),
        cli=Flag(action="store_true"),
        param=SparkParam("reproducible", "toBoolean"),
    ),
    Option(
        "overlap_rounds", False, "bool",
        help="eager updates: each worker starts its next round from the global weights plus its own share of "
             "the round it just trained, and the driver applies each round's average one round late",
        doc="Overlapped rounds' update (eager updates, Kale et al. 2025; :mod:`sparkdl_avg.driver.fit.overlap`): "
            "the driver applies each round's averaged delta one round late, and worker ``i`` starts round "
            "``t + 1`` from the global weights plus ``δ_i/N``, its own delta of round ``t`` standing in for its "
            "share of that round's average, so each delta is applied once and ``N = 1`` is sequential training "
            "(docs/guides/rounds.md, \"Overlapped rounds\"). A round's start then needs nothing from the "
            "round before it but the worker's own delta. Where the executors share the driver's host and the "
            "staging directory is local (``local[N]``, a local Spark Connect server), ``state_transport=\"auto\"`` "
            "then runs the rounds in one standing job and announces each round while the one before it trains, "
            "so the workers go straight on to it while the driver reads, sums and applies theirs (the same "
            "arithmetic, bitwise; ``RoundRecord.announced_ahead``; ``standing_rounds`` turns the job off). "
            "Needs ``synchronization=\"sync\"``, ``optimizer_state=\"local\"`` or ``\"reset\"`` and "
            "``update_rule=\"average\"``. The driver's weights after a round lack the newest round's average "
            "(validation and checkpoints see them so; a checkpoint carries the average and each worker's delta in "
            "flight); the fit's end applies it. Default False.",
        check=Bool(),
        cli=Flag(action="store_true"),
        param=SparkParam("overlapRounds", "toBoolean"),
    ),
    Option(
        "network_rate", None, "Any",
        help="the driver's network link rate (e.g. '1gbit', '10gbit'), which state_transport='auto' and "
             "aggregation='auto' weigh on hosts of their own",
        unset="1 Gbit/s",
        doc="The rate of the driver's network link on a cluster of several hosts, which ``\"auto\"`` "
            "(``state_transport``, ``aggregation``) weighs: a string such as ``\"1gbit\"``, ``\"10gbit\"`` or "
            "``\"800mbit\"``, or bytes per second. Default ``None``: 1 Gbit/s. Every worker's sums go straight "
            "to the driver while that costs less than sharding them "
            "(:func:`sparkdl_avg.driver.transport.policy.driver_bound_pays`), else they are sharded through the shuffle and the "
            "driver's link carries about one model's bytes each way per round. Give your link's rate when it is "
            "not 1 Gbit/s: without it, ``state_transport=\"auto\"`` starts as if it were 1 Gbit/s and re-chooses "
            "from the rate the rounds measure; a rate given here wins over that measurement (the choice stays "
            "fixed). Not used when every executor runs on the driver's host (``local[N]``, "
            "``local-cluster``). Measurements: docs/benchmarks.md, \"On a shaped network\".",
        check=Parsed(parse_optional_rate, "a link rate"),
        cli=Flag(metavar="RATE"),
        param=SparkParam("networkRate", "toString"),
    ),
    Option(
        "update_compression", None, "Optional[str]",
        help="send each worker's round delta compressed: 'bf16' (2 bytes a value), 'int8' or 'int4' (the weights "
             "at about 1 byte or half a byte, with error feedback), 'topk' (the largest 2 in 100 of each 4,096 weights, "
             "about 0.04 bytes a value, with error feedback), 'threshold' (Deeplearning4j's: the weights past an "
             "adaptive threshold, as +-threshold, 1e-4 to 2e-2 of them, with error feedback)",
        unset="float32 sums, uncompressed",
        doc="Send each worker's *delta* from the round's starting state compressed instead of its float32 "
            "sums (:mod:`sparkdl_avg.shared.wire.delta_sums`); the sums are still added in float32, so only the wire "
            "changes. ``\"bf16\"``: bfloat16, round to nearest even (0.5× the bytes). ``\"int8\"``: the weights "
            "in int8 with a float32 scale per 256 values and error feedback, the optimizer's variables in bf16 "
            "(int8 on Adam's second moments diverged in our measurements): 0.42× with Adam. ``\"int4\"`` (Streaming "
            "DiLoCo's 4-bit outer gradients): likewise with the weights in signed 4-bit values, two a byte, and a "
            "float32 scale per 128 values: 0.13× for the weights alone, 0.38× with Adam. ``\"topk\"`` "
            "(SparseLoCo's sparse outer gradients): of each 4,096 weights' deltas only the largest 2% travel, each "
            "as a 12-bit position and a 2-bit value, with a float32 scale per 4,096: 0.009× for the weights "
            "alone (with ``optimizer_state=\"local\"`` and ``update_rule=\"diloco\"``, what it is for; the "
            "optimizer's variables, if averaged, still travel in bf16); what is not sent stays in the worker's "
            "residual. ``\"threshold\"`` (Deeplearning4j's threshold encoding with its adaptive threshold): the "
            "weights' deltas whose magnitude reaches the worker's threshold travel as plus or minus the threshold "
            "(a 12-bit position and a sign bit each, or a 2-bit map of a chunk where that is smaller); each "
            "worker moves its threshold by steps of 0.966 to send 1e-4 to 2e-2 of its values, the workers start "
            "each epoch from their thresholds' mean, and the residual is clipped at 5 thresholds; needs error "
            "feedback. Works with every update rule, "
            "``synchronization=\"stale\"``, every ``state_transport`` and ``aggregation``, and Spark Connect. "
            "Default ``None``: float32 sums. Measured in docs/benchmarks.md, \"Compressed updates\".",
        check=OneOf((None,) + UPDATE_COMPRESSIONS),
        cli=Flag(choices=UPDATE_COMPRESSIONS),
        param=SparkParam("updateCompression", "toString"),
    ),
    Option(
        "error_feedback", None, "Optional[bool]",
        help="with update_compression: keep what the codec drops per worker and add it to its next delta",
        unset="for what travels in int8, int4, topk or threshold, not for bf16",
        doc="With ``update_compression``: each worker keeps what its codec dropped (its residual, in a file "
            "under the staging directory, so a retried task or a lost executor changes nothing) and adds it "
            "to its next round's delta, so nothing is lost over rounds (Seide et al. 2014; Karimireddy et al. "
            "2019). Default ``None``: for what travels in int8, int4, topk or threshold (those codecs' weights), "
            "not for bf16 "
            "(measured equal to float32 without it); ``True``: for everything compressed; ``False``: none. Not "
            "with ``synchronization=\"async\"``, whose chunks have no fixed predecessor.",
        check=Bool(allow_none=True),
        cli=Flag(type=on_off, metavar="on|off"),
        param=SparkParam("errorFeedback", "toBoolean"),
    ),
    Option(
        "preprocess", None, "Any",
        help="a function run on the executors that maps a minibatch of raw columns (a dict of numpy arrays) to the "
             "model's inputs and labels (decode images, tokenize, augment); in fit, evaluate and predict",
        unset="the columns feed the model as they are",
        doc="A function ``fn(batch, seeds=None, training=False)`` that maps a minibatch of raw DataFrame columns "
            "(a dict of numpy arrays: numbers, object arrays of ``bytes``/``str``, dicts for structs) to a dict "
            "holding the model's inputs and labels by name (``features_col``, ``label_col`` and "
            "``sample_weight_col`` then name its keys; a name it does not return is taken from the batch). It "
            "runs on the executors, per minibatch, in ``fit``, ``evaluate`` and ``predict``; ``seeds`` (one "
            "int64 per example from the fit's seed, the epoch and the example) makes random augmentation repeat "
            "bitwise; ``training`` is True only in ``fit``'s rounds. Only the columns it reads are staged, as "
            "they came (found by running it on a few rows on the driver first, which also checks its output "
            "against the model). Shipped by value when defined in ``__main__``; otherwise its module must be "
            "importable on the executors. Default ``None``. See docs/guides/data.md, \"Images, text and ids\".",
        check=Function(),
        cli=Flag(metavar="MODULE:FUNCTION", type=import_function, group="data",
                 help="a function that maps a minibatch of raw columns (a dict of numpy arrays) to the model's "
                      "inputs and labels, run on the executors (decode images, tokenize, augment); ship its module "
                      "with --py-files"),
    ),
    Option(
        "min_workers", None, "Optional[int]",
        help="elastic rounds: the fewest workers a round may run with; set it (or max_workers) to re-plan each "
             "round for the task slots Spark has live",
        unset="elastic rounds off: every round has num_workers workers",
        doc="Elastic rounds (docs/guides/failures.md, \"Elastic rounds\"): the fewest workers a round may run with. Setting it or "
            "``max_workers`` makes the rounds elastic: before each round the trainer reads the task slots Spark "
            "has live (:mod:`sparkdl_avg.driver.elastic.membership`) and plans ``min(max_workers, slots)`` workers, which "
            "split what the epoch has left, so a host that leaves costs one retried task and a host that joins "
            "trains from the next round. While fewer than ``min_workers`` slots are live the fit waits, at most "
            "``elastic_timeout_s``, then fails. Default ``None``: elastic rounds off, every round has "
            "``num_workers`` workers.",
        check=Ints(1, allow_none=True),
        cli=Flag(type=int),
        param=SparkParam("minWorkers", "toInt"),
    ),
    Option(
        "max_workers", None, "Optional[int]",
        help="elastic rounds: the most workers a round may run with",
        unset="num_workers when given, else every live task slot",
        doc="Elastic rounds: the most workers a round may run with (also what the update rule's defaults, "
            "e.g. BMUF's ``η = 1 − 1/N``, are resolved for). Default ``None``: ``num_workers`` when it is given, "
            "else as many as Spark has task slots (with ``min_workers`` set).",
        check=Ints(1, allow_none=True),
        cli=Flag(type=int),
        param=SparkParam("maxWorkers", "toInt"),
    ),
    Option(
        "elastic_timeout_s", 300.0, "float",
        help="elastic rounds: seconds a fit waits for min_workers task slots before it fails",
        doc="Elastic rounds: how long a fit waits, in seconds, for ``min_workers`` task slots to be live before "
            "it fails with a ``WorkerError`` that says how many there were. Default 300.",
        check=Seconds(),
        cli=Flag(type=float),
        param=SparkParam("elasticTimeoutS", "toFloat"),
    ),
    Option(
        "standing_rounds", "auto", "str",
        help="whether a fit's rounds may share one standing Spark job: 'auto' (where they can), 'off' (a Spark job "
             "per round) or 'socket' (overlap_rounds' standing job through the driver's socket even on its host)",
        doc="Whether consecutive rounds may run in one *standing* Spark job whose tasks hold their executor slots "
            "between rounds (:mod:`sparkdl_avg.driver.transport.standing`): the job is planned and its tasks start "
            "once, so a round costs what its files or messages cost. ``\"auto\"`` (default): where they can, "
            "under Spark Connect with a local server and staging directory (docs/guides/connect.md), and on a "
            "classic session under ``overlap_rounds`` (announcing each round while the one before it trains), "
            "through local files on the driver's host with a local staging directory, else through the driver's "
            "socket (docs/guides/rounds.md, \"Overlapped rounds\"). ``\"off\"``: every round a Spark job of its "
            "own, which frees the slots between rounds (a shared cluster where a job holding them is unwelcome); the "
            "same weights, bitwise, and ``state_transport=\"auto\"`` then chooses as for a synchronous fit. "
            "``\"socket\"``: ``overlap_rounds``' standing job talks through the driver's socket even where the "
            "executors share the driver's host (executors in containers there that do not share its filesystem); "
            "needs ``overlap_rounds=True`` and a classic session (Connect's standing job waits on files the client "
            "writes). The driver's socket is authenticated but not encrypted: on a session that encrypts Spark's "
            "traffic (``spark.network.crypto.enabled``, ``spark.ssl.enabled``) overlapped rounds that would use it "
            "are refused unless ``\"off\"``. Each refusal comes before any Spark job.",
        check=OneOf(STANDING_ROUNDS),
        cli=Flag(choices=STANDING_ROUNDS),
        param=SparkParam("standingRounds", "toString"),
    ),
) + FIT_OPTIONS + TRACKING_OPTIONS



_BY_NAME: Dict[str, Option] = {o.name: o for o in OPTIONS}
assert len(_BY_NAME) == len(OPTIONS), "an option is declared twice"
#: Each option's default by name.
DEFAULTS: Dict[str, Any] = {o.name: o.default for o in OPTIONS}
assert all(c.name in _BY_NAME and getattr(c, "other", c.name) in _BY_NAME for c in JOINTS), "a check joins no row"


def option(name: str) -> Option:
    """The row of ``name``."""
    return _BY_NAME[name]


def of(*scopes: str) -> Tuple[Option, ...]:
    """The rows of ``scopes``, in table order."""
    return tuple(o for o in OPTIONS if o.scope in scopes)


def check(name: str, value: Any) -> None:
    """Runs the check of ``name``'s row on ``value``."""
    row = _BY_NAME[name]
    if row.check is not None:
        row.check(name, value)


# ------------------------------------------------------------- derivations


def from_flat(values: Mapping[str, Any]) -> Dict[str, Any]:
    """The trainer's options from the CLI's or the estimator's flat values.

    ``values`` holds the :data:`TRAINER` and :data:`RULE` options by name; ``update_rule`` is a rule name or spec, made
    a rule with the :data:`RULE` options by :func:`~sparkdl_avg.driver.algorithms.rules.as_update_rule`.
    """
    out = {o.name: values[o.name] for o in of(TRAINER) if o.name in values}
    out["update_rule"] = as_update_rule(values["update_rule"], {o.name: values[o.name] for o in of(RULE)})
    return out
