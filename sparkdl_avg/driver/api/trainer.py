"""The public API of the library: ``ParameterAveragingTrainer`` and its epoch loop.

This module owns what a user calls — ``fit``, ``evaluate``, ``predict``,
``write_report`` — and the loop of a fit: staging the data, callbacks,
progress, validation after each epoch, and when to checkpoint. One round
(state out, the Spark job, the update rule) is :mod:`sparkdl_avg.driver.fit.rounds`'s;
how state moves is :mod:`sparkdl_avg.driver.transport.paths`'s; checkpoint policy is
:mod:`sparkdl_avg.driver.checkpoint.policy`'s; what executors run is :mod:`sparkdl_avg.executor.worker`'s.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import sys
import time
import uuid
import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ...errors import ConfigurationError, DataError, NotFittedError
from ...shared.errors import interrupt
from ...shared.wire.aggregation import PartialResult, merge
from ...shared.data.example_order import steps_per_epoch
from ...shared.files.fs import check_writable, join
from ...shared.model.modelspec import (
    ModelSpec,
    architecture_signature,
    check_model_loads,
    get_state,
    input_dtypes,
    input_shapes,
    inputs_dtype,
)
from ...shared.data.preprocess import Preprocess
from ...shared.data.staged_dataset import StagedDataset
from ...shared.wire.stats import TrainingStats
from ..checkpoint import policy as resume_mod
from ..data import staging
from ..transport import paths as transport_mod
from ..config.trainer_config import TrainerConfig, check_fit_args, check_loss, check_with_model, validate_model
from ..transport.feedback import FeedbackLedger, lag_of
from ..elastic.membership import Change, Membership, probes, slot_source
from ..config.options import TRAINER, Ints, Text, constructor, document, of, require, trainer_entries
from ..observe.progress import Progress
from ..fit.rounds import RoundRunner, RoundSettings, RuleState
from ..algorithms.schedules import AveragingSchedule, FixedPeriod, next_period
from ..data.adapters import engine_for, get_data_adapter, known_data
from ..data.staging_roots import StagingRoot
from ..fit.stale_async import EpochHooks, StaleRunner

logger = logging.getLogger("sparkdl_avg")


@dataclass
class _FitPlan:
    """What ``fit`` settled before its first round (:meth:`ParameterAveragingTrainer._plan`).

    ``fit``'s arguments, checked, and what they resolved to: the engine, the
    workers, the staged data, the schedule and update rule, and the
    checkpoint this fit continues (already restored into the model).
    """

    epochs: int
    initial_epoch: int
    features_col: Any
    label_col: Any
    verbose: Any
    shuffle: bool
    checkpoint_dir: Optional[str]
    checkpoint_every: Any
    engine: Any
    num_workers: int
    spec: ModelSpec
    train: StagedDataset
    val: Optional[StagedDataset]
    staging_s: float
    epoch_steps: int
    schedule: AveragingSchedule
    rule: Any
    run_settings: Dict[str, Any]
    resumed_from: Optional[str] = None  # the checkpoint's URI
    restored: Any = None  # the checkpoint (sparkdl_avg.driver.checkpoint.files.Checkpoint) this fit continues

    @property
    def start_epoch(self) -> int:
        """The first epoch this fit trains: the checkpoint's, else ``initial_epoch``."""
        return self.restored.epoch if self.restored is not None else self.initial_epoch


@dataclass
class _FitContext:
    """What the epochs of one ``fit`` share."""

    rounds: RoundRunner
    transport: Any  # the fit's StateTransport (also the round runner's)
    group: str  # the fit's Spark job group
    labels: Any  # the fit's job labels, a context manager (Engine.labels)
    epochs: int
    epoch_steps: int
    schedule: AveragingSchedule
    callbacks: Any
    progress: Progress
    checkpoints: resume_mod.Checkpointing
    stale: Optional[StaleRunner] = None  # synchronization="stale"/"async": the epochs run as chunks
    feedback: Optional[FeedbackLedger] = None  # update_compression with error feedback: the residual files
    membership: Optional[Membership] = None  # elastic rounds: each round's workers, planned for the live slots
    local: Optional[FeedbackLedger] = None  # optimizer_state="local": each worker's own optimizer state (files)
    rounds_in_fit: int = 0
    capped_warned: bool = False  # the warning that k exceeds an epoch's minibatches, once per fit


@dataclass
class FitInfo:
    """What a fit tells the callbacks that ask for it: trackers such as :class:`~sparkdl_avg.driver.observe.tracking.MlflowLogger`.

    A callback with an ``on_fit_begin(fit)`` method gets it called with this
    before ``on_train_begin``, and ``on_fit_end(fit, error)`` once the fit is
    over, also when it fails (``error``: the exception, which then
    propagates; ``None`` on success, when ``trainer.history`` is set).

    Attributes:
        trainer: The trainer: its ``model``, ``stats`` (this fit's rounds so
            far) and ``write_report``.
        params: The fit's settings, flat and JSON-able: the trainer's options
            (the update rule and schedule as their descriptions), ``fit``'s,
            and what the fit resolved (workers, examples, the transport, the
            master, the versions).
        epochs: ``fit``'s ``epochs`` (the epoch to stop before).
        start_epoch: The first epoch this fit trains: ``initial_epoch``, or the checkpoint's.
        resumed_from: The checkpoint this fit continues, or ``None``.
        tracking: JSON-able state saved in every checkpoint of the fit and
            restored from it on resume; trackers keep what they need to
            continue there (MLflow's run id).
    """

    trainer: "ParameterAveragingTrainer"
    params: Dict[str, Any]
    epochs: int
    start_epoch: int
    resumed_from: Optional[str]
    tracking: Dict[str, Any]


