"""Checkpoints of a fit: everything needed to continue it exactly, written atomically.

A checkpoint directory (``fit(checkpoint_dir=...)``, a local path or any ``pyarrow.fs`` URI: HDFS, S3, ...) holds
complete checkpoints in subdirectories ``ckpt-<sequence>`` and a ``LATEST`` file naming the newest (a name of that form
only: a pointer that would lead elsewhere, such as ``../../etc``, is ignored). A checkpoint is two files:

- ``arrays.npz``: the global weights, the optimizer's variables and the update rule's state (e.g. BMUF's ``Δ``), read
  with ``allow_pickle=False``;
- ``meta.json``: format version, position (epoch, rounds and minibatches done in it), the partial epoch's metric sums,
  the history of finished epochs, the seed, the configuration, the update rule and schedule (with AdaComm's state), the
  model's fingerprint, the number of examples and the SHA-256 of ``arrays.npz``.

Reading: :func:`load` verifies a checkpoint (the checksum, the JSON, every array the meta names) and raises
:class:`~sparkdl_avg.errors.CheckpointError` naming it and the remedy when it is damaged; :func:`candidates` lists the
complete checkpoints newest first, for a resume to fall back to the previous one
(:mod:`sparkdl_avg.driver.checkpoint.policy` keeps two: the latest and the newest earlier one that verifies).

Writing: the new checkpoint is written completely under its own name and read back (:func:`load`: a checkpoint that
does not verify raises :class:`~sparkdl_avg.errors.CheckpointError`, and nothing else changes), then ``LATEST`` is
replaced (every file is written with :func:`sparkdl_avg.shared.files.fs.write_atomically`: to a temporary name, then
moved; on object stores such as S3 in one upload, which appears whole, and ``LATEST`` still only after the checkpoint
is complete), and only then are older checkpoints deleted. A crash at any moment leaves ``LATEST`` naming a complete
checkpoint, except on HDFS, where replacing a file is delete + rename: a crash in between leaves no ``LATEST``, and
:func:`latest` then takes the newest checkpoint whose ``meta.json`` (written last) exists. No pickle anywhere.

Pruning (``save(..., keep=k)``) keeps the new checkpoint and the newest ``k - 1`` earlier ones *that verify*
(:func:`load`), not merely the newest by name: after a resume that skipped a damaged checkpoint, the good one it resumed
from is kept, never the damaged one in its place. Deleted: older checkpoints, incomplete ones a crash left (no
``meta.json``), and the damaged ones newer than the kept ones, each with a warning. When fewer than ``k - 1`` earlier
checkpoints verify, no complete checkpoint is deleted (one whose read failed for a moment may still be the only
fallback); the next save with a verified predecessor removes them. With ``k > 1`` this reads each kept checkpoint back
(the new one and usually one more) at every save.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pyarrow.fs as pafs

from ...errors import CheckpointError, ConfigurationError
from ...shared.files import fs
from ...shared.files.fs import join

logger = logging.getLogger("sparkdl_avg")

FORMAT_VERSION = 1
LATEST = "LATEST"
ARRAYS = "arrays.npz"
META = "meta.json"
PREFIX = "ckpt-"
_NAME = re.compile(r"ckpt-[0-9]+")  # a checkpoint's name: what LATEST may hold


@dataclass
class RunMeta:
    """What a checkpoint records about its run besides arrays and position (``meta.json``'s other keys).

    Attributes:
        seed: The run's seed (data order).
        run: The settings a resumed run must match (model signature, data size, workers, batch size, optimizer state,
            update rule, schedule, shuffle); see :func:`check_compatible`.
        schedule_state: The averaging schedule's state (AdaComm's).
        epoch_examples: Examples trained in the partial epoch (0 at an epoch's start).
        epoch_metric_sums: Example-weighted metric sums of the partial epoch.
        history: The finished epochs' logs, name → one value per epoch.
        tracking: What the fit's trackers need to continue after a resume (JSON-able;
            :class:`sparkdl_avg.driver.observe.tracking.MlflowLogger` keeps its run id there).
        position: Elastic rounds: the examples of the partial epoch its rounds took (all workers; 0 otherwise).
        membership: Elastic rounds: the fit's changes of workers so far
            (:class:`sparkdl_avg.driver.elastic.membership.Change`, as JSON), which a resumed fit continues.
    """

    seed: int
    run: Dict[str, Any] = field(default_factory=dict)
    schedule_state: Dict[str, Any] = field(default_factory=dict)
    epoch_examples: int = 0
    epoch_metric_sums: Dict[str, float] = field(default_factory=dict)
    history: Dict[str, List[float]] = field(default_factory=dict)
    tracking: Dict[str, Any] = field(default_factory=dict)
    position: int = 0
    membership: List[Dict[str, Any]] = field(default_factory=list)


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
        feedback: Under error feedback (``update_compression``), the workers' residual files,
            ``"<rounds back>/<worker>"`` → their bytes (:meth:`sparkdl_avg.driver.transport.chains.RoundChains.export`);
            empty otherwise.
    """

    epoch: int
    rounds_done: int
    steps_done: int
    weights: List[np.ndarray]
    optimizer: List[np.ndarray]
    rule_state: Dict[str, List[np.ndarray]] = field(default_factory=dict)
    meta: RunMeta = field(default_factory=lambda: RunMeta(seed=0))
    feedback: Dict[str, bytes] = field(default_factory=dict)


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


