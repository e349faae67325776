"""Checkpoints of a fit: everything needed to continue it exactly, written atomically.

A checkpoint directory (``fit(checkpoint_dir=...)``, a local path or any
``pyarrow.fs`` URI: HDFS, S3, ...) holds complete checkpoints in
subdirectories ``ckpt-<sequence>`` and a ``LATEST`` file naming the newest.
A checkpoint is two files:

- ``arrays.npz``: the global weights, the optimizer's variables and the
  update rule's state (e.g. BMUF's ``Δ``), read with ``allow_pickle=False``;
- ``meta.json``: format version, position (epoch, rounds and minibatches
  done in it), the partial epoch's metric sums, the history of finished
  epochs, the seed, the configuration, the update rule and schedule (with
  AdaComm's state), the model's fingerprint and the number of examples.

Writing: the new checkpoint is written completely under its own name, then
``LATEST`` is replaced (every file is written with
:func:`sparkdl_avg.fs.write_atomically`: to a temporary name, then moved; on
object stores such as S3 in one upload, which appears whole, and ``LATEST``
still only after the checkpoint is complete), and only then are older
checkpoints deleted. A crash
at any moment leaves ``LATEST`` naming a complete checkpoint, except on HDFS,
where replacing a file is delete + rename: a crash in between leaves no
``LATEST``, and :func:`latest` then takes the newest checkpoint whose
``meta.json`` (written last) exists. No pickle anywhere.
"""

from __future__ import annotations

import dataclasses
import io
import json
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np
import pyarrow.fs as pafs

from . import fs
from .errors import ConfigurationError
from .fs import join

FORMAT_VERSION = 1
LATEST = "LATEST"
ARRAYS = "arrays.npz"
META = "meta.json"
PREFIX = "ckpt-"


@dataclass
class RunMeta:
    """What a checkpoint records about its run besides arrays and position (``meta.json``'s other keys).

    Attributes:
        seed: The run's seed (data order).
        run: The settings a resumed run must match (model signature, data
            size, workers, batch size, optimizer state, update rule,
            schedule, shuffle); see :func:`check_compatible`.
        schedule_state: The averaging schedule's state (AdaComm's).
        epoch_examples: Examples trained in the partial epoch (0 at an epoch's start).
        epoch_metric_sums: Example-weighted metric sums of the partial epoch.
        history: The finished epochs' logs, name → one value per epoch.
        tracking: What the fit's trackers need to continue after a resume
            (JSON-able; :class:`sparkdl_avg.tracking.MlflowLogger` keeps its run id there).
    """

    seed: int
    run: Dict[str, Any] = field(default_factory=dict)
    schedule_state: Dict[str, Any] = field(default_factory=dict)
    epoch_examples: int = 0
    epoch_metric_sums: Dict[str, float] = field(default_factory=dict)
    history: Dict[str, List[float]] = field(default_factory=dict)
    tracking: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Checkpoint:
    """The state of a fit between two rounds.

    Attributes:
        epoch: The epoch in progress (0-based).
        rounds_done: Rounds of ``epoch`` already trained.
        steps_done: Minibatches per worker of ``epoch`` already trained.
        weights: Global weights (``model.get_weights()`` order).
        optimizer: Optimizer variables (``optimizer.variables`` order).
        rule_state: The update rule's state, name → arrays.
        meta: The run's seed, settings, schedule state, partial epoch and history.
    """

    epoch: int
    rounds_done: int
    steps_done: int
    weights: List[np.ndarray]
    optimizer: List[np.ndarray]
    rule_state: Dict[str, List[np.ndarray]] = field(default_factory=dict)
    meta: RunMeta = field(default_factory=lambda: RunMeta(seed=0))


