"""The driver side of synchronous parameter averaging: ``ParameterAveragingTrainer``.

A round broadcasts the model's weights and optimizer variables, runs one
Spark job in which each of ``num_workers`` tasks trains its replica on its
next ``averaging_frequency`` minibatches, ``treeAggregate``s the
example-weighted sums and sets their average on the driver's model. The code
executors run lives in :mod:`sparkdl_avg.worker`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import sys
import tempfile
import time
import weakref
from functools import partial
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import checkpoint, exchange
from . import data as data_mod
from .aggregation import PartialResult, merge
from .config import TrainerConfig, check_checkpoint_args, check_int, validate_model
from .errors import WORKER_ERROR_MARKER, ConfigurationError, DataError, WorkerError
from .modelspec import (
    ModelSpec,
    architecture_signature,
    check_model_loads,
    current_learning_rate,
    get_state,
    input_shapes,
    inputs_dtype,
    iterations_index,
    set_state,
    trainable_mask,
)
from .plan import steps_per_epoch
from .progress import Progress
from .rules import UpdateRule
from .schedules import AveragingSchedule, FixedPeriod, next_period
from .staging import StagedDataset, join, remove_tree
from .stats import TrainingStats
from .worker import EvalTask, RoundTask, run_eval_partition, run_round_partition

logger = logging.getLogger("sparkdl_avg")


def _check_fit_args(epochs: Any, verbose: Any) -> int:
    check_int("epochs", epochs, 1)
    if verbose == "auto":
        return 1 if sys.stdout.isatty() else 2
    if verbose not in (0, 1, 2):
        raise ConfigurationError(
            f"The 'verbose' parameter must be 'auto', 0, 1 or 2. Got {verbose!r} instead."
        )
    return verbose


@contextlib.contextmanager
def spark_job_labels(sc, description: str, group: Optional[str] = None):
    """Labels the Spark jobs started inside the block (Spark UI), restoring the caller's labels."""
    keys = ("spark.job.description", "spark.jobGroup.id")
    saved = [sc.getLocalProperty(k) for k in keys]
    sc.setLocalProperty("spark.job.description", description)
    if group is not None:
        sc.setLocalProperty("spark.jobGroup.id", group)
    try:
        yield
    finally:
        for key, value in zip(keys, saved):
            sc.setLocalProperty(key, value)


@dataclasses.dataclass
class _FitContext:
    """What the rounds of one ``fit`` share."""

    sc: Any
    run: RoundTask
    epochs: int
    epoch_steps: int
    schedule: AveragingSchedule
    rule: UpdateRule
    callbacks: Any
    progress: Progress
    checkpoint_dir: Optional[str]
    checkpoint_every: Any
    run_settings: Dict[str, Any]
    rounds: int = 0