class ParameterAveragingTrainer:
    """Trains a compiled Keras model on Spark by synchronous parameter averaging.

    Args:
        model: A compiled ``keras.Model`` with one input and one output and a
            known input shape. It is trained in place: after ``fit`` it holds
            the averaged weights (also available as ``trainer.model``).
        **options: The options below (:data:`sparkdl_avg.driver.config.options.OPTIONS`,
            the fields of :class:`~sparkdl_avg.TrainerConfig`), by keyword
            or, in this order, by position.

    Raises:
        ConfigurationError: a parameter or the model is invalid.
    """

    __doc__ = document(__doc__, trainer_entries())  # the options' Args, from the table

    @constructor()
    def __init__(self, model, **options: Any) -> None:
        seed, staging_dir = options["seed"], options["staging_dir"]  # read below
        self.config = TrainerConfig(**options)
        validate_model(model)
        check_with_model(self.config, model)
        self.model = model
        self.stats = TrainingStats()  # the round records of the latest fit (a new one per fit)
        self._seed = seed if seed is not None else random.SystemRandom().randrange(2**31)
        self._staged: Dict[tuple, tuple] = {}
        self._default_staging = staging_dir is None
        self._shared_checked: set = set()  # the engines (Engine.key) whose executors were seen to share the root
        self._fits = 0
        self.history = None  # the History of the latest completed fit
        self._rule_state = RuleState()  # carried over to the next fit of this trainer
        self._preprocess = Preprocess.of(self.config.preprocess)
        self._predict_cache = None  # predict's shipped spec and weights (sparkdl_avg.driver.data.inference.PredictCache)
        self._root = StagingRoot.new(staging_dir, id(self))
        self._staging_root = self._root.uri
        self._finalizer = weakref.finalize(self, self._root.remove)

    # ------------------------------------------------------------------ data

    def _stage(self, data, features_col: str, label_col: str, what: str,
               sample_weight_col: Optional[str] = None) -> StagedDataset:
        """Stages ``data`` once (:func:`sparkdl_avg.driver.data.staging.stage`); the same data again reuses the files."""
        key = staging.data_key(data, features_col, label_col, sample_weight_col, self._preprocess)
        if key is not None and key in self._staged:
            return self._staged[key][1]
        self._make_staging_root(engine_for(data))
        staged = staging.stage(
            data,
            root=self._staging_root,
            x_shapes=input_shapes(self.model),
            x_dtype=input_dtypes(self.model),
            label_dtype=inputs_dtype(self.model),
            num_outputs=len(self.model.outputs),
            features_col=features_col,
            label_col=label_col,
            what=what,
            checks=staging.data_checks(self.model, self.config.check_data),
            sample_weight_col=sample_weight_col,
            preprocess=self._preprocess,
        )
        if key is not None:
            self._staged[key] = (data, staged)  # holding `data` keeps its id() unique
        return staged

    def _make_staging_root(self, engine) -> None:
        """Creates this trainer's staging root (private when local and the master is local) and checks it is shared.

        With ``local[N]`` or ``local-cluster`` every executor runs as this
        user on this host, so nobody else needs the staged data or the
        exchanged weights under it. On other masters a local path (a shared
        mount) keeps the umask's modes: executors may run as another user
        (YARN's, a standalone worker's) and would be locked out. URIs keep
        their filesystem's permissions. See docs/reliability.md. On such
        masters a local root must be one the executors see
        (:func:`sparkdl_avg.driver.data.staging.check_shared_root`): a fit on hosts whose
        ``/tmp`` differ otherwise failed late, reading staged data that was
        written on another host. Making a local root also removes the roots
        that killed drivers left beside it (:mod:`sparkdl_avg.driver.data.staging_roots`).
        """
        self._root.make(private=engine.one_host)
        if not engine.one_host and engine.key not in self._shared_checked:
            staging.check_shared_root(engine, self._staging_root, max(self.config.num_workers or 0,
                                                                       engine.default_parallelism),
                                       default=self._default_staging)
            self._shared_checked.add(engine.key)

    def close(self) -> None:
        """Deletes the staged data. The trainer can still be used; data is staged again."""
        self._staged.clear()
        self._root.remove()

    def __enter__(self) -> "ParameterAveragingTrainer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ fit

    @interrupt.guarded  # Ctrl-C: KeyboardInterrupt, the fit's jobs cancelled (sparkdl_avg.shared.errors.interrupt)
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
        initial_epoch: int = 0,
        sample_weight_col: Optional[str] = None,
        class_weight: Optional[Dict[int, float]] = None,
    ):
        """Trains the model by parameter averaging for ``epochs`` passes over ``data``.

        Args:
            data: Spark DataFrame, RDD of ``(x, y)`` pairs, or ``(x, y)`` numpy
                arrays. Staged once and reused when the same data is fitted
                again. For a model with several inputs (outputs), ``x``
                (``y``) is a list/tuple of arrays in the order of
                ``model.inputs`` (``model.outputs``). Any other container
                through its :class:`sparkdl_avg.DataAdapter` (``register_data_adapter``).
            epochs: The index of the epoch to stop before, as in
                ``keras.Model.fit``: the fit trains epochs ``initial_epoch``
                to ``epochs - 1``, i.e. ``epochs`` passes over the data from
                the default ``initial_epoch=0``; with ``resume``, the total,
                counting the epochs before the checkpoint. Default 1.
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
                :mod:`sparkdl_avg.driver.checkpoint.files`); it must be new, empty, or hold
                this run's checkpoints (then pass ``resume=True``), and be
                writable (probed before any Spark job). Each checkpoint is
                read back before it counts; the latest and the newest earlier
                one that reads back are kept. Default ``None``: no checkpoints.
            checkpoint_every: ``"epoch"`` (default: after every epoch) or a
                number of rounds.
            resume: ``True`` continues from the latest checkpoint in
                ``checkpoint_dir`` that reads back, if there is one (else
                starts afresh; a damaged one is skipped with a warning); a
                checkpoint path continues from that one. The model, data and
                settings must be those of the run that wrote it.
            initial_epoch: The epoch to start at, to continue an earlier fit
                (``fit(epochs=3)`` then ``fit(epochs=5, initial_epoch=3)``),
                as in ``keras.Model.fit``: the history, callbacks, progress
                lines, ``trainer.stats`` and Spark job labels number epochs
                from it, and each epoch visits the data in the order of its
                index, so the two fits train what ``fit(epochs=5)`` would
                (for a fixed ``averaging_frequency``). Must be below
                ``epochs``. With ``resume``, a checkpoint's epoch (which must
                not be before ``initial_epoch``) is where the fit starts.
                Default 0.
            sample_weight_col: DataFrame column of each example's weight in
                the loss, as Keras' ``sample_weight`` (numpy data: pass
                ``(x, y, sample_weight)``); also used for ``validation_data``
                when it has the column. An example weighs the same on
                whichever worker it lands. Default ``None``: all weigh 1.
            class_weight: ``{class index: weight}``, as Keras'
                ``class_weight``: each example's weight is multiplied by its
                class's (its label, or the label's argmax); models with one
                output. Default ``None``.

        Returns:
            A ``keras.callbacks.History``: ``history.history["loss"]`` has one
            value per epoch, the example-weighted mean over all workers'
            minibatches, and likewise every compiled metric, for the epochs
            this fit trained (``history.epoch``: their indices, from
            ``initial_epoch``). After a resume it also holds the epochs the
            checkpointed fit trained before the checkpoint, from
            ``initial_epoch`` on. Also kept as
            ``trainer.history``; ``trainer.stats`` holds this fit's rounds.

        Raises:
            ConfigurationError, DataError: before any training round runs.
            PathError: before any Spark job, ``checkpoint_dir`` or
                ``staging_dir`` cannot be written;
                :class:`~sparkdl_avg.errors.CheckpointError`, the checkpoint
                to resume from (or, with ``resume=True``, every one) is damaged.
            WorkerError: a round's Spark job failed, or a replica's loss or
                weights became NaN/Inf (with ``on_nonfinite="raise"``).
        """
        plan = self._plan(data, validation_data, epochs, features_col, label_col, verbose, shuffle, checkpoint_dir,
                          checkpoint_every, resume, initial_epoch, sample_weight_col,
                          class_weight)  # every check before any Spark job; data staged
        if callbacks is not None and not isinstance(callbacks, (list, tuple)):
            callbacks = [callbacks]  # keras.Model.fit takes one callback alone too
        callback_list = self._callback_list(plan, callbacks)
        ctx = self._start(plan, callback_list)  # this fit's stats, job group, transport and round runner
        observers = [cb for cb in callbacks or () if callable(getattr(cb, "on_fit_begin", None))]
        info = self._fit_info(plan, ctx, observers)
        self.model.stop_training = False
        with interrupt.cancelling(plan.engine, ctx.group), ctx.labels:  # Ctrl-C: KeyboardInterrupt, the group cancelled
            self._run(plan, ctx, observers, info)
        return self.model.history

    def _plan(self, data, validation_data, epochs: int, features_col, label_col, verbose, shuffle: bool,
              checkpoint_dir: Optional[str], checkpoint_every: Any, resume: Any, initial_epoch: int,
              sample_weight_col: Optional[str] = None, class_weight: Optional[dict] = None) -> "_FitPlan":
        """``fit``'s steps before its first round; returns the :class:`_FitPlan`.

        In this order: the checks (before any Spark job), the checkpoint to
        resume from located, the data staged, the settings, and the
        checkpoint restored into the model.
        """
        verbose = self._check_fit_args(epochs, initial_epoch, verbose, shuffle, checkpoint_dir, checkpoint_every, resume,
                                       sample_weight_col, class_weight)
        data = known_data(data, "training")  # a user's container converted once; pandas refused
        validation_data = None if validation_data is None else known_data(validation_data, "validation")
        engine = engine_for(data)
        num_workers = self._num_workers(engine)
        checkpoint_uri, saved = resume_mod.locate(checkpoint_dir, resume)  # read and verified
        spec = ModelSpec.from_model(self.model)
        check_model_loads(spec)
        train, val, staging_s = self._stage_fit_data(data, validation_data, features_col, label_col,
                                                     sample_weight_col, class_weight)
        epoch_steps = self._epoch_steps(train, num_workers)
        cfg = self.config
        schedule = cfg.schedule()
        rule = cfg.rule(num_workers)
        self._rule_state.ensure(rule, self.model)
        plan = _FitPlan(
            epochs=epochs, initial_epoch=initial_epoch, features_col=features_col, label_col=label_col,
            verbose=verbose, shuffle=shuffle, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
            engine=engine, num_workers=num_workers, spec=spec, train=train, val=val, staging_s=staging_s,
            epoch_steps=epoch_steps, schedule=schedule, rule=rule,
            run_settings=self._run_settings(train, num_workers, rule, schedule, shuffle),
            resumed_from=checkpoint_uri,
        )
        if checkpoint_uri:
            plan.restored = resume_mod.restore(
                checkpoint_uri, self.model, plan.run_settings, cfg.seed, rule, self._rule_state, schedule,
                initial_epoch, saved=saved,
            )
            self._seed = plan.restored.meta.seed
            resume_mod.warn_dropped_residuals(checkpoint_uri, plan.restored, cfg.update_compression, any(cfg.feedback))
        return plan

    def _check_fit_args(self, epochs: int, initial_epoch: int, verbose, shuffle: Any, checkpoint_dir: Optional[str],
                        checkpoint_every: Any, resume: Any, sample_weight_col: Optional[str] = None,
                        class_weight: Optional[dict] = None):
        """Checks ``fit``'s arguments and probes ``checkpoint_dir``, before any Spark job; returns ``verbose`` resolved."""
        verbose = check_fit_args(
            self.config.synchronization, epochs=epochs, initial_epoch=initial_epoch, verbose=verbose, shuffle=shuffle,
            checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every, resume=resume,
            sample_weight_col=sample_weight_col, class_weight=class_weight,
        )["verbose"]
        check_loss(self.model, "fit")
        if class_weight is not None and len(self.model.outputs) > 1:
            raise ConfigurationError(
                "The 'class_weight' parameter applies to models with one output, as in keras.Model.fit; weigh the "
                f"examples of a model with {len(self.model.outputs)} outputs with sample_weight_col. Got "
                f"class_weight={class_weight!r} instead."
            )
        if class_weight is not None:
            _check_classes(class_weight, staging.data_checks(self.model))
        if checkpoint_dir is not None:  # before any job: not after an epoch of training
            check_writable(checkpoint_dir, "The 'checkpoint_dir' parameter")
        return verbose

    def _num_workers(self, engine) -> int:
        """The fit's workers: the option, or the task slots; warns when there are more than the slots.

        Elastic rounds: the most workers a round may have (``max_workers``, else
        ``num_workers``, else the task slots now), which the update rule's
        defaults are resolved for; each round plans its own (:mod:`sparkdl_avg.driver.elastic.membership`).
        """
        cfg = self.config
        if cfg.elastic:
            return cfg.max_workers or cfg.num_workers or engine.default_parallelism
        num_workers = self.config.num_workers or engine.default_parallelism
        if num_workers > engine.default_parallelism:
            logger.warning(
                "num_workers=%d but the cluster has %d task slots (spark.default.parallelism): only %d workers "
                "run at once, so each round takes about %.1fx as long.",
                num_workers, engine.default_parallelism, engine.default_parallelism,
                num_workers / engine.default_parallelism,
            )
        return num_workers

    def _stage_fit_data(self, data, validation_data, features_col, label_col, sample_weight_col=None,
                        class_weight=None) -> Tuple[StagedDataset, Optional[StagedDataset], float]:
        """Stages the training and validation data; returns them and the seconds it took (``TrainingStats.staging_s``).

        The validation data is weighted by ``sample_weight_col`` when it has
        the column (as Keras weighs ``validation_data`` given with weights);
        ``class_weight`` applies to the training data only, as in Keras.
        """
        staging_started = time.perf_counter()
        train = self._stage(data, features_col, label_col, "training", sample_weight_col)
        if class_weight is not None:
            train = dataclasses.replace(train, class_weight=tuple(sorted((int(k), float(v))
                                                                         for k, v in class_weight.items())))
        val = None
        if validation_data is not None:
            weights = sample_weight_col if _has_column(validation_data, sample_weight_col) else None
            val = self._stage(validation_data, features_col, label_col, "validation", weights)
        return train, val, time.perf_counter() - staging_started

    def _epoch_steps(self, train: StagedDataset, num_workers: int) -> int:
        """Minibatches each worker trains per epoch; refuses data too small for one round.

        Elastic rounds need enough data for ``min_workers`` (their rounds
        have at most as many workers as the data has minibatches).
        """
        cfg = self.config
        if cfg.elastic:
            num_workers = min(num_workers, max(cfg.min_workers or 1, train.num_examples // cfg.batch_size))
        epoch_steps = steps_per_epoch(train.num_examples, num_workers, cfg.batch_size)
        if not epoch_steps:
            workers = "min_workers" if cfg.elastic else "num_workers"
            raise DataError(
                f"The training data has {train.num_examples} examples; one round needs at "
                f"least {workers} * batch_size = {num_workers} * {cfg.batch_size} = "
                f"{num_workers * cfg.batch_size}. Lower '{workers}' or 'batch_size'."
            )
        return epoch_steps

    def _run_settings(self, train: StagedDataset, num_workers: int, rule, schedule, shuffle: bool) -> Dict[str, Any]:
        """What a checkpoint of this fit records and a resumed fit must match (:func:`sparkdl_avg.driver.checkpoint.files.check_compatible`)."""
        cfg = self.config
        return {
            "model": architecture_signature(self.model),
            "num_examples": train.num_examples,
            # elastic rounds: the bounds, not the workers now (a resumed fit plans for the slots it has)
            "num_workers": None if cfg.elastic else num_workers,
            "elastic": [cfg.min_workers, cfg.max_workers or cfg.num_workers] if cfg.elastic else None,
            "batch_size": cfg.batch_size,
            "optimizer_state": cfg.optimizer_state,
            "update_rule": rule.describe(),
            "averaging_frequency": schedule.describe(),
            "shuffle": shuffle,
            # what the examples are (issue 37); absent from older checkpoints, where they were all unset
            "preprocess": train.preprocess.name if train.preprocess is not None else None,
            "sample_weight_col": next((c.source for c in train.columns if c.role == "w"), train.weight_name),
            "class_weight": [list(pair) for pair in train.class_weight] if train.class_weight else None,
        }

    def _callback_list(self, plan: "_FitPlan", callbacks):
        """The fit's ``keras.callbacks.CallbackList``, with a History (``trainer.history``) and no progress bar."""
        import keras

        return keras.callbacks.CallbackList(
            callbacks,
            add_history=True,
            add_progbar=False,
            model=self.model,
            verbose=plan.verbose,
            epochs=plan.epochs,
            # Batch hooks run once per round; rounds per epoch are known for a fixed k only.
            steps=-(-plan.epoch_steps // plan.schedule.k) if isinstance(plan.schedule, FixedPeriod) else None,
        )

    def _start(self, plan: "_FitPlan", callback_list) -> "_FitContext":
        """Starts the fit's record (``trainer.stats``), job group and transport; returns what its epochs share."""
        cfg = self.config
        # trainer.stats and trainer.history describe the latest fit (as keras.Model.fit's History does)
        self.stats = TrainingStats(staging_s=plan.staging_s, staged_bytes=plan.train.nbytes,
                                   validation_staged_bytes=plan.val.nbytes if plan.val is not None else 0)
        self.history = None
        self._fits += 1
        group = f"sparkdl_avg-fit-{id(self):x}-{self._fits}"
        labels = plan.engine.labels(f"sparkdl_avg fit {self._fits} of model {self.model.name!r}", group=group)
        transport = self._transport(plan.engine, f"exchange-{self._fits}", plan.num_workers)
        membership = self._membership(plan)
        feedback = None
        if any(cfg.feedback):  # residual files, beside the transport's, deleted with the fit
            feedback = FeedbackLedger(join(self._staging_root, f"exchange-{self._fits}/feedback"), plan.num_workers,
                                      lag_of(cfg.synchronization, cfg.staleness), cfg.update_compression)
            if plan.restored is not None:
                feedback.restore(plan.restored.feedback)
        local = None
        if cfg.optimizer_state == "local":  # each worker's own optimizer state, beside the transport's files
            # kept on the workers' hosts where tasks can be placed there (classic sessions: a locality preference)
            local = FeedbackLedger.local_states(join(self._staging_root, f"exchange-{self._fits}/local"),
                                                plan.num_workers, host_local=plan.engine.sc is not None)
            if plan.restored is not None:
                local.restore(plan.restored.feedback)
        settings = RoundSettings(
            spec=transport.ship_spec(plan.spec),
            fingerprint=plan.spec.fingerprint,
            dataset=plan.train,
            num_workers=plan.num_workers,
            batch_size=cfg.batch_size,
            seed=self._seed,
            shuffle=plan.shuffle,
            average_optimizer=cfg.optimizer_state == "average",
            on_nonfinite=cfg.on_nonfinite,
            epochs=plan.epochs,
            epoch_steps=plan.epoch_steps,
            compression=cfg.update_compression,
        )
        rounds = RoundRunner(plan.engine, self.model, settings, plan.rule, self._rule_state, transport, self.stats,
                             feedback, local)
        return _FitContext(
            rounds=rounds,
            transport=transport,
            group=group,
            labels=labels,
            epochs=plan.epochs,
            epoch_steps=plan.epoch_steps,
            schedule=plan.schedule,
            callbacks=callback_list,
            progress=Progress(plan.verbose, plan.epochs, plan.epoch_steps),
            checkpoints=resume_mod.Checkpointing(
                plan.checkpoint_dir, plan.checkpoint_every, self.model, self._rule_state, plan.schedule, self._seed,
                plan.run_settings, tracking=dict(plan.restored.meta.tracking) if plan.restored is not None else {},
                feedback=feedback, membership=membership, local=local,
            ),
            stale=self._stale_runner(rounds, group),
            feedback=feedback,
            membership=membership,
            local=local,
        )

    def _membership(self, plan: "_FitPlan") -> Optional[Membership]:
        """Elastic rounds: what plans each round's workers, with a resumed checkpoint's history; else ``None``."""
        cfg = self.config
        if not cfg.elastic:
            return None
        most = min(plan.num_workers, plan.train.num_examples // cfg.batch_size)  # a round needs a minibatch each
        history = [Change.from_json(c) for c in plan.restored.meta.membership] if plan.restored is not None else []
        return Membership(slot_source(plan.engine, most), cfg.min_workers or 1, most, cfg.elastic_timeout_s,
                          history=history, resumed=plan.restored is not None)

    def _stale_runner(self, rounds: RoundRunner, group: str) -> Optional[StaleRunner]:
        """``synchronization="stale"``/``"async"``: what runs the epochs as chunks; ``None`` for ``"sync"``."""
        cfg = self.config
        if cfg.synchronization == "sync":
            return None
        return StaleRunner(rounds, cfg.staleness if cfg.synchronization == "stale" else None, cfg.staleness_aware,
                           group, reproducible=cfg.reproducible)

    def _fit_info(self, plan: "_FitPlan", ctx: "_FitContext", observers: List[Any]) -> FitInfo:
        """The :class:`FitInfo` of this fit; its ``params`` only when a callback observes the fit."""
        return FitInfo(
            trainer=self,
            # under Connect spark.version is a round trip: only when someone asks
            params=self._fit_params(plan, ctx) if observers else {},
            epochs=plan.epochs,
            start_epoch=plan.start_epoch,
            resumed_from=plan.resumed_from,
            tracking=ctx.checkpoints.tracking,
        )

    def _run(self, plan: "_FitPlan", ctx: "_FitContext", observers: List[Any], info: FitInfo) -> None:
        """The fit from ``on_fit_begin`` to ``on_fit_end``: the epochs; the transport is closed however they end."""
        error: Optional[BaseException] = None
        try:
            for cb in observers:
                cb.on_fit_begin(info)
            ctx.callbacks.on_train_begin()
            logs = self._resume_history(plan)
            logs = self._epochs(plan, ctx, logs)
            ctx.callbacks.on_train_end(logs)
            ctx.progress.train_end(self.stats.summary())
            self.history = self.model.history
        except BaseException as exc:
            error = exc
            raise
        finally:
            ctx.transport.close()
            for ledger in (ctx.feedback, ctx.local):
                if ledger is not None:
                    ledger.close()
            for cb in observers:
                cb.on_fit_end(info, error)

    def _resume_history(self, plan: "_FitPlan") -> Dict[str, float]:
        """Puts the resumed checkpoint's epochs in the History; returns the latest one's logs (``{}``: none)."""
        restored = plan.restored
        if restored is None:
            return {}
        start_epoch = restored.epoch
        history = restored.meta.history
        # the checkpointed fit's epochs from initial_epoch on (those of this command)
        first = start_epoch - max((len(v) for v in history.values()), default=0)
        drop = max(0, plan.initial_epoch - first)
        self.model.history.history = {k: list(v)[drop:] for k, v in history.items()}
        self.model.history.epoch = list(range(first + drop, start_epoch))
        logs = {k: v[-1] for k, v in history.items() if v}
        if start_epoch >= plan.epochs:
            logger.warning(
                "The checkpoint %s is at epoch %d; fit(epochs=%d) has nothing left to train.",
                plan.resumed_from, start_epoch, plan.epochs,
            )
        return logs

    def _epochs(self, plan: "_FitPlan", ctx: "_FitContext", logs: Dict[str, float]) -> Dict[str, float]:
        """Trains the epochs from ``plan.start_epoch`` until ``epochs`` or a callback's stop; returns the last logs."""
        cfg = self.config
        slow_pending = cfg.slow_warning and ctx.stale is None  # until steady rounds decide (_warn_if_slow)
        for epoch in range(plan.start_epoch, plan.epochs):
            ctx.callbacks.on_epoch_begin(epoch)
            ctx.progress.epoch_begin(epoch)
            begin = plan.restored if plan.restored is not None and epoch == plan.restored.epoch else None
            logs, rounds_done = self._train_epoch(ctx, epoch, logs, begin)
            if epoch == plan.start_epoch and cfg.slow_warning:
                _note_cold_start(plan.engine, self.stats.records)
            if slow_pending:
                slow_pending = not self._warn_if_slow(ctx.rounds.settings, last=epoch == plan.epochs - 1)
            logs = self._validate(plan, ctx, logs)
            resumed_after = begin.rounds_done if begin is not None else 0
            ctx.progress.epoch_end(epoch, rounds_done - resumed_after, logs, resumed_after)
            ctx.callbacks.on_epoch_end(epoch, logs)
            ctx.checkpoints.after_epoch(epoch, last=epoch == plan.epochs - 1 or self.model.stop_training)
            if self.model.stop_training:
                break
        return logs

    def _validate(self, plan: "_FitPlan", ctx: "_FitContext", logs: Dict[str, float]) -> Dict[str, float]:
        """An epoch's ``logs`` with the validation data's (``val_*``) added; ``logs`` itself without validation data."""
        if plan.val is None:
            return logs
        val_logs = self._evaluate_staged(ctx.transport, plan.val, ctx.rounds.settings.spec, plan.spec.fingerprint,
                                         plan.num_workers, self.config.batch_size)
        return {**logs, **{f"val_{k}": v for k, v in val_logs.items()}}

    def _fit_params(self, plan: "_FitPlan", ctx: "_FitContext") -> Dict[str, Any]:
        """:attr:`FitInfo.params`: the options, ``fit``'s, and what this fit resolved, flat and JSON-able."""
        import keras
        import pyspark

        from ...version import __version__

        def flat(value: Any) -> Any:
            if value is None or isinstance(value, (bool, int, float, str)):
                return value
            return json.dumps(value, sort_keys=True, default=str)

        settings, engine = ctx.rounds.settings, plan.engine
        params = {o.name: getattr(self.config, o.name) for o in of(TRAINER)}
        params.update(update_rule=plan.rule.describe(), averaging_frequency=plan.schedule.describe(), seed=self._seed,
                      preprocess=self._preprocess.name if self._preprocess is not None else None)
        params.update(epochs=plan.epochs, initial_epoch=plan.initial_epoch, shuffle=plan.shuffle,
                      features_col=plan.features_col, label_col=plan.label_col,
                      checkpoint_dir=plan.checkpoint_dir, checkpoint_every=plan.checkpoint_every)
        params.update(
            num_workers=settings.num_workers,
            num_examples=settings.dataset.num_examples,
            validation_examples=plan.val.num_examples if plan.val is not None else None,
            epoch_steps=settings.epoch_steps,
            transport=ctx.transport.name,
            master=engine.master,
            spark_connect=engine.connect,
            spark_version=engine.spark.version,
            model=self.model.name,
            model_parameters=int(self.model.count_params()),
            sparkdl_avg_version=__version__,
            keras_version=keras.__version__,
            pyspark_version=pyspark.__version__,
        )
        return {k: flat(v) for k, v in params.items()}

    def _warn_if_slow(self, settings: RoundSettings, last: bool) -> bool:
        """Warns when this fit is slower than one process would be (``slow_warning``); returns whether it decided.

        It decides after the first epoch that brings the fit's steady rounds
        (no replica build, no first trace: :func:`~sparkdl_avg.driver.observe.costmodel.is_cold`)
        to :data:`~sparkdl_avg.driver.observe.costmodel.WARM_ROUNDS`, or after the ``last``
        epoch with what there is (no steady round: no warning).
        """
        from ..observe.costmodel import WARM_ROUNDS, is_cold, slower_than_one_process

        records = self.stats.records  # this fit's
        if not last and sum(not is_cold(r) for r in records) < WARM_ROUNDS:
            return False
        message = slower_than_one_process(records, settings.dataset.num_examples, settings.num_workers,
                                          settings.batch_size)
        if message:
            logger.warning(message)
        return True

    @property
    def update_rule_state(self) -> Dict[str, Any]:
        """The update rule's description and state (e.g. BMUF's ``Δ``, float64 arrays per trainable weight)."""
        return {"rule": self._rule_state.key, "state": self._rule_state.state}

    def _train_epoch(self, ctx: "_FitContext", epoch: int, logs: Dict[str, float], begin) -> Tuple[Dict[str, float], int]:
        """Runs the rounds of one epoch; returns the epoch's logs and the rounds run.

        ``logs`` (the previous epoch's, ``{}`` at the start of a fit) is what
        the schedule sees before the epoch's first round. ``begin``: a
        checkpoint of this epoch to continue from, or ``None``.
        """
        epoch_result: Optional[PartialResult] = None
        steps_before = 0
        rounds_done = 0
        position = 0  # elastic rounds: the examples of the epoch its rounds have taken (all workers)
        if begin is not None:
            steps_before, rounds_done, position = begin.steps_done, begin.rounds_done, begin.meta.position
            if begin.meta.epoch_examples:
                epoch_result = PartialResult(begin.meta.epoch_examples, metric_sums=begin.meta.epoch_metric_sums)
                logs = epoch_result.metric_means()
        if ctx.stale is not None:
            first = len(self.stats.records)
            change = self._replan_epoch(ctx, epoch, rounds_done) if ctx.membership is not None else None
            done = ctx.stale.run_epoch(epoch, logs, rounds_done, steps_before, epoch_result,
                                       self._chunk_hooks(ctx, epoch))
            if change is not None and len(self.stats.records) > first:
                self.stats.records[first].membership = change.to_json()
            return done
        s = ctx.rounds.settings
        while True:
            rnd = rounds_done
            if ctx.membership is None:
                workers, change, start = s.num_workers, None, None
                left = ctx.epoch_steps - steps_before
            else:  # the next n·k·B positions of the epoch, for the n workers that have slots now
                workers, change = ctx.membership.plan(epoch, rnd)
                start = position
                left = (s.dataset.num_examples - position) // (workers * s.batch_size)
            if left <= 0:
                break
            steps = self._round_steps(ctx, epoch, rnd, left, logs)
            if change is not None:
                ctx.membership.commit(change)
            if ctx.membership is None:
                epoch_may_end = steps_before + steps >= ctx.epoch_steps
            else:  # the next round's workers are not known yet: the most it may have
                epoch_may_end = (s.dataset.num_examples - position - workers * steps * s.batch_size
                                 < ctx.membership.max_workers * s.batch_size)
            ctx.callbacks.on_train_batch_begin(rnd)
            result = ctx.rounds.run(epoch, rnd, steps_before, steps, workers, start,
                                    change.to_json() if change is not None else None,
                                    share=ctx.checkpoints.may_save_after(ctx.rounds_in_fit + 1, epoch_may_end))
            steps_before += steps
            position += workers * steps * s.batch_size
            rounds_done += 1
            ctx.rounds_in_fit += 1
            epoch_result = merge(epoch_result, PartialResult(result.examples, metric_sums=result.metric_sums))
            logs = epoch_result.metric_means()
            ctx.checkpoints.after_round(ctx.rounds_in_fit, epoch, rounds_done, steps_before, epoch_result,
                                        position if ctx.membership is not None else 0)
            record = self.stats.records[-1]
            if ctx.membership is not None:
                ctx.membership.round_done(record)
            # the bar counts a full-size round's minibatches: an elastic round of fewer workers moves it less
            ctx.progress.round_end(record, logs, steps * workers / s.num_workers if start is not None else None)
            ctx.callbacks.on_train_batch_end(rnd, logs)
            if self.model.stop_training:
                break
        return logs, rounds_done

    def _replan_epoch(self, ctx: "_FitContext", epoch: int, rnd: int) -> Optional[Change]:
        """Elastic stale/async epochs: the epoch's workers, planned at its start (its chunks keep them); the change."""
        workers, change = ctx.membership.plan(epoch, rnd)
        if change is not None:
            ctx.membership.commit(change)
        s = ctx.rounds.settings
        epoch_steps = steps_per_epoch(s.dataset.num_examples, workers, s.batch_size)
        ctx.rounds.settings = dataclasses.replace(s, num_workers=workers, epoch_steps=epoch_steps)
        ctx.epoch_steps = epoch_steps
        if ctx.feedback is not None:
            ctx.feedback.resize(workers)
        return change

    @staticmethod
    def _round_steps(ctx: "_FitContext", epoch: int, rnd: int, left: int, logs: Dict[str, float]) -> int:
        """Minibatches per worker of round ``rnd``: the schedule's ``k``, cut to the ``left`` the epoch has."""
        k = next_period(ctx.schedule, epoch, rnd, logs, sys.maxsize)  # checked, not yet cut to the epoch
        if k > ctx.epoch_steps and not ctx.capped_warned:
            ctx.capped_warned = True
            s = ctx.rounds.settings
            _warn_capped(k, ctx.epoch_steps, s.dataset.num_examples, s.num_workers, s.batch_size)
        return min(k, left)

    def _chunk_hooks(self, ctx: "_FitContext", epoch: int) -> EpochHooks:
        """What an epoch of chunks (:mod:`sparkdl_avg.driver.fit.stale_async`) calls: the schedule, progress and Keras' batch hooks."""

        def block_end(block: int, logs: Dict[str, float]) -> bool:
            ctx.rounds_in_fit += 1
            ctx.callbacks.on_train_batch_end(block, logs)
            return bool(self.model.stop_training)

        return EpochHooks(
            next_steps=lambda rnd, steps_before, logs: self._round_steps(ctx, epoch, rnd, ctx.epoch_steps - steps_before,
                                                                         logs),
            chunk_end=lambda record, logs, steps: ctx.progress.round_end(record, logs, steps),
            block_begin=ctx.callbacks.on_train_batch_begin,
            block_end=block_end,
        )

    # ------------------------------------------------------------- evaluate

    def _transport(self, engine, name: str, num_workers: int):
        """A :class:`~sparkdl_avg.driver.transport.paths.StateTransport` from the options, its files under ``name``."""
        from ...shared.wire.delta_sums import DeltaLayout, first_moments
        from ...shared.wire.exchange import FlatLayout

        cfg = self.config
        weights, opt = get_state(self.model)
        optimizer_sums = cfg.optimizer_state == "average"  # what the workers' sums hold
        layout = FlatLayout.of(weights, opt if optimizer_sums else None)
        moments = first_moments(self.model.optimizer.variables)
        if cfg.update_compression:  # what a worker sends is then its compressed delta
            layout = DeltaLayout(layout, cfg.update_compression, cfg.feedback, moments)
        return transport_mod.choose(cfg.state_transport, engine, self._staging_root, name, cfg.aggregation_depth,
                                    cfg.aggregation, cfg.aggregation_shards, num_workers, layout.nbytes,
                                    cfg.network_rate, optimizer_sums=optimizer_sums,
                                    compression=cfg.update_compression, feedback=cfg.feedback, moments=moments,
                                    # a standing job holds every slot: elastic rounds' probe jobs would wait on it
                                    standing=not (cfg.elastic and probes(engine)))

    def _evaluate_staged(self, transport, staged: StagedDataset, spec, fingerprint, parts, batch_size) -> Dict[str, float]:
        with transport.engine.labels("sparkdl_avg evaluate"):
            result = transport.evaluate(spec, fingerprint, staged, parts, batch_size, get_state(self.model))
        return result.metric_means()

    def evaluate(
        self,
        data,
        features_col: str = "features",
        label_col: str = "label",
        batch_size: Optional[int] = None,
        return_dict: bool = False,
        sample_weight_col: Optional[str] = None,
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
            sample_weight_col: DataFrame column of each example's weight, as
                Keras' ``sample_weight`` (numpy data: pass ``(x, y,
                sample_weight)``). Default ``None``.

        Returns:
            Like ``keras.Model.evaluate``: the loss alone when the model has no
            metrics, else ``[loss, metric, ...]`` (or a dict).
        """
        check_loss(self.model, "evaluate")
        if not isinstance(return_dict, bool):  # "False" would be truthy
            raise ConfigurationError(f"The 'return_dict' parameter must be True or False. Got {return_dict!r} instead.")
        if batch_size is not None:
            TrainerConfig(batch_size=batch_size)  # the same check as the trainer's
        data = known_data(data, "evaluation")
        engine = engine_for(data)
        spec = ModelSpec.from_model(self.model)  # refuses unshippable custom objects before any job
        require("sample_weight_col", sample_weight_col, Text("a column name"))
        staged = self._stage(data, features_col, label_col, "evaluation", sample_weight_col)
        parts = self.config.num_workers or engine.default_parallelism
        transport = self._transport(engine, f"evaluate-{uuid.uuid4().hex[:8]}", parts)
        try:
            logs = self._evaluate_staged(
                transport, staged, transport.ship_spec(spec), spec.fingerprint, parts, batch_size or self.config.batch_size
            )
        finally:
            transport.close()
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
        :func:`sparkdl_avg.driver.data.inference.add_predictions`.

        Args:
            data: Spark DataFrame with the features column.
            features_col: Features column, as in :meth:`fit`. Default ``"features"``.
            prediction_col: Output column. Default ``"prediction"``.
            probability_col: Output column for classifiers; ``None`` omits it.
            batch_size: Examples per ``predict_on_batch`` call. Default 1024.
        """
        from ..data.inference import PredictCache, add_predictions

        require("batch_size", batch_size, Ints(1))
        if self._predict_cache is None:
            self._predict_cache = PredictCache()
        return add_predictions(data, self.model, features_col, prediction_col, probability_col, batch_size,
                               preprocess=self._preprocess, cache=self._predict_cache)

    def write_report(self, path: str, title: Optional[str] = None) -> str:
        """Writes the HTML training report of the latest fit (see :mod:`sparkdl_avg.driver.observe.report`).

        Args:
            path: Output ``.html`` file (replaced atomically).
            title: Page title. Default: names the model.

        Returns:
            ``path``.
        """
        from ..observe.report import write_report

        if self.history is None:
            raise NotFittedError("write_report() needs a completed fit(); call fit() first.")
        return write_report(
            path,
            self.stats.records,
            self.history.history,
            title=title or f"sparkdl_avg training report: {self.model.name}",
        )


COLD_START_NOTE_S = 0.5
"""The seconds of TensorFlow imports in one new executor Python worker from which
a fit says what would remove them (:func:`_note_cold_start`)."""

_cold_start_noted: set = set()  # the Spark applications (Engine.key) told already


def _check_classes(class_weight: dict, checks) -> None:
    """Refuses ``class_weight`` keys that are not classes of the model's classification loss (they would never apply)."""
    shape = checks.label_shapes[0] if checks is not None and checks.label_shapes else None
    if shape is None or shape.kind not in ("sparse", "categorical", "binary"):
        return
    classes = 2 if shape.kind == "binary" and shape.units == 1 else shape.units
    if shape.kind == "binary" and shape.units > 1:
        return  # multi-label: Keras' class_weight does not apply per unit
    unknown = [k for k in class_weight if not 0 <= int(k) < classes]
    if unknown:
        raise ConfigurationError(
            f"The 'class_weight' parameter names class {unknown[0]!r}, which the model does not have: its loss "
            f"{shape.loss!r} takes classes 0..{classes - 1}, so that weight would never apply. Got "
            f"class_weight={class_weight!r} instead."
        )


def _note_cold_start(engine, records) -> None:
    """Says once per application what the fit's new Python workers spent importing TensorFlow, and what removes it.

    On a session without :data:`~sparkdl_avg.driver.runtime.session.RECOMMENDED_CONF` (a
    notebook attached to a cluster someone else configured) every new
    worker imports TensorFlow itself before its first task: seconds the
    first fit waits, measured by the workers (``WorkerRecord.import_s``).
    Workers forked from :mod:`sparkdl_avg.daemon` report 0.
    """
    seconds = [w.import_s for r in records for w in r.workers if w.import_s > 0]
    if not seconds or max(seconds) < COLD_START_NOTE_S or engine.key in _cold_start_noted:
        return
    _cold_start_noted.add(engine.key)
    logger.warning(
        "This fit waited about %.1f s for new executor Python workers to import TensorFlow (%d workers, %.1f s "
        "in all). Start the session with .config(map=sparkdl_avg.RECOMMENDED_CONF) (spark.python.daemon.module="
        "sparkdl_avg.daemon: workers are forked with TensorFlow imported; under Spark Connect, in the server's "
        "config) and call sparkdl_avg.warm_up(spark) right after it: README, \"Warm executors\". "
        "Silence this with slow_warning=False.",
        max(seconds), len(seconds), sum(seconds),
    )


def _warn_capped(k: int, epoch_steps: int, num_examples: int, num_workers: int, batch_size: int) -> None:
    """Warns that rounds of ``k`` minibatches are cut to the ``epoch_steps`` an epoch has."""
    logger.warning(
        "averaging_frequency=%d is more than the %d minibatches each worker trains per epoch (%d examples // "
        "(%d workers * batch_size %d)); rounds are cut to the epoch, so the effective averaging_frequency is "
        "%d (one round per epoch) and any larger value trains the same model.",
        k, epoch_steps, num_examples, num_workers, batch_size, epoch_steps,
    )


def _has_column(data, column: Optional[str]) -> bool:
    """Whether ``data`` is a DataFrame with ``column``."""
    return column is not None and get_data_adapter(data).has_column(column)


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