def _names(entries: List[str]) -> List[str]:
    """The checkpoints' names among a directory's ``entries``, oldest first."""
    return sorted(n for n in entries if _NAME.fullmatch(n))


def _pointer(directory: str) -> Optional[str]:
    """The checkpoint name ``LATEST`` holds, or ``None`` when it holds anything but a name of this directory's."""
    raw = fs.read_bytes(join(directory, LATEST)).decode("utf-8", errors="replace").strip()
    if _NAME.fullmatch(raw):
        return raw
    logger.warning(
        "Ignoring %s: it holds %r, not the name of a checkpoint in that directory (ckpt-<number>); "
        "taking the newest complete checkpoint there instead.", join(directory, LATEST), raw[:100],
    )
    return None


def candidates(directory: str) -> List[str]:
    """The URIs of the complete checkpoints in ``directory``, newest first (``LATEST``'s first).

    Complete: its ``meta.json`` (written last) exists. Whether it reads back is :func:`load`'s to say; a resume takes
    the first that does.

    Raises:
        ConfigurationError: ``directory`` is a file, or holds files that are not checkpoints (so it is not ours to write
            into).
    """
    names = _entries(directory)
    if not names:
        return []
    if LATEST not in names:
        foreign = sorted(n for n in names if not n.startswith((PREFIX, fs.TEMP_PREFIX)))
        if foreign:
            raise ConfigurationError(
                f"The 'checkpoint_dir' parameter must be an empty or new directory, or one holding "
                f"sparkdl_avg checkpoints. Got {directory!r}, which holds {foreign[:5]}, instead."
            )
    # LATEST can be missing for a moment where replacing a file is delete + rename (HDFS):
    # the newest checkpoint whose meta.json (written last) exists is complete.
    ordered = _names(names)[::-1]
    pointed = _pointer(directory) if LATEST in names else None
    if pointed in ordered:
        ordered.remove(pointed)
        ordered.insert(0, pointed)
    elif pointed is not None:
        logger.warning("%s names %s, which is not there; taking the newest complete checkpoint instead.",
                       join(directory, LATEST), pointed)
    return [join(directory, n) for n in ordered if fs.exists(join(join(directory, n), META))]


def latest(directory: str) -> Optional[str]:
    """The URI of the newest complete checkpoint in ``directory``, or ``None`` if it holds none.

    ``LATEST``'s checkpoint; without a usable ``LATEST`` (missing, or holding anything but a checkpoint's name), the
    newest whose ``meta.json`` exists.

    Raises:
        ConfigurationError: as :func:`candidates`.
    """
    found = candidates(directory)
    return found[0] if found else None


