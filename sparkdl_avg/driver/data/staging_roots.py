"""The trainers' staging roots: their names, their owners, their creation and deletion, and the clean-up of dead ones.

A trainer stages its data (and, with some transports, each round's state) under a root of its own,
``<staging_dir>/sparkdl_avg-<time>-<id>`` (:class:`StagingRoot`), made on first use and deleted by ``close()`` or the
trainer's finalizer at exit. A driver killed before either runs (``kill -9``, the OOM killer, a lost container) leaves
its root behind: a whole copy of the training data per crash. So a local root gets an owner marker (:data:`MARKER`: the
host, the process id and when that process started), and the first time a trainer makes its root in a directory it
removes the roots there whose owner is no longer running (:func:`remove_orphans`), logging each with its size.

Only what is surely a dead driver's is removed: a directory of this naming pattern, owned by this user, holding a marker
for itself; the owner on this host (same host name, boot and PID namespace) and not running, or running but started at
another time (its pid reused). A root from before a reboot counts as another host's and stays (another machine of the
same name sharing the directory cannot be told from it); so does every root on a remote filesystem (``hdfs://``,
``s3://``, ``gs://``): hosts share those, host names there do not prove one machine, and listing an object store before
every fit costs requests. Expire those with the store's own means (an S3 lifecycle rule on the prefix, say). The sweep
is POSIX only (Linux fully; elsewhere a reused pid reads as the owner, so its root stays).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from typing import Dict, List, Optional, Tuple

from ...shared.files.fs import is_local, join, make_writable_dir, remove_tree, replace_atomically
from ...shared.files.uris import user_path

logger = logging.getLogger("sparkdl_avg")

ROOT_PREFIX = "sparkdl_avg-"
# What StagingRoot.new names a root: sparkdl_avg-<YYYYmmdd>-<HHMMSS>-<hex token>. Nothing else is ever removed.
ROOT_PATTERN = re.compile(r"sparkdl_avg-\d{8}-\d{6}-[0-9a-f]+")
# The owner marker in a local root (JSON, see owner_record).
MARKER = ".sparkdl_avg-owner.json"


class StagingRoot:
    """A trainer's own directory under ``staging_dir``: made on first use, deleted only if it was made.

    :meth:`remove` runs from ``close()`` and from the trainer's finalizer at exit; a root that was never made (its
    ``staging_dir`` unwritable or unreachable) is not touched, so neither raises the fit's error again.

    Args:
        uri: The root (``<staging_dir>/sparkdl_avg-<time>-<id>``, see :meth:`new`).
        staging_dir: The trainer's ``staging_dir`` option (``None``: the system temp dir), for messages.
    """

    def __init__(self, uri: str, staging_dir: Optional[str]) -> None:
        self.uri = uri
        self.staging_dir = staging_dir
        self.made = False

    @classmethod
    def new(cls, staging_dir: Optional[str], token: int) -> "StagingRoot":
        """A root named for now and ``token`` (a number unique among this process's live trainers: their ``id()``)."""
        staging_dir = user_path(staging_dir)  # a pathlib.Path, a "~"
        base = staging_dir or tempfile.gettempdir()
        return cls(join(base, f"{ROOT_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}-{token:x}"), staging_dir)

    def make(self, private: bool) -> None:
        """Creates the root (see :func:`sparkdl_avg.shared.files.fs.make_dir`); once made, a local one is marked and swept beside.

        The first call after the root was (re)made writes its owner marker and removes the dead drivers' roots next to
        it (:func:`remove_orphans`).

        Raises:
            PathError: naming ``staging_dir`` and why it cannot hold the root.
        """
        given = self.staging_dir or tempfile.gettempdir()
        subject = "The 'staging_dir' parameter" if self.staging_dir else "The system temp dir (staging_dir=None)"
        make_writable_dir(self.uri, subject, given, private=private)
        if not self.made and is_local(self.uri):
            path = _local_path(self.uri)
            write_marker(path)
            remove_orphans(os.path.dirname(path))
        self.made = True

    def remove(self) -> None:
        """Deletes the root and what it holds, if it was made."""
        if self.made:
            remove_tree(self.uri)
            self.made = False


def _local_path(uri: str) -> str:
    return os.path.abspath(uri[len("file://") :] if uri.startswith("file://") else uri)


def _read_text(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def this_host() -> Dict[str, Optional[str]]:
    """What tells this host (and boot, and PID namespace) from others: where a pid means this process table's.

    ``boot_id`` and ``pid_namespace`` are Linux's (``None`` elsewhere).
    """
    try:
        namespace: Optional[str] = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = None
    return {
        "host": socket.gethostname(),
        "boot_id": _read_text("/proc/sys/kernel/random/boot_id"),
        "pid_namespace": namespace,
    }


# In the fields of /proc/<pid>/stat after the name: the state (proc(5)'s field 3) and starttime (field 22).
_STATE, _STARTTIME = 0, 19


def _stat_fields(pid: int) -> List[bytes]:
    """The fields of Linux's ``/proc/<pid>/stat`` after the name.

    Raises:
        OSError: ``FileNotFoundError`` when there is no such process (or no ``/proc``).
    """
    with open(f"/proc/{pid}/stat", "rb") as f:
        # The name (field 2) is in parentheses and may hold spaces and parentheses itself.
        return f.read().rsplit(b")", 1)[1].split()


def _process_start(pid: int) -> Optional[int]:
    """When process ``pid`` started, in clock ticks after boot (Linux's ``/proc``); ``None`` where unknown."""
    try:
        return int(_stat_fields(pid)[_STARTTIME])
    except (OSError, IndexError, ValueError):
        return None


def owner_record(pid: Optional[int] = None) -> dict:
    """The marker's content for a root of process ``pid`` (default: this one): JSON-able.

    Keys: ``library``, the host's (:func:`this_host`), ``pid``, ``started`` (:func:`_process_start`: tells a reused pid
    from the owner) and ``written`` (seconds since the epoch, for people reading it).
    """
    pid = os.getpid() if pid is None else pid
    return {"library": "sparkdl_avg", **this_host(), "pid": pid, "started": _process_start(pid),
            "written": time.time()}


def write_marker(root: str) -> None:
    """Writes the owner marker of this process into the local directory ``root`` (whole, through a temporary name)."""
    with replace_atomically(os.path.join(root, MARKER)) as tmp:
        with open(tmp, "w") as f:
            json.dump(owner_record(), f)


def _running(pid: int, started: Optional[int]) -> bool:
    """Whether process ``pid`` runs here and is the one that started at ``started`` (``None``: not recorded)."""
    try:
        fields = _stat_fields(pid)
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return False
        try:  # no /proc (macOS): whether the pid exists is all there is; a reused one keeps the root
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    except OSError:
        return True  # cannot tell: keep the root
    if fields[_STATE] in (b"Z", b"X"):  # killed, not yet reaped by its parent
        return False
    return started is None or int(fields[_STARTTIME]) == started


def dead_owner(root: str) -> Optional[dict]:
    """The owner record of the local directory ``root`` if it is a staging root whose owner is surely dead, else None.

    See the module's docstring for what "surely" takes.
    """
    # POSIX only: elsewhere there is no owner uid to compare, and Windows' os.kill(pid, 0) would end the process.
    if os.name != "posix" or not ROOT_PATTERN.fullmatch(os.path.basename(root)):
        return None
    try:
        if os.lstat(root).st_uid != os.getuid():
            return None
        with open(os.path.join(root, MARKER)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("library") != "sparkdl_avg":
        return None
    if any(record.get(key) != value for key, value in this_host().items()):
        return None  # another host's, or from before a reboot
    pid, started = record.get("pid"), record.get("started")
    if not isinstance(pid, int) or isinstance(pid, bool) or not (started is None or isinstance(started, int)):
        return None
    return None if _running(pid, started) else record


def _tree_size(root: str) -> Tuple[int, int]:
    """The bytes and the number of files under the local directory ``root`` (symbolic links not followed)."""
    size = files = 0
    for parent, _, names in os.walk(root):
        for name in names:
            try:
                size += os.lstat(os.path.join(parent, name)).st_size
                files += 1
            except OSError:
                pass
    return size, files


def remove_orphans(parent: str) -> List[Tuple[str, int]]:
    """Removes the staging roots in the local directory ``parent`` that drivers no longer running left behind.

    Which ones: :func:`dead_owner`. Each is logged at warning level, with its size; one that cannot be removed whole is
    logged and left. Never raises for what it finds: a trainer's fit does not depend on it.

    Returns:
        The roots removed and their sizes in bytes.
    """
    removed = []
    try:
        entries = [e for e in os.scandir(parent) if e.is_dir(follow_symlinks=False) and ROOT_PATTERN.fullmatch(e.name)]
    except OSError:
        return removed
    for entry in entries:
        record = dead_owner(entry.path)
        if record is None:
            continue
        size, files = _tree_size(entry.path)
        # Errors ignored: another trainer sweeping this directory at the same time may remove a file first.
        shutil.rmtree(entry.path, ignore_errors=True)
        if os.path.lexists(entry.path):
            logger.warning("Could not remove all of %s, the staging root of a driver no longer running (pid %s).",
                           entry.path, record["pid"])
            continue
        removed.append((entry.path, size))
        logger.warning(
            "Removed %s, the staging root left by a driver no longer running (pid %s on %s): %s bytes in %d files.",
            entry.path, record["pid"], record["host"], f"{size:,}", files,
        )
    return removed
