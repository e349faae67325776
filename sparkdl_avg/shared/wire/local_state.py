"""``optimizer_state="local"``: each worker's own optimizer variables between its rounds, as files.

DiLoCo (Douillard et al. 2023) and its descendants keep each replica's inner optimizer state (AdamW's moments) on the
replica and average only the weights. Here worker ``i`` of a round reads the optimizer variables it ended its previous
round with and writes those it ends this round with, as the variables' raw bytes in ``optimizer.variables`` order, in
one of two places:

* **On its host** (``host_local``, classic sessions): a file under this machine's temporary directory
  (:func:`host_directory`), and the driver asks Spark to run the worker's next task on the same host (a locality
  preference, :mod:`sparkdl_avg.driver.transport.local_states`), so nothing crosses the network. A task that Spark
  retries on that host reads the same file and writes the same bytes; an attempt that outlived its round leaves the
  round's file as it is (:meth:`LocalStateFiles.save`). Rounds after which a checkpoint may be saved (``share``) also
  write the file to the shared staging directory, which the checkpoint reads. A worker whose file is on neither (its
  host was lost, or its task ran elsewhere) restarts from the optimizer variables the driver sent, and its record says
  so (``WorkerRecord.local_state_restarted``).
* **Under the shared staging directory** (Spark Connect, where a client sets no locality):
  ``<directory>/<round>-w<i>.bin``, written atomically, so a retried task anywhere reads the same file and a lost
  executor loses nothing. On the shaped network these cost several times the hosts' own files, every worker's state
  going through the store each round (docs/benchmarks/diloco.md, "The states on the workers' hosts").

A worker that has no state yet (the fit's first round, or a worker index an elastic round adds) starts from the
optimizer variables the driver sent: the driver's own, which these fits never update but for the iteration counter.
The driver's side (which round reads which, when files go, what a checkpoint carries) is
:class:`~sparkdl_avg.driver.transport.local_states.LocalStateLedger`'s, as for error feedback's residuals.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from .kept import WorkerRound, WorkerRoundFiles


def to_bytes(arrays: Sequence[np.ndarray]) -> bytes:
    """The arrays' raw bytes, one after another (C order; 0-d counters as one value)."""
    return b"".join(np.ascontiguousarray(np.asarray(a)).reshape(-1).view(np.uint8).tobytes() for a in arrays)


def from_bytes(data: bytes, template: Sequence[np.ndarray]) -> List[np.ndarray]:
    """Arrays shaped and typed as ``template`` from :func:`to_bytes`' output (copies, writable).

    ``template``: arrays, or anything with ``specs``, ``(dtype, shape)`` per array (arrays not read yet:
    :class:`~sparkdl_avg.shared.wire.standing_net.RemoteArrays`).
    """
    specs = getattr(template, "specs", None)
    if specs is None:
        specs = [(np.asarray(t).dtype, np.shape(t)) for t in template]
    out, offset = [], 0
    for dtype, shape in specs:
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if offset + n > len(data):
            raise ValueError(f"a local optimizer state of {len(data)} bytes is shorter than its variables' "
                             f"{sum(int(np.prod(sh, dtype=np.int64)) * np.dtype(dt).itemsize for dt, sh in specs)}")
        out.append(np.frombuffer(data, np.uint8, count=n, offset=offset).view(dtype).reshape(shape).copy())
        offset += n
    if offset != len(data):
        raise ValueError(f"a local optimizer state of {len(data)} bytes does not match its variables' {offset}")
    return out


HOST_DIRECTORY = "sparkdl_avg-local-state"
"""Under the host's temporary directory, with the executors' user id after it (``sparkdl_avg-local-state-<uid>``,
so that two users' executors on one host do not share, or fail to write, one folder): one directory per fit
(named by its shared directory's hash)."""

HOST_IDLE_S = 600.0
"""Seconds a fit's directory on a host stays untouched before another fit's task asks whether its fit is gone.

A fit's host directories are deleted by other fits' tasks on that host (a driver cannot reach every host's disk), and
only once their fit is gone: its shared directory, named in the directory's :data:`FIT_MARK`, no longer holds
:data:`FIT_ALIVE` (the fit's end removes it). A fit whose rounds take longer than this keeps its states; the check, a
stat in the shared directory, is then made again after as long (the directory's time is renewed).
"""