def save(directory: str, checkpoint: Checkpoint, keep: int = 1) -> str:
    """Writes ``checkpoint`` into ``directory`` atomically, reads it back; returns its URI.

    Args:
        directory: Checkpoint directory (local path or ``pyarrow.fs`` URI).
        keep: Complete checkpoints to keep, the new one included: the new one and the newest ``keep - 1`` earlier ones
            that verify (see the module's "Pruning"); the others, and incomplete ones a crash left, are deleted once
            ``LATEST`` names the new one. Default 1.

    Raises:
        CheckpointError: the new checkpoint does not read back as written; ``LATEST`` still names the previous one and
            nothing was deleted. Or writing failed (a full disk: the message says so, naming the ``checkpoint_dir``);
            then also nothing of the new checkpoint is left.
    """
    existing = _names(_entries(directory))
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
    for key, data in checkpoint.feedback.items():
        arrays[f"feedback/{key}"] = np.frombuffer(data, np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    data = buffer.getvalue()
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
        "feedback": sorted(checkpoint.feedback),
        "arrays_sha256": hashlib.sha256(data).hexdigest(),
    }
    try:
        fs.write_atomically(join(target, ARRAYS), data)
        # meta.json last: latest() takes a checkpoint whose meta.json exists as complete.
        fs.write_atomically(join(target, META), json.dumps(meta, indent=1, sort_keys=True, default=_json_default).encode())
    except OSError as exc:  # a full disk, most often: the fit has run for a while by now
        raise _not_written(directory, target, exc, keep, len(data)) from None

    # Verified before the commit point: LATEST never names a checkpoint that was written damaged,
    # and no earlier checkpoint is deleted for one that does not read back.
    error = _verify(target)
    if error is not None:
        raise CheckpointError(
            f"The checkpoint just written to {target!r} does not read back: {error} {LATEST} still names "
            "the previous checkpoint and none was deleted; check the storage of the checkpoint_dir."
        ) from None

    # The commit point: LATEST names the new checkpoint only once it is complete.
    try:
        fs.write_atomically(join(directory, LATEST), name.encode())
    except OSError as exc:
        raise _not_written(directory, target, exc, keep, len(data)) from None
    for old in _to_prune(directory, existing, keep):
        fs.remove_tree(join(directory, old))
    return target


def _not_written(directory: str, target: str, exc: OSError, keep: int, nbytes: int) -> CheckpointError:
    """The error of a checkpoint that could not be written (``exc``), once its partial files are removed.

    ``keep`` and ``nbytes`` (the checkpoint's arrays) size the room the message asks for: ``keep`` checkpoints stay and
    one more is being written.

    What is left is what it was before :func:`save`: ``LATEST`` (replaced atomically, or not at all) names the last
    complete checkpoint, and no incomplete one remains for a resume to consider, nor takes the space. The message names
    the ``checkpoint_dir``, the cause (a full disk, most often: :func:`sparkdl_avg.shared.files.fs.write_failure`), and
    what is intact.
    """
    with contextlib.suppress(Exception):
        fs.remove_tree(target)
    try:
        last = latest(directory)
    except Exception:  # the directory cannot be listed either: say nothing about it rather than guess
        last = None
        kept = "."
    else:
        kept = (f"; the last complete checkpoint, {last!r}, is unchanged and fit(resume=True) continues from it."
                if last is not None else "; no checkpoint of this run was completed before.")
    return CheckpointError(
        f"Cannot write a checkpoint to the 'checkpoint_dir' {directory!r}: {fs.write_failure(exc)}. The model "
        f"in memory is intact (it holds the weights this checkpoint was to save){kept} Nothing of the new "
        f"checkpoint ({target!r}) was left. Free space there, or give a 'checkpoint_dir' with room for "
        f"{keep + 1} checkpoints of {nbytes / 1e6:.2g} MB."
    )


def _verify(uri: str) -> Optional[Exception]:
    """Why the checkpoint at ``uri`` cannot be resumed from (what :func:`load` raises), or ``None`` if it can."""
    try:
        load(uri)
    except (CheckpointError, ConfigurationError) as exc:
        return exc
    return None


def _to_prune(directory: str, existing: List[str], keep: int) -> List[str]:
    """Which of ``existing`` (the checkpoints before the new one, oldest first) to delete, keeping ``keep`` in all.

    The module's "Pruning" rule: kept, the newest ``keep - 1`` that verify; when fewer verify, the complete ones that do
    not are kept too.
    """
    wanted = keep - 1
    complete = [n for n in existing if fs.exists(join(join(directory, n), META))]
    kept: List[str] = []
    unverified: List[Tuple[str, Exception]] = []
    for name in reversed(complete):
        if len(kept) >= wanted:
            break
        error = _verify(join(directory, name))
        if error is None:
            kept.append(name)
        else:
            unverified.append((name, error))
    for name, error in unverified:
        if len(kept) >= wanted:
            logger.warning("Deleting the checkpoint %s, which does not read back (%s); keeping %s, the newest "
                           "earlier one that does.", join(directory, name), error, join(directory, kept[0]))
        else:
            logger.warning("Keeping the checkpoint %s, which does not read back (%s): no earlier checkpoint in %s "
                           "reads back to keep instead.", join(directory, name), error, directory)
    if len(kept) < wanted:
        kept += [name for name, _ in unverified]
    return [n for n in existing if n not in kept]


