"""The public API of the library: ``ParameterAveragingTrainer``.

This module owns what a user calls — ``fit``, ``evaluate``, ``predict``, ``write_report`` — and ``fit``'s steps before
its first round: the checks, the data staged (once per trainer and data), the checkpoint to resume from. The epochs are
:mod:`sparkdl_avg.driver.fit.loop`'s; one round is :mod:`sparkdl_avg.driver.fit.rounds`'s; how state moves is
:mod:`sparkdl_avg.driver.transport`'s; checkpoint policy is :mod:`sparkdl_avg.driver.checkpoint.policy`'s; what
executors run is :mod:`sparkdl_avg.executor.worker`'s.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
import uuid
import weakref
from functools import partial
from typing import Any, Dict, List, Optional, Tuple

from ...errors import ConfigurationError, NotFittedError
from ...shared.data.preprocess import Preprocess
from ...shared.data.staged_dataset import StagedDataset
from ...shared.errors import interrupt
from ...shared.files.fs import check_writable, join
from ...shared.files.uris import user_path
from ...shared.model.modelspec import (
    ModelSpec,
    check_model_loads,
    get_state,
    input_dtypes,
    input_shapes,
    inputs_dtype,
)
from ...shared.wire.stats import PeakMemory, TrainingStats
from ..observe.memory import check_memory
from ..algorithms.rules import RuleState
from ..checkpoint import policy as resume_mod
from ..config.codegen import constructor, document, trainer_entries
from ..config.options import Ints, Text, require
from ..config.trainer_config import TrainerConfig, check_fit_args, check_loss, check_with_model, validate_model
from ..data import staging
from ..data.adapters import engine_for, known_data
from ..data.staging_roots import StagingRoot
from ..elastic.membership import probes
from ..fit import loop
from ..fit.plan import FitInfo, FitPlan, check_classes, fit_params, fit_workers, run_settings
from ..fit.plan import epoch_steps as plan_steps
from ..transport import link_rate
from ..transport import policy as transport_mod
from ..transport.base import TransportSettings

logger = logging.getLogger("sparkdl_avg")


class ParameterAveragingTrainer:
    """Trains a compiled Keras model on Spark by synchronous parameter averaging.

    The options after ``model`` are the rows of the options table (``sparkdl_avg.driver.config.options``, the fields of
    ``TrainerConfig``), taken by keyword or, in this order, by position.

    Args:
        model: A compiled ``keras.Model`` with one input and one output and a
            known input shape. It is trained in place: after ``fit`` it holds
            the averaged weights (also available as ``trainer.model``).

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

        With ``local[N]`` or ``local-cluster`` every executor runs as this user on this host, so nobody else needs the
        staged data or the exchanged weights under it. On other masters a local path (a shared mount) keeps the umask's
        modes: executors may run as another user (YARN's, a standalone worker's) and would be locked out. URIs keep
        their filesystem's permissions. See docs/reliability.md. On such masters a local root must be one the executors
        see (:func:`sparkdl_avg.driver.data.staging.check_shared_root`), or a fit on hosts whose ``/tmp`` differ fails
        late, reading staged data written on another host. Making a local root also removes the roots that killed
        drivers left beside it (:mod:`sparkdl_avg.driver.data.staging_roots`).
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
        started = time.time()
        callbacks = _callbacks(callbacks)
        memory = PeakMemory()  # the driver's peak above its level now: trainer.stats.driver_peak_memory
        plan = self._plan(data, validation_data, epochs, features_col, label_col, verbose, shuffle, checkpoint_dir,
                          checkpoint_every, resume, initial_epoch, sample_weight_col,
                          class_weight)  # every check before any Spark job; data staged
        ctx = self._start(plan, loop.callback_list(self.model, plan, callbacks))
        self.stats.started = started  # stats.startup: the first round's end from here
        observers = [cb for cb in callbacks or () if callable(getattr(cb, "on_fit_begin", None))]
        info = FitInfo(
            trainer=self,
            # under Connect spark.version is a round trip: only when someone asks
            params=fit_params(self.config, self.model, plan, ctx.rounds.settings, ctx.transport, self._seed,
                              self._preprocess) if observers else {},
            epochs=plan.epochs,
            start_epoch=plan.start_epoch,
            resumed_from=plan.resumed_from,
            tracking=ctx.checkpoints.tracking,
        )
        fit_loop = loop.FitLoop(self.model, plan, ctx, observers, partial(self._validate, plan, ctx),
                                self.config.slow_warning, self._retransport(plan))
        self.model.stop_training = False
        try:
            with interrupt.cancelling(plan.engine, ctx.group), ctx.labels:  # Ctrl-C: KeyboardInterrupt, the group cancelled
                fit_loop.run(info, on_trained=lambda: setattr(self, "history", self.model.history))
        finally:
            self.stats.driver_peak_memory = memory.above()
        return self.model.history

    def _plan(self, data, validation_data, epochs: int, features_col, label_col, verbose, shuffle: bool,
              checkpoint_dir: Optional[str], checkpoint_every: Any, resume: Any, initial_epoch: int,
              sample_weight_col: Optional[str] = None, class_weight: Optional[dict] = None) -> FitPlan:
        """``fit``'s steps before its first round; returns the :class:`~sparkdl_avg.driver.fit.plan.FitPlan`.

        In this order: the checks (before any Spark job), the checkpoint to resume from located, the data staged, the
        settings, and the checkpoint restored into the model.
        """
        verbose = self._check_fit_args(epochs, initial_epoch, verbose, shuffle, checkpoint_dir, checkpoint_every, resume,
                                       sample_weight_col, class_weight)
        checkpoint_dir, resume = user_path(checkpoint_dir), resume if isinstance(resume, bool) else user_path(resume)
        data = known_data(data, "training")  # a user's container converted once; pandas refused
        validation_data = None if validation_data is None else known_data(validation_data, "validation")
        engine = engine_for(data)
        cfg = self.config
        engine.check_options(cfg)
        socket = transport_mod.round_socket(cfg.overlap_rounds, cfg.standing_rounds, engine.connect, engine.one_host,
                                            transport_mod.local_staging(self._staging_root))
        transport_mod.check_standing_rounds(cfg.standing_rounds, engine.connect, socket,
                                            None if engine.sc is None else engine.sc.getConf())
        num_workers = fit_workers(self.config, engine)
        # From the variables' shapes, before anything model-sized is built (the spec, the model rebuilt to check it,
        # the optimizer's slots): a fit that cannot fit is refused in seconds, with the memory there was to start.
        check_memory(self.model, engine, num_workers, self.config.optimizer_state == "average",
                     self.config.optimizer_state == "local")
        checkpoint_uri, saved = resume_mod.locate(checkpoint_dir, resume)  # read and verified
        spec = ModelSpec.from_model(self.model)
        check_model_loads(spec)
        train, val, staging_s = self._stage_fit_data(data, validation_data, features_col, label_col,
                                                     sample_weight_col, class_weight)
        epoch_steps = plan_steps(self.config, train, num_workers)
        schedule = cfg.schedule()
        rule = cfg.rule(num_workers)
        self._rule_state.ensure(rule, self.model)
        plan = FitPlan(
            epochs=epochs, initial_epoch=initial_epoch, features_col=features_col, label_col=label_col,
            verbose=verbose, shuffle=shuffle, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
            engine=engine, num_workers=num_workers, spec=spec, train=train, val=val, staging_s=staging_s,
            epoch_steps=epoch_steps, schedule=schedule, rule=rule,
            run_settings=run_settings(cfg, self.model, train, num_workers, rule, schedule, shuffle),
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
            check_classes(class_weight, staging.data_checks(self.model))
        if checkpoint_dir is not None:  # before any job: not after an epoch of training
            check_writable(user_path(checkpoint_dir), "The 'checkpoint_dir' parameter")
        return verbose

    def _stage_fit_data(self, data, validation_data, features_col, label_col, sample_weight_col=None,
                        class_weight=None) -> Tuple[StagedDataset, Optional[StagedDataset], float]:
        """Stages the training and validation data; returns them and the seconds it took (``TrainingStats.staging_s``).

        The validation data is weighted by ``sample_weight_col`` when it has the column (as Keras weighs
        ``validation_data`` given with weights); ``class_weight`` applies to the training data only, as in Keras.
        """
        staging_started = time.perf_counter()
        train = self._stage(data, features_col, label_col, "training", sample_weight_col)
        if class_weight is not None:
            train = dataclasses.replace(train, class_weight=tuple(sorted((int(k), float(v))
                                                                         for k, v in class_weight.items())))
        val = None
        if validation_data is not None:
            val = self._stage(validation_data, features_col, label_col, "validation",
                              staging.validation_weight_col(validation_data, sample_weight_col))
        return train, val, time.perf_counter() - staging_started

    def _start(self, plan: FitPlan, callbacks) -> loop.FitContext:
        """Starts the fit's record (``trainer.stats``), job group and transport; returns what its epochs share."""
        # trainer.stats and trainer.history describe the latest fit (as keras.Model.fit's History does)
        self.stats = TrainingStats(staging_s=plan.staging_s, staged_bytes=plan.train.nbytes,
                                   validation_staged_bytes=plan.val.nbytes if plan.val is not None else 0)
        self.history = None
        self._fits += 1
        group = f"sparkdl_avg-fit-{id(self):x}-{self._fits}"
        labels = plan.engine.labels(f"sparkdl_avg fit {self._fits} of model {self.model.name!r}", group=group)
        transport = self._transport(plan.engine, f"exchange-{self._fits}", plan.num_workers)
        return loop.start(self.config, self.model, plan, callbacks, stats=self.stats, transport=transport,
                          rule_state=self._rule_state, seed=self._seed,
                          exchange=join(self._staging_root, f"exchange-{self._fits}"), group=group, labels=labels)

    def _validate(self, plan: FitPlan, ctx: loop.FitContext, staged: StagedDataset) -> Dict[str, float]:
        """The validation data's logs on the model's weights now (without the ``val_`` prefix)."""
        return self._evaluate_staged(ctx.transport, staged, ctx.rounds.settings.spec, plan.spec.fingerprint,
                                     plan.num_workers, self.config.batch_size)

    @property
    def update_rule_state(self) -> Dict[str, Any]:
        """The update rule's description and state (e.g. BMUF's ``Δ``, float64 arrays per trainable weight)."""
        return {"rule": self._rule_state.key, "state": self._rule_state.state}

    # ------------------------------------------------------------- evaluate

    def _transport(self, engine, name: str, num_workers: int, mode: Optional[str] = None,
                   rate: Optional[float] = None):
        """A :class:`~sparkdl_avg.driver.transport.base.StateTransport` from the options, its files under ``name``.

        ``mode``, ``rate``: the transport and link rate (bytes/s) ``"auto"`` re-chose from the rounds'
        measurements (:class:`~sparkdl_avg.driver.fit.hooks.TransportChoice`); default: the options'.
        """
        # a standing job holds every slot: elastic rounds' probe jobs would wait on it
        settings = TransportSettings.of(self.config, self.model, num_workers,
                                        standing=not (self.config.elastic and probes(engine)))
        if mode is not None:
            settings = dataclasses.replace(settings, mode=mode, network_rate=rate)
        return transport_mod.choose(settings, engine, self._staging_root, name)

    def _retransport(self, plan: FitPlan):
        """What :class:`~sparkdl_avg.driver.fit.hooks.TransportChoice` builds with, where ``"auto"`` learns the link's rate."""
        cfg, engine = self.config, plan.engine
        if not link_rate.learns(cfg.state_transport, cfg.network_rate, cfg.aggregation, cfg.synchronization,
                                engine.connect, engine.one_host):
            return None
        fit, switches = self._fits, iter(range(1, 1 << 30))
        return (lambda name, rate: self._transport(engine, f"exchange-{fit}/switch-{next(switches)}",
                                                   plan.num_workers, name, rate),
                link_rate.assumed_rate())

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

        Each of ``num_workers`` tasks evaluates a contiguous part of the staged data; results are example-weighted, so
        mean-type metrics (loss, accuracy, MAE, ...) equal ``model.evaluate`` on the same data.

        Args:
            data: Same kinds as in :meth:`fit`.
            features_col: DataFrame features column. Default ``"features"``.
            label_col: DataFrame label column. Default ``"label"``.
            batch_size: Examples per evaluation minibatch. Default: the trainer's ``batch_size``.
            return_dict: Return ``{name: value}`` instead of a list.
            sample_weight_col: DataFrame column of each example's weight, as Keras' ``sample_weight`` (numpy data: pass
                ``(x, y, sample_weight)``). Default ``None``.

        Returns:
            Like ``keras.Model.evaluate``: the loss alone when the model has no metrics, else ``[loss, metric, ...]``
            (or a dict).
        """
        check_loss(self.model, "evaluate")
        if not isinstance(return_dict, bool):  # "False" would be truthy
            raise ConfigurationError(f"The 'return_dict' parameter must be True or False. Got {return_dict!r} instead.")
        if batch_size is not None:
            TrainerConfig(batch_size=batch_size)  # the same check as the trainer's
        data = known_data(data, "evaluation")
        engine = engine_for(data)
        spec = ModelSpec.from_model(self.model)  # refuses unshippable custom objects before any job
        check_model_loads(spec)  # as fit does: an unregistered custom metric is named here, not by every task
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

        DataFrame in, DataFrame out (lazily, like any transformation): every input column is kept and ``prediction_col``
        (the class index as a double for a model compiled with a cross-entropy loss, else the output value(s)) and, for
        classifiers, ``probability_col`` (a ``DenseVector`` of class probabilities) are added. See
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
            driver_peak_memory=self.stats.driver_peak_memory,
        )


def _keras_log_order(model, logs: Dict[str, float]) -> List[str]:
    """The names in ``logs`` in ``keras.Model.evaluate``'s list order.

    The loss first, then the compiled metrics in the order given to ``compile``, then anything else alphabetically
    (Keras' own rule).
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


def _callbacks(callbacks) -> Optional[list]:
    """``fit``'s ``callbacks`` as a list (one alone too, as ``keras.Model.fit`` takes), each a Keras callback instance.

    Raises:
        ConfigurationError: before any Spark job, an entry that is not a ``keras.callbacks.Callback``
            instance (a string, or the class itself: ``EarlyStopping`` for ``EarlyStopping()``).
    """
    import keras

    if callbacks is None:
        return None
    if not isinstance(callbacks, (list, tuple)):
        callbacks = [callbacks]
    for i, cb in enumerate(callbacks):
        if not isinstance(cb, keras.callbacks.Callback):
            hint = (f" (the class: call it, {cb.__name__}(...))" if isinstance(cb, type)
                    and issubclass(cb, keras.callbacks.Callback) else "")
            raise ConfigurationError(
                f"The 'callbacks' parameter must be a list of keras.callbacks.Callback instances; entry {i} is "
                f"{cb!r}{hint}. Got {callbacks!r} instead.")
    return list(callbacks)