FIT_MARK = ".fit"
"""In a fit's directory on a host: the fit's shared directory (UTF-8), by which other fits tell whether it is gone."""

FIT_ALIVE = "fit-alive"
"""In a fit's shared directory of such files: an empty file the driver writes when the fit starts and deletes with
the directory at its end (an object store has no empty directories): while it exists the fit's host files stay."""

HOST_TTL_S = 3600.0
"""A host directory without a :data:`FIT_MARK` (written before the marks) is deleted once untouched this long."""


def host_directory(directory: str) -> str:
    """This host's directory of the states of the fit whose shared directory is ``directory``."""
    key = hashlib.sha1(directory.encode("utf-8")).hexdigest()[:16]
    user = getattr(os, "getuid", lambda: "")()
    return os.path.join(tempfile.gettempdir(), f"{HOST_DIRECTORY}-{user}", key)


@functools.lru_cache(maxsize=1)
def host_names() -> Tuple[str, ...]:
    """The names Spark may know this machine by: its executor's host is one of them (to place the next task here).

    Spark names an executor's host ``SPARK_LOCAL_HOSTNAME`` if set, else an address of the machine
    (``SPARK_LOCAL_IP``, or what its host name resolves to, or an interface's); the driver matches these with its live
    executors' hosts (:meth:`~sparkdl_avg.driver.transport.local_states.LocalStateLedger.places`).
    """
    names = [os.environ.get(var) for var in ("SPARK_LOCAL_HOSTNAME", "SPARK_LOCAL_IP")]
    host = socket.gethostname()
    names += [host, socket.getfqdn()]
    try:
        names += socket.gethostbyname_ex(host)[2]
    except OSError:
        pass
    import psutil

    names += [a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs
              if a.family in (socket.AF_INET, socket.AF_INET6)]
    return tuple(dict.fromkeys(n for n in names if n))


@dataclass(frozen=True)
class LocalStateFiles(WorkerRoundFiles):
    """Where a round's workers read and write their own optimizer variables (``optimizer_state="local"``).

    ``fresh`` workers (an elastic round's new ones) have no state yet and start from the sent variables.

    Attributes:
        host_local: Keep the states in files on the workers' hosts (see the module docstring); ``False``:
            under the shared directory only.
        share: With ``host_local``: also write this round's states under the shared directory (a checkpoint
            may be saved after the round and reads them there).
    """

    host_local: bool = False
    share: bool = False

    what = "optimizer state (optimizer_state='local')"

    def load(self, worker: int, template: Sequence[np.ndarray]) -> Tuple[Optional[List[np.ndarray]], bool]:
        """Worker ``worker``'s optimizer variables from its previous round, and whether it had to restart.

        ``(None, False)``: it has none yet. ``(None, True)``: it had one, on a host this task did not run on and not
        under the shared directory; it restarts from the sent variables.
        """
        if not self.host_local:
            data = self.read_bytes(worker)
            return (None if data is None else from_bytes(data, template)), False
        if self.read is None or worker in self.fresh:
            return None, False
        data = _read_if_there(os.path.join(host_directory(self.directory), f"{self.read}-w{worker}.bin"))
        if data is None:
            try:
                data = self.read_bytes(worker)
            except FileNotFoundError:
                return None, True
        return from_bytes(data, template), False

    def save(self, worker: int, variables: Sequence[np.ndarray]) -> None:
        """Writes worker ``worker``'s optimizer variables after this round, unless this attempt came after its round.

        An attempt that outlived its round (a speculative copy, or one on an executor Spark gave up on) and read its
        state only once the next round had pruned it, restarted from the sent variables; its bytes must not replace
        those another attempt of the round wrote, which the next round read and a retry of it reads again
        (:meth:`_over`).
        """
        if self.host_local and self._over(worker):
            return
        data = to_bytes(variables)
        if not self.host_local or self.share:
            self.write_bytes(worker, data)
        if self.host_local:
            here = host_directory(self.directory)
            if not os.path.exists(os.path.join(here, FIT_MARK)):
                os.makedirs(here, exist_ok=True)
                _write_file(os.path.join(here, FIT_MARK), self.directory.encode("utf-8"))
            _write_file(os.path.join(here, f"{self.write}-w{worker}.bin"), data)
            _prune(here, worker, self.read)

    def begin(self, w: WorkerRound) -> None:
        """The worker starts from its own optimizer variables, if it has them."""
        own, restarted = self.load(w.worker, w.sent_optimizer)
        w.start_optimizer = w.sent_optimizer if own is None else own
        w.restarted = w.restarted or restarted

    def end(self, w: WorkerRound, begun=None) -> None:
        """Keeps the replica's optimizer variables (one that went non-finite keeps those it started from)."""
        self.save(w.worker, w.end_optimizer if w.finite else w.start_optimizer)

    def _over(self, worker: int) -> bool:
        """Whether worker ``worker``'s round is over on this host: its file is here and the one it read is gone.

        A worker's files on a host go only once no round reads them again: the one this round reads goes with the next
        round's save (:func:`_prune`), after an attempt of this round wrote its own. So both true means the round is
        over here and its file is the one the next round read. (Where the file read was never here, the task ran on
        another host than before, and the attempt that wrote here found what this one finds: the shared file or none,
        the same bytes.)
        """
        if self.read is None or worker in self.fresh:
            return False
        here = host_directory(self.directory)
        return (os.path.exists(os.path.join(here, f"{self.write}-w{worker}.bin"))
                and not os.path.exists(os.path.join(here, f"{self.read}-w{worker}.bin")))