class ParameterAveragingTrainer:
    """Trains a compiled Keras model on Spark by synchronous parameter averaging.

    Args:
        model: A compiled ``keras.Model`` with one input and one output and a
            known input shape. It is trained in place: after ``fit`` it holds
            the averaged weights (also available as ``trainer.model``).
        num_workers: Replicas trained in parallel per round, one Spark task
            each. Default ``None``: Spark's ``defaultParallelism``.
        batch_size: Examples per minibatch, per worker. Default 32.
        averaging_frequency: Minibatches each worker trains between two
            averagings ("k"). Default 8. Also a schedule from
            :mod:`sparkdl_avg.schedules` (``PostLocalSGD``, ``AdaComm``) or a
            callable ``(epoch, round, logs) -> k``, asked before every round.
        aggregation_depth: ``treeAggregate`` depth. Default 2. Applies to
            the rounds' results on Spark's path (see ``state_transport``;
            through files the driver reads every worker's file itself and
            the tree has depth 1) and to evaluation's metric sums.
        optimizer_state: ``"average"`` (default) averages every optimizer
            variable (Adam moments, momentum) like DL4J's ``saveUpdater``;
            ``"reset"`` starts every round from the optimizer's initial state.
            Either way the optimizer's iteration counter follows the global
            step (minibatches per worker so far), so learning-rate schedules
            see the same step as in single-machine training.
        update_rule: How the replicas' average becomes the next global
            weights (:mod:`sparkdl_avg.rules`). ``None`` or ``"average"``:
            plain averaging; ``"bmuf"`` / ``"bmuf_nesterov"``: block
            momentum with ``η = 1 − 1/num_workers``, ``ζ = 1``; ``"slowmo"``:
            SlowMo with ``β = 0.5``, ``α = 1``; or a ``BlockMomentum(...)`` /
            ``SlowMo(...)`` with your parameters. The rule's state (block
            momentum ``Δ``) carries over to the next ``fit`` of this trainer.
        seed: Seed of the data order; ``None`` draws one.
        staging_dir: Where the data is staged once per fit (a local path or a
            ``pyarrow.fs`` URI every executor can read). Default: the system
            temp dir. The trainer writes into a new subdirectory and deletes
            it on :meth:`close` or when the trainer is garbage-collected.
        on_nonfinite: ``"raise"`` (default): a replica whose loss or weights
            become NaN/Inf stops ``fit`` with a ``WorkerError`` naming the
            epoch, round and worker; the model keeps the last good weights.
            ``"skip"``: such replicas are left out of that round's average,
            with a warning.
        check_data: Check while staging that features and labels are finite
            and that labels fit the loss (class indices in ``[0, classes)``
            for a sparse categorical cross-entropy, ``[0, 1]`` for a binary
            one); a ``DataError`` names the column. Default True.
        state_transport: How a round's state moves between driver and
            workers. ``"spark"``: the driver broadcasts weights and
            optimizer variables, workers return their sums as task results
            through ``treeAggregate``. ``"files"``: both directions as files
            under the staging directory (for clusters whose driver and
            executors share a fast filesystem). ``"auto"`` (default): files
            when every executor runs on the driver's host (``local[N]``,
            ``local-cluster``) and the staging directory is local, else
            Spark. At 1e6 parameters (Adam) files cut the round overhead on
            one host from ≈ 240 ms to ≈ 100 ms (docs/benchmarks.md).

    Raises:
        ConfigurationError: a parameter or the model is invalid.
    """

    def __init__(
        self,
        model,
        num_workers: Optional[int] = None,
        batch_size: int = 32,
        averaging_frequency: Any = 8,
        aggregation_depth: int = 2,
        optimizer_state: str = "average",
        update_rule: Any = None,
        seed: Optional[int] = None,
        staging_dir: Optional[str] = None,
        on_nonfinite: str = "raise",
        check_data: bool = True,
        state_transport: str = "auto",
    ) -> None:
        self.config = TrainerConfig(
            num_workers=num_workers,
            batch_size=batch_size,
            averaging_frequency=averaging_frequency,
            aggregation_depth=aggregation_depth,
            optimizer_state=optimizer_state,
            update_rule=update_rule,
            seed=seed,
            staging_dir=staging_dir,
            on_nonfinite=on_nonfinite,
            check_data=check_data,
            state_transport=state_transport,
        )
        validate_model(model)
        self.model = model
        self.stats = TrainingStats()
        self._seed = seed if seed is not None else random.SystemRandom().randrange(2**31)
        base = staging_dir or tempfile.gettempdir()
        self._staging_root = join(base, f"sparkdl_avg-{time.strftime('%Y%m%d-%H%M%S')}-{id(self):x}")
        self._staged: Dict[tuple, tuple] = {}
        self._fits = 0
        self.history = None  # the History of the latest fit
        self._last_fit_first_record: Optional[int] = None
        # The update rule's state (e.g. BMUF's Δ) and the rule it belongs to.
        self._rule_state: Optional[dict] = None
        self._rule_state_of: Optional[dict] = None
        self._finalizer = weakref.finalize(self, remove_tree, self._staging_root)

    # ------------------------------------------------------------------ data

    def _stage(self, data, features_col: str, label_col: str, what: str) -> StagedDataset:
        key = data_mod.data_key(data, features_col, label_col)
        if key is not None and key in self._staged:
            return self._staged[key][1]
        staged = data_mod.stage(
            data,
            root=self._staging_root,
            x_shapes=input_shapes(self.model),
            x_dtype=inputs_dtype(self.model),
            num_outputs=len(self.model.outputs),
            features_col=features_col,
            label_col=label_col,
            what=what,
            checks=data_mod.data_checks(self.model, self.config.check_data),
        )
        if key is not None:
            self._staged[key] = (data, staged)  # holding `data` keeps its id() unique
        return staged

    def _exchange_dir(self, sc) -> Optional[str]:
        """Where this fit's rounds exchange state through files (``state_transport``), or ``None``: through Spark."""
        mode = self.config.state_transport
        if mode == "spark":
            return None
        # By the URI's scheme: resolving an hdfs:// or s3:// root would connect to it.
        local_fs = "://" not in self._staging_root or self._staging_root.startswith("file://")
        one_host = sc.master.startswith("local")  # local[N] and local-cluster[...]
        if mode == "auto" and not (local_fs and one_host):
            return None
        if local_fs and not one_host:
            logger.warning(
                "state_transport='files' with the local staging directory %s while the master is %s: "
                "the driver and every executor must read each other's files there (e.g. one host, or NFS).",
                self._staging_root,
                sc.master,
            )
        return join(self._staging_root, f"exchange-{self._fits}")  # called after fit counted itself

    def close(self) -> None:
        """Deletes the staged data. The trainer can still be used; data is staged again."""
        self._staged.clear()
        remove_tree(self._staging_root)

    def __enter__(self) -> "ParameterAveragingTrainer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ fit

    def fit(
        self,
        data,
        epochs: int = 1,
        features_col: str = "features",
        label_col: str = "label",
        validation_data=None,
        callbacks=None,
        verbose="auto",
        shuffle: bool = True,
        checkpoint_dir: Optional[str] = None,
        checkpoint_every: Any = "epoch",
        resume: Any = False,
    ):
        """Trains the model by parameter averaging for ``epochs`` passes over ``data``.

        Args:
            data: Spark DataFrame, RDD of ``(x, y)`` pairs, or ``(x, y)`` numpy
                arrays. Staged once and reused when the same data is fitted
                again. For a model with several inputs (outputs), ``x``
                (``y``) is a list/tuple of arrays in the order of
                ``model.inputs`` (``model.outputs``).
            epochs: Passes over the data (with ``resume``: the total, counting
                the epochs before the checkpoint). Default 1.
            features_col: DataFrame column with the features, ``array<float>``,
                ``array<double>`` or a ``pyspark.ml`` Vector, reshaped to the
                model's input shape; a list of columns, one per model input,
                for a model with several inputs. Default ``"features"``.
            label_col: DataFrame column with the label (number, array or
                Vector); a list of columns, one per model output, for a
                model with several outputs. Default ``"label"``.
            validation_data: Same kinds as ``data`` (same columns), evaluated
                on the cluster at the end of each epoch; adds ``val_*`` logs.
            callbacks: Keras callbacks, run on the driver with the averaged
                model. Batch-level hooks are called once per round.
            verbose: ``"auto"`` (1 on a terminal, else 2), 0 (silent), 1
                (progress bar per epoch) or 2 (one line per epoch), as in
                ``keras.Model.fit``.
            shuffle: Visit the examples in a new seeded order every epoch.
                ``False`` keeps the data's order (partitions in order).
            checkpoint_dir: Directory (local path or ``pyarrow.fs`` URI) where
                checkpoints are written atomically (see
                :mod:`sparkdl_avg.checkpoint`); it must be new, empty, or hold
                this run's checkpoints (then pass ``resume=True``). Default
                ``None``: no checkpoints.
            checkpoint_every: ``"epoch"`` (default: after every epoch) or a
                number of rounds.
            resume: ``True`` continues from the latest checkpoint in
                ``checkpoint_dir`` if there is one (else starts afresh); a
                checkpoint path continues from that one. The model, data and
                settings must be those of the run that wrote it.

        Returns:
            A ``keras.callbacks.History``: ``history.history["loss"]`` has one
            value per epoch, the example-weighted mean over all workers'
            minibatches, and likewise every compiled metric. After a resume
            it also holds the epochs before the checkpoint.

        Raises:
            ConfigurationError, DataError: before any training round runs.
            WorkerError: a round's Spark job failed, or a replica's loss or
                weights became NaN/Inf (with ``on_nonfinite="raise"``).
        """
        import keras

        verbose = _check_fit_args(epochs, verbose)
        check_checkpoint_args(checkpoint_dir, checkpoint_every, resume)
        cfg = self.config
        sc = data_mod.spark_context_for(data)
        num_workers = cfg.num_workers or sc.defaultParallelism
        if "://" not in self._staging_root and not sc.master.startswith(("local", "local-cluster")):
            logger.warning(
                "Staging data under the local path %s while the master is %s: every executor "
                "must be able to read it. On a multi-host cluster pass staging_dir= a shared "
                "filesystem URI (hdfs://..., s3://...).",
                self._staging_root,
                sc.master,
            )
        checkpoint_uri = self._find_checkpoint(checkpoint_dir, resume)
        spec = ModelSpec.from_model(self.model)
        check_model_loads(spec)
        train = self._stage(data, features_col, label_col, "training")
        val = (
            self._stage(validation_data, features_col, label_col, "validation")
            if validation_data is not None
            else None
        )
        epoch_steps = steps_per_epoch(train.num_examples, num_workers, cfg.batch_size)
        if not epoch_steps:
            raise DataError(
                f"The training data has {train.num_examples} examples; one round needs at "
                f"least num_workers * batch_size = {num_workers} * {cfg.batch_size} = "
                f"{num_workers * cfg.batch_size}. Lower 'num_workers' or 'batch_size'."
            )
        schedule = cfg.schedule()
        rule = cfg.rule(num_workers)
        self._ensure_rule_state(rule)
        run_settings = {
            "model": architecture_signature(self.model),
            "num_examples": train.num_examples,
            "num_workers": num_workers,
            "batch_size": cfg.batch_size,
            "optimizer_state": cfg.optimizer_state,
            "update_rule": rule.describe(),
            "averaging_frequency": schedule.describe(),
            "shuffle": shuffle,
        }
        restored = self._restore(checkpoint_uri, run_settings, rule, schedule) if checkpoint_uri else None
        spec_bc = sc.broadcast(spec)
        callback_list = keras.callbacks.CallbackList(
            callbacks,
            add_history=True,
            add_progbar=False,
            model=self.model,
            verbose=verbose,
            epochs=epochs,
            # Batch hooks run once per round; rounds per epoch are known for a fixed k only.
            steps=-(-epoch_steps // schedule.k) if isinstance(schedule, FixedPeriod) else None,
        )
        first_record = len(self.stats)
        self._fits += 1
        labels = spark_job_labels(
            sc, f"sparkdl_avg fit {self._fits} of model {self.model.name!r}", group=f"sparkdl_avg-fit-{id(self):x}-{self._fits}"
        )
        ctx = _FitContext(
            sc=sc,
            # Everything a round's task needs but the epoch, round and state.
            run=RoundTask(
                spec=spec_bc,
                fingerprint=spec.fingerprint,
                state=None,
                dataset=train,
                epoch=0,
                round=0,
                steps_before=0,
                steps=0,
                num_workers=num_workers,
                batch_size=cfg.batch_size,
                seed=self._seed,
                shuffle=shuffle,
                average_optimizer=cfg.optimizer_state == "average",
                skip_nonfinite=cfg.on_nonfinite == "skip",
                exchange_dir=self._exchange_dir(sc),
            ),
            epochs=epochs,
            epoch_steps=epoch_steps,
            schedule=schedule,
            rule=rule,
            callbacks=callback_list,
            progress=Progress(verbose, epochs, epoch_steps),
            checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every,
            run_settings=run_settings,
        )
        self.model.stop_training = False
        with labels:
            try:
                callback_list.on_train_begin()
                logs: Dict[str, float] = {}
                start_epoch = 0
                if restored is not None:
                    start_epoch = restored.epoch
                    history = restored.meta["history"]
                    self.model.history.history = {k: list(v) for k, v in history.items()}
                    self.model.history.epoch = list(range(start_epoch))
                    logs = {k: v[-1] for k, v in history.items() if v}
                    if start_epoch >= epochs:
                        logger.warning(
                            "The checkpoint %s is at epoch %d; fit(epochs=%d) has nothing left to train.",
                            checkpoint_uri, start_epoch, epochs,
                        )
                for epoch in range(start_epoch, epochs):
                    callback_list.on_epoch_begin(epoch)
                    ctx.progress.epoch_begin(epoch)
                    begin = restored if restored is not None and epoch == restored.epoch else None
                    logs, rounds_done = self._train_epoch(ctx, epoch, logs, begin)
                    if val is not None:
                        val_logs = self._evaluate_staged(sc, val, spec_bc, spec.fingerprint, num_workers, cfg.batch_size)
                        logs = {**logs, **{f"val_{k}": v for k, v in val_logs.items()}}
                    ctx.progress.epoch_end(epoch, rounds_done, logs)
                    callback_list.on_epoch_end(epoch, logs)
                    last = epoch == epochs - 1 or self.model.stop_training
                    if checkpoint_dir is not None and (checkpoint_every == "epoch" or last):
                        self._save_checkpoint(ctx, epoch + 1, 0, 0, None)
                    if self.model.stop_training:
                        break
                callback_list.on_train_end(logs)
                ctx.progress.train_end(self.stats.summary(first_record))
            finally:
                spec_bc.unpersist()
                if ctx.run.exchange_dir is not None:
                    # Files of rounds cut short by an error, and of task attempts that outlived their round.
                    _remove_quietly(ctx.run.exchange_dir)
        self.history = self.model.history
        self._last_fit_first_record = first_record
        return self.model.history

    # ----------------------------------------------------------- checkpoints

    def _find_checkpoint(self, checkpoint_dir: Optional[str], resume: Any) -> Optional[str]:
        """The checkpoint to resume from, if any; refuses to write over another run's checkpoints."""
        if checkpoint_dir is None:
            return resume if isinstance(resume, str) else None
        found = checkpoint.latest(checkpoint_dir)
        if isinstance(resume, str):
            if found is not None and found.rstrip("/") != resume.rstrip("/"):
                raise ConfigurationError(
                    f"The 'checkpoint_dir' {checkpoint_dir!r} holds other checkpoints (latest: {found}) than "
                    f"resume={resume!r}; new checkpoints would replace them. Pass resume=True to continue "
                    "from the latest, or give an empty or new checkpoint_dir."
                )
            return resume
        if found is not None and not resume:
            raise ConfigurationError(
                f"The 'checkpoint_dir' {checkpoint_dir!r} already holds checkpoints (latest: {found}). "
                "Pass resume=True to continue that run, or give an empty or new directory."
            )
        return found

    def _restore(self, uri: str, run_settings: dict, rule: UpdateRule, schedule: AveragingSchedule):
        """Loads the checkpoint at ``uri`` into the model, the rule and the schedule."""
        saved = checkpoint.load(uri)
        current = dict(run_settings)
        if self.config.seed is not None:
            current["seed"] = self.config.seed
        checkpoint.check_compatible(uri, {**saved.meta["run"], "seed": saved.meta["seed"]}, current)
        shapes = [tuple(w.shape) for w in self.model.get_weights()]
        if [tuple(w.shape) for w in saved.weights] != shapes:
            raise ConfigurationError(f"The checkpoint at {uri!r} holds weights of other shapes than the model's.")
        set_state(self.model, saved.weights, saved.optimizer)
        expected = rule.init_state(self.model.get_weights(), trainable_mask(self.model))
        if {k: [tuple(a.shape) for a in v] for k, v in saved.rule_state.items()} != {
            k: [tuple(a.shape) for a in v] for k, v in expected.items()
        }:
            raise ConfigurationError(
                f"The checkpoint at {uri!r} holds update-rule state for other trainable weights than the "
                "model's (were layers frozen or unfrozen?)."
            )
        self._rule_state = saved.rule_state
        self._rule_state_of = self._rule_key(rule)
        schedule.set_state(saved.meta["schedule_state"])
        self._seed = saved.meta["seed"]
        logger.info("Resuming from %s (epoch %d, after %d rounds of it).", uri, saved.epoch + 1, saved.rounds_done)
        return saved

    def _save_checkpoint(self, ctx: "_FitContext", epoch: int, rounds_done: int, steps_done: int, epoch_result) -> None:
        weights, opt_vars = get_state(self.model)
        checkpoint.save(
            ctx.checkpoint_dir,
            checkpoint.Checkpoint(
                epoch=epoch,
                rounds_done=rounds_done,
                steps_done=steps_done,
                weights=weights,
                optimizer=opt_vars,
                rule_state=self._rule_state or {},
                meta={
                    "seed": self._seed,
                    "run": ctx.run_settings,
                    "schedule_state": ctx.schedule.get_state(),
                    "epoch_examples": epoch_result.examples if epoch_result is not None else 0,
                    "epoch_metric_sums": dict(epoch_result.metric_sums) if epoch_result is not None else {},
                    "history": {k: [float(x) for x in v] for k, v in self.model.history.history.items()},
                },
            ),
        )

    # ------------------------------------------------------------ rounds

    def _rule_key(self, rule: UpdateRule) -> Dict[str, Any]:
        """What the rule's state belongs to: the rule and the trainable weights' shapes."""
        shapes = [list(w.shape) for w in self.model.trainable_weights]
        return {**rule.describe(), "trainable_shapes": shapes, "mask": trainable_mask(self.model)}

    def _ensure_rule_state(self, rule: UpdateRule) -> None:
        """Creates the update rule's state unless this trainer holds one for the same rule and weights."""
        key = self._rule_key(rule)
        if self._rule_state is None or self._rule_state_of != key:
            self._rule_state = rule.init_state(self.model.get_weights(), trainable_mask(self.model))
            self._rule_state_of = key

    @property
    def update_rule_state(self) -> Dict[str, Any]:
        """The update rule's description and state (e.g. BMUF's ``Δ``, float64 arrays per trainable weight)."""
        return {"rule": self._rule_state_of, "state": self._rule_state}

    def _train_epoch(self, ctx: "_FitContext", epoch: int, logs: Dict[str, float], begin) -> Tuple[Dict[str, float], int]:
        """Runs the rounds of one epoch; returns the epoch's logs and the rounds run.

        ``logs`` (the previous epoch's, ``{}`` at the start of a fit) is what
        the schedule sees before the epoch's first round. ``begin``: a
        checkpoint of this epoch to continue from, or ``None``.
        """
        epoch_result: Optional[PartialResult] = None
        steps_before = 0
        rounds_done = 0
        if begin is not None:
            steps_before, rounds_done = begin.steps_done, begin.rounds_done
            if begin.meta["epoch_examples"]:
                epoch_result = PartialResult(begin.meta["epoch_examples"], metric_sums=begin.meta["epoch_metric_sums"])
                logs = epoch_result.metric_means()
        while steps_before < ctx.epoch_steps:
            rnd = rounds_done
            steps = next_period(ctx.schedule, epoch, rnd, logs, ctx.epoch_steps - steps_before)
            ctx.callbacks.on_train_batch_begin(rnd)
            task = dataclasses.replace(ctx.run, epoch=epoch, round=rnd, steps_before=steps_before, steps=steps)
            result = self._run_round(ctx.sc, task, ctx.rule, ctx.epoch_steps, ctx.epochs)
            steps_before += steps
            rounds_done += 1
            ctx.rounds += 1
            epoch_result = merge(epoch_result, PartialResult(result.examples, metric_sums=result.metric_sums))
            logs = epoch_result.metric_means()
            if ctx.checkpoint_dir is not None and ctx.checkpoint_every != "epoch" and ctx.rounds % ctx.checkpoint_every == 0:
                self._save_checkpoint(ctx, epoch, rounds_done, steps_before, epoch_result)
            ctx.progress.round_end(self.stats.records[-1], logs)
            ctx.callbacks.on_train_batch_end(rnd, logs)
            if self.model.stop_training:
                break
        return logs, rounds_done

    def _run_round(self, sc, task: RoundTask, rule: UpdateRule, epoch_steps: int, epochs: int) -> PartialResult:
        """Runs one broadcast → train → treeAggregate → update round; records its stats."""
        cfg = self.config
        # Wall-clock times (time.time) so they compare with the workers' own.
        t0 = time.time()
        weights, opt_vars = get_state(self.model)
        mask = trainable_mask(self.model)
        learning_rate = current_learning_rate(self.model)
        sent = rule.to_send(weights, self._rule_state, mask)
        if task.exchange_dir is not None:
            # One directory per round: deleting it also takes the files of failed or speculative attempts.
            round_dir = join(task.exchange_dir, f"e{task.epoch}-r{task.round}")
            state = exchange.store_state(round_dir, "state", sent, opt_vars)
            release = partial(_remove_quietly, round_dir)
            task = dataclasses.replace(task, exchange_dir=round_dir)
        else:
            state = sc.broadcast((sent, opt_vars))
            release = state.unpersist
        # Through files the tree only carries timing records: extra levels would only add stages.
        depth = 1 if task.exchange_dir is not None else cfg.aggregation_depth
        t1 = time.time()
        task = dataclasses.replace(task, state=state)
        try:
            with spark_job_labels(
                sc,
                f"sparkdl_avg fit: epoch {task.epoch + 1}/{epochs}, round {task.round + 1} "
                f"(minibatches {task.steps_before + 1}-{task.steps_before + task.steps} of {epoch_steps})",
            ):
                result = data_mod.run_spark_job(
                    lambda: sc.parallelize(range(task.num_workers), task.num_workers)
                    .mapPartitions(partial(run_round_partition, task))
                    .treeAggregate(None, merge, merge, depth)
                )
        except DataError:
            raise
        except Exception as exc:
            text = str(exc)
            at = text.find(WORKER_ERROR_MARKER)
            if at >= 0:
                message = text[at + len(WORKER_ERROR_MARKER) :].splitlines()[0]
            else:  # the task died outside train_round (lost executor, Python worker crash)
                lines = [line for line in text.strip().splitlines() if line.strip()]
                message = (
                    f"Round {task.round} of epoch {task.epoch} failed on the cluster: "
                    f"{lines[-1] if lines else type(exc).__name__}"
                )
            raise WorkerError(message) from exc
        try:
            result = result.load_stored()
        except OSError as exc:
            raise WorkerError(
                f"Could not read the workers' results of epoch {task.epoch}, round {task.round} under "
                f"{task.exchange_dir!r}: {exc}. With state_transport='files' the driver must read what "
                "executors write under staging_dir; use a filesystem both see, or state_transport='spark'."
            ) from exc
        t2 = time.time()
        self._check_finite(task, result)
        average = [s / result.examples for s in result.weight_sums]  # float64
        new_weights = rule.apply(weights, sent, average, self._rule_state, mask, learning_rate)
        new_opt = result.average(result.optimizer_sums, opt_vars) if task.average_optimizer else list(opt_vars)
        it = iterations_index(self.model)
        new_opt[it] = np.asarray(int(opt_vars[it]) + task.steps, dtype=opt_vars[it].dtype)
        set_state(self.model, new_weights, new_opt)
        release()
        t3 = time.time()
        self.stats.add({**round_record(task, result, t0, t1, t2, t3), "update_rule": rule.name})
        return result

    def _check_finite(self, task: RoundTask, result: PartialResult) -> None:
        """Stops (or, with ``on_nonfinite="skip"``, warns) when replicas' loss or weights are NaN/Inf.

        Raised before the driver's model is touched, so it keeps the last good weights.
        """
        bad = sorted((w for w in result.workers if not w.get("finite", True)), key=lambda w: w["worker"])
        if not bad:
            return
        names = ", ".join(f"{w['worker']} (loss {w['loss']:.4g})" for w in bad)
        where = f"epoch {task.epoch}, round {task.round}"
        if self.config.on_nonfinite == "raise" or len(bad) == len(result.workers):
            raise WorkerError(
                f"Non-finite loss or weights (NaN/Inf) from worker(s) {names} in {where}. The model "
                "keeps the weights from before this round (and the last checkpoint is unchanged). "
                "Lower the learning rate, check the data, or pass on_nonfinite='skip' to leave such "
                "replicas out of the average."
            )
        logger.warning("Left worker(s) %s out of the average of %s: non-finite loss or weights.", names, where)

    # ------------------------------------------------------------- evaluate

    def _evaluate_staged(self, sc, staged: StagedDataset, spec_bc, fingerprint, parts, batch_size) -> Dict[str, float]:
        state_bc = sc.broadcast(get_state(self.model))
        task = EvalTask(spec_bc, fingerprint, state_bc, staged, parts, batch_size)
        try:
            with spark_job_labels(sc, "sparkdl_avg evaluate"):
                result = data_mod.run_spark_job(
                    lambda: sc.parallelize(range(parts), parts)
                    .mapPartitions(partial(run_eval_partition, task))
                    .treeAggregate(None, merge, merge, self.config.aggregation_depth)
                )
        finally:
            state_bc.unpersist()
        return result.metric_means()

    def evaluate(
        self,
        data,
        features_col: str = "features",
        label_col: str = "label",
        batch_size: Optional[int] = None,
        return_dict: bool = False,
    ):
        """Computes the compiled loss and metrics on the cluster.

        Each of ``num_workers`` tasks evaluates a contiguous part of the staged
        data; results are example-weighted, so mean-type metrics (loss,
        accuracy, MAE, ...) equal ``model.evaluate`` on the same data.

        Args:
            data: Same kinds as in :meth:`fit`.
            features_col: DataFrame features column. Default ``"features"``.
            label_col: DataFrame label column. Default ``"label"``.
            batch_size: Examples per evaluation minibatch. Default: the
                trainer's ``batch_size``.
            return_dict: Return ``{name: value}`` instead of a list.

        Returns:
            Like ``keras.Model.evaluate``: the loss alone when the model has no
            metrics, else ``[loss, metric, ...]`` (or a dict).
        """
        if batch_size is not None:
            TrainerConfig(batch_size=batch_size)  # the same check as the trainer's
        sc = data_mod.spark_context_for(data)
        staged = self._stage(data, features_col, label_col, "evaluation")
        parts = self.config.num_workers or sc.defaultParallelism
        spec = ModelSpec.from_model(self.model)
        spec_bc = sc.broadcast(spec)
        try:
            logs = self._evaluate_staged(
                sc, staged, spec_bc, spec.fingerprint, parts, batch_size or self.config.batch_size
            )
        finally:
            spec_bc.unpersist()
        if return_dict:
            return logs
        values = [logs[name] for name in _keras_log_order(self.model, logs)]
        return values[0] if len(values) == 1 else values

    def predict(
        self,
        data,
        features_col: str = "features",
        prediction_col: str = "prediction",
        probability_col: Optional[str] = "probability",
        batch_size: int = 1024,
    ):
        """Adds the model's predictions to a DataFrame, computed on the executors.

        DataFrame in, DataFrame out (lazily, like any transformation): every
        input column is kept and ``prediction_col`` (the class index as a
        double for a model compiled with a cross-entropy loss, else the
        output value(s)) and, for classifiers, ``probability_col`` (a
        ``DenseVector`` of class probabilities) are added. See
        :func:`sparkdl_avg.inference.add_predictions`.

        Args:
            data: Spark DataFrame with the features column.
            features_col: Features column, as in :meth:`fit`. Default ``"features"``.
            prediction_col: Output column. Default ``"prediction"``.
            probability_col: Output column for classifiers; ``None`` omits it.
            batch_size: Examples per ``predict_on_batch`` call. Default 1024.
        """
        from .inference import add_predictions

        check_int("batch_size", batch_size, 1)
        return add_predictions(data, self.model, features_col, prediction_col, probability_col, batch_size)

    def write_report(self, path: str, title: Optional[str] = None) -> str:
        """Writes the HTML training report of the latest fit (see :mod:`sparkdl_avg.report`).

        Args:
            path: Output ``.html`` file (replaced atomically).
            title: Page title. Default: names the model.

        Returns:
            ``path``.
        """
        from .report import write_report

        if self._last_fit_first_record is None:
            raise RuntimeError("write_report() needs a completed fit(); call fit() first.")
        return write_report(
            path,
            self.stats.records[self._last_fit_first_record :],
            self.history.history if self.history is not None else None,
            title=title or f"sparkdl_avg training report: {self.model.name}",
        )


def _remove_quietly(uri: str) -> None:
    """Deletes a directory tree of exchange files; a failure is logged, not raised (it must not hide the fit's own error)."""
    try:
        remove_tree(uri)
    except OSError as exc:
        logger.warning("Could not delete %s: %s", uri, exc)


def round_record(task: RoundTask, result: PartialResult, t0: float, t1: float, t2: float, t3: float) -> dict:
    """The stats record of one round (see :mod:`sparkdl_avg.stats` for the fields).

    ``t0``..``t3`` are driver wall-clock times: round start, broadcast done,
    aggregated result received, driver update done. The job's time splits
    into scheduling (until the first worker starts), the workers' span (first
    start to last end, by the workers' clocks) and aggregation (the rest:
    serialising results, the tree aggregation and the transfer to the
    driver). On a multi-host cluster clock skew blurs that split a little.
    """
    workers = sorted(result.workers, key=lambda w: w["worker"])
    compute = [w["compute_s"] for w in workers]
    busy = [w["setup_s"] + w["load_s"] + w["compute_s"] for w in workers]
    first_start = min(w["start"] for w in workers)
    last_end = max(w["end"] for w in workers)
    schedule = min(max(0.0, first_start - t1), t2 - t1)
    span = min(max(0.0, last_end - max(first_start, t1)), t2 - t1 - schedule)
    wall = time.time() - t0
    return {
        "epoch": task.epoch,
        "round": task.round,
        "averaging_frequency": task.steps,
        "num_workers": task.num_workers,
        "examples": result.examples,
        "t_start": t0,
        "wall_s": wall,
        "broadcast_s": t1 - t0,
        "job_s": t2 - t1,
        "schedule_s": schedule,
        "workers_s": span,
        "aggregate_s": t2 - t1 - schedule - span,
        "update_s": t3 - t2,
        "other_s": wall - (t3 - t0),
        "compute_max_s": max(compute),
        "compute_min_s": min(compute),
        "compute_mean_s": sum(compute) / len(compute),
        "load_max_s": max(w["load_s"] for w in workers),
        "load_mean_s": sum(w["load_s"] for w in workers) / len(workers),
        "setup_max_s": max(w["setup_s"] for w in workers),
        "overhead_s": wall - max(busy),
        "examples_per_s": result.examples / wall if wall > 0 else 0.0,
        "loss": result.metric_means().get("loss"),
        "replicas_built": sum(1 for w in workers if w["replica_built"]),
        "workers": workers,
    }


def _keras_log_order(model, logs: Dict[str, float]) -> List[str]:
    """The names in ``logs`` in ``keras.Model.evaluate``'s list order.

    The loss first, then the compiled metrics in the order given to
    ``compile``, then anything else alphabetically (Keras' own rule).
    """
    import keras

    declared = []
    for metric in keras.tree.flatten(model.get_compile_config().get("metrics") or []):
        if isinstance(metric, str):
            declared.append(metric)
        elif isinstance(metric, dict):
            declared.append(metric.get("config", {}).get("name"))
    order = [n for n in ["loss", *declared] if n in logs]
    return order + sorted(k for k in logs if k not in order)