def _damaged(uri: str, what: str) -> CheckpointError:
    """The error for the checkpoint at ``uri`` that cannot be read back because of ``what``."""
    return CheckpointError(
        f"The checkpoint at {uri!r} is damaged: {what}. It cannot be resumed from; fit(resume=True) takes "
        "the previous checkpoint in its directory when one reads back (delete this one to make that the "
        "latest), or pass resume='<an earlier checkpoint>', or start a new run in an empty checkpoint_dir."
    )


#: The types of ``meta.json``'s values that :func:`load` reads (JSON's: ints, objects, lists, strings).
_META_TYPES = {
    "format_version": int, "epoch": int, "rounds_done": int, "steps_done": int, "num_weights": int,
    "num_optimizer_variables": int, "rule_state_sizes": dict, "feedback": list, "seed": int, "run": dict,
    "schedule_state": dict, "epoch_examples": int, "epoch_metric_sums": dict, "history": dict, "tracking": dict,
    "arrays_sha256": str, "position": int, "membership": list,
}


def _wrong_types(meta: Dict[str, Any]) -> Optional[str]:
    """The first of ``meta``'s values of a type :func:`load` cannot use, described; ``None`` if all fit."""
    for key, kind in _META_TYPES.items():
        value = meta.get(key)
        if key in meta and (not isinstance(value, kind) or isinstance(value, bool)
                            or (kind is int and value < 0)):
            what = "a non-negative integer" if kind is int else {dict: "an object", list: "a list", str: "a string"}[kind]
            return f"{key}={value!r} where {what} belongs"
    return None


def load(uri: str) -> Checkpoint:
    """Reads and verifies the checkpoint at ``uri`` (a ``ckpt-*`` directory, as :func:`latest` returns).

    Raises:
        CheckpointError: a file is missing, ``meta.json`` is not a checkpoint's, or ``arrays.npz`` does not match its
            checksum or lacks an array (truncated, emptied, altered).
        ConfigurationError: another format version.
    """
    try:
        raw_meta = fs.read_bytes(join(uri, META))
        data = fs.read_bytes(join(uri, ARRAYS))
    except (FileNotFoundError, OSError) as exc:
        raise CheckpointError(
            f"No complete sparkdl_avg checkpoint at {uri!r}: {exc}. Resume from another checkpoint, or start "
            "a new run in an empty checkpoint_dir."
        ) from None
    try:
        meta = json.loads(raw_meta)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise _damaged(uri, f"{META} is not JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise _damaged(uri, f"{META} holds a {type(meta).__name__}, not a checkpoint's metadata")
    wrong = _wrong_types(meta)
    if wrong:  # an edited or garbled meta.json: damage, with the fall-back, not "another format version"
        raise _damaged(uri, f"{META} holds {wrong}")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ConfigurationError(
            f"The checkpoint at {uri!r} has format version {meta.get('format_version')!r}; this "
            f"version of sparkdl_avg reads version {FORMAT_VERSION}."
        )
    expected = meta.get("arrays_sha256")  # absent in checkpoints written before it was recorded
    if expected is not None and hashlib.sha256(data).hexdigest() != expected:
        raise _damaged(uri, f"{ARRAYS} ({len(data)} bytes) does not match the SHA-256 recorded in {META} "
                            "(truncated or altered)")
    try:
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
            feedback={key: arrays[f"feedback/{key}"].tobytes() for key in meta.get("feedback", [])},
            meta=RunMeta(**{f.name: meta[f.name] for f in dataclasses.fields(RunMeta) if f.name in meta}),
        )
    except KeyError as exc:
        raise _damaged(uri, f"{META} or {ARRAYS} lacks the entry {exc}") from None
    except Exception as exc:  # BadZipFile, EOFError, ValueError, TypeError from np.load and the meta's values
        raise _damaged(uri, f"{ARRAYS} or {META} cannot be read ({type(exc).__name__}: {exc})") from None


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