def _read_if_there(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _round_number(name: Optional[str]) -> Optional[int]:
    """``g`` of a ledger's round name ``"g<g>"`` (``None`` for another name)."""
    if name and name[0] == "g" and name[1:].isdigit():
        return int(name[1:])
    return None


def _write_file(path: str, data: bytes) -> None:
    """Writes ``path`` atomically (a rename), so a reader finds the whole of it or nothing."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _fit_gone(shared: str) -> bool:
    """Whether the fit whose shared directory is ``shared`` has ended (no :data:`FIT_ALIVE`); ``False`` if unsure."""
    from ..files.uris import exists, join

    try:
        return not exists(join(shared, FIT_ALIVE))
    except Exception:  # noqa: BLE001 - a store that cannot be asked now: keep the states
        return False


def _sweep(root: str, here: str) -> None:
    """Deletes the directories under ``root`` (other fits' on this host) whose fit is gone; see :data:`HOST_IDLE_S`."""
    now = time.time()
    for entry in os.scandir(root):
        try:
            idle = now - entry.stat().st_mtime
            if not entry.is_dir() or entry.path == here or idle < HOST_IDLE_S:
                continue
        except FileNotFoundError:
            continue
        mark = _read_if_there(os.path.join(entry.path, FIT_MARK))
        if mark is None:
            gone = idle > HOST_TTL_S
        else:
            gone = _fit_gone(mark.decode("utf-8"))
            if not gone:  # asked again only after another HOST_IDLE_S
                try:
                    os.utime(entry.path)
                except FileNotFoundError:
                    pass
        if gone:
            shutil.rmtree(entry.path, ignore_errors=True)


def _prune(here: str, worker: int, read: Optional[str]) -> None:
    """Deletes ``worker``'s files on this host older than ``read`` (which a retry of this round still reads),
    and other fits' directories whose fit is gone (:func:`_sweep`)."""
    keep = _round_number(read)
    suffix = f"-w{worker}.bin"
    if keep is not None:
        for name in os.listdir(here):
            g = _round_number(name[: -len(suffix)]) if name.endswith(suffix) else None
            if g is not None and g < keep:
                try:
                    os.remove(os.path.join(here, name))
                except FileNotFoundError:  # another task of the worker's (a retry) got there first
                    pass
    _sweep(os.path.dirname(here), here)