def _json_default(value: Any) -> Any:
    """numpy scalars (a seed given as ``np.int64``) as Python numbers."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _entries(directory: str) -> List[str]:
    """The names in the checkpoint directory; none if it does not exist yet."""
    filesystem, path = fs.resolve(directory)
    info = filesystem.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        return []
    if info.type != pafs.FileType.Directory:
        raise ConfigurationError(
            f"The 'checkpoint_dir' parameter must name a directory. Got {path!r}, a file, instead."
        )
    return [i.base_name for i in filesystem.get_file_info(pafs.FileSelector(path))]


def latest(directory: str) -> Optional[str]:
    """The URI of the newest complete checkpoint in ``directory``, or ``None`` if it holds none.

    Raises:
        ConfigurationError: ``directory`` is a file, or holds files that are
            not checkpoints (so it is not ours to write into).
    """
    names = _entries(directory)
    if not names:
        return None
    if LATEST not in names:
        foreign = sorted(n for n in names if not n.startswith((PREFIX, fs.TEMP_PREFIX)))
        if foreign:
            raise ConfigurationError(
                f"The 'checkpoint_dir' parameter must be an empty or new directory, or one holding "
                f"sparkdl_avg checkpoints. Got {directory!r}, which holds {foreign[:5]}, instead."
            )
        # LATEST can be missing for a moment where replacing a file is delete + rename (HDFS):
        # the newest checkpoint whose meta.json (written last) exists is complete.
        for name in sorted((n for n in names if n.startswith(PREFIX)), reverse=True):
            if fs.exists(join(join(directory, name), META)):
                return join(directory, name)
        return None
    name = fs.read_bytes(join(directory, LATEST)).decode().strip()
    return join(directory, name)


def save(directory: str, checkpoint: Checkpoint, keep: int = 1) -> str:
    """Writes ``checkpoint`` into ``directory`` atomically; returns its URI.

    Args:
        directory: Checkpoint directory (local path or ``pyarrow.fs`` URI).
        checkpoint: What to write.
        keep: Complete checkpoints to keep (the newest ``keep``). Default 1.
    """
    existing = sorted(n for n in _entries(directory) if n.startswith(PREFIX))
    sequence = int(existing[-1][len(PREFIX) :]) + 1 if existing else 0
    name = f"{PREFIX}{sequence:06d}"
    target = join(directory, name)

    arrays: Dict[str, np.ndarray] = {}
    for i, w in enumerate(checkpoint.weights):
        arrays[f"weights/{i}"] = np.asarray(w)
    for i, v in enumerate(checkpoint.optimizer):
        arrays[f"optimizer/{i}"] = np.asarray(v)
    for key, values in checkpoint.rule_state.items():
        for i, v in enumerate(values):
            arrays[f"rule/{key}/{i}"] = np.asarray(v)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    fs.write_atomically(join(target, ARRAYS), buffer.getvalue())
    meta = {
        **dataclasses.asdict(checkpoint.meta),
        "format_version": FORMAT_VERSION,
        "created": time.time(),
        "epoch": checkpoint.epoch,
        "rounds_done": checkpoint.rounds_done,
        "steps_done": checkpoint.steps_done,
        "num_weights": len(checkpoint.weights),
        "num_optimizer_variables": len(checkpoint.optimizer),
        "rule_state_sizes": {k: len(v) for k, v in checkpoint.rule_state.items()},
    }
    # meta.json last: latest() takes a checkpoint whose meta.json exists as complete.
    fs.write_atomically(join(target, META), json.dumps(meta, indent=1, sort_keys=True, default=_json_default).encode())

    # The commit point: LATEST names the new checkpoint only once it is complete.
    fs.write_atomically(join(directory, LATEST), name.encode())
    for old in existing[: max(0, len(existing) + 1 - keep)]:
        fs.remove_tree(join(directory, old))
    return target


def load(uri: str) -> Checkpoint:
    """Reads the checkpoint at ``uri`` (a ``ckpt-*`` directory, as :func:`latest` returns).

    Raises:
        ConfigurationError: missing files or another format version.
    """
    try:
        meta = json.loads(fs.read_bytes(join(uri, META)))
        data = fs.read_bytes(join(uri, ARRAYS))
    except (FileNotFoundError, OSError) as exc:
        raise ConfigurationError(f"No complete sparkdl_avg checkpoint at {uri!r}: {exc}") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise ConfigurationError(
            f"The checkpoint at {uri!r} has format version {meta.get('format_version')!r}; this "
            f"version of sparkdl_avg reads version {FORMAT_VERSION}."
        )
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    rule_state = {
        key: [arrays[f"rule/{key}/{i}"] for i in range(n)] for key, n in meta["rule_state_sizes"].items()
    }
    return Checkpoint(
        epoch=meta["epoch"],
        rounds_done=meta["rounds_done"],
        steps_done=meta["steps_done"],
        weights=[arrays[f"weights/{i}"] for i in range(meta["num_weights"])],
        optimizer=[arrays[f"optimizer/{i}"] for i in range(meta["num_optimizer_variables"])],
        rule_state=rule_state,
        meta=RunMeta(**{f.name: meta[f.name] for f in dataclasses.fields(RunMeta) if f.name in meta}),
    )


def check_compatible(uri: str, saved: Dict[str, Any], current: Dict[str, Any]) -> None:
    """Raises ``ConfigurationError`` naming every setting in which ``current`` differs from ``saved``."""
    differences = [
        f"{key}: checkpoint {saved.get(key)!r}, now {value!r}"
        for key, value in current.items()
        if saved.get(key) != value
    ]
    if differences:
        raise ConfigurationError(
            f"Cannot resume from the checkpoint at {uri!r}: it was made with another "
            f"configuration ({'; '.join(differences)}). Resume with the same model, data and "
            "settings, or start a new run in an empty checkpoint_dir."
        )
