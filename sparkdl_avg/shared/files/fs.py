"""Paths, URIs and filesystems: the one place where the package reaches storage, and the checks of output locations.

The package's storage operations are in three modules, and every one of them is importable from here: :mod:`.uris`
owns how a local path or URI becomes a ``pyarrow.fs`` filesystem and a path on it (:func:`resolve`), the whole-file
operations on any such filesystem (:func:`read_bytes`, :func:`exists`, :func:`remove_tree`, :func:`make_dir`) and the
other route to storage, the JVM's Hadoop ``FileSystem`` over Py4J (``hadoop_*``, driver only); :mod:`.atomic` owns the
writes readers never see a part of (:func:`replace_atomically` for local files written by a library that wants a path,
such as Keras' ``model.save``; :func:`open_atomically` and :func:`write_atomically` for any filesystem), whole copies
(:func:`download`, :func:`local_copy`) and what a failed write says (:func:`is_full`, :func:`write_failure`). This
module owns the check that an output location can be written, run before the work whose results go there
(:func:`check_writable`, :func:`make_writable_dir`; on a remote filesystem bounded by :func:`path_check_time_limit`),
and the jobs' all-or-nothing output directory (:class:`OutputDir`). Everything else (staging, checkpoints, the
exchange files, the jobs) goes through here. It holds no state and runs on executors too.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import shutil
import tempfile
import threading
import time
import uuid
from typing import Any, Callable, Optional, Tuple

import pyarrow.fs as pafs

from ...errors import ConfigurationError, PathError
from .atomic import (  # noqa: F401 (API: the package's storage operations, by one module's name)
    TEMP_PREFIX, _temp_path, _umask, download, is_full, local_copy, open_atomically, refuse_existing,
    replace_atomically, write_atomically, write_failure)
from .uris import (  # noqa: F401 (API)
    _exists, _make_dir, exists, hadoop_exists, hadoop_read_bytes, hadoop_write_bytes, is_local, join, make_dir,
    read_bytes, remove_tree, resolve)

# The longest a check of a remote location may take, in seconds (see path_check_time_limit): without a limit a gs://
# bucket that does not exist, with no credentials, keeps pyarrow's GCS client retrying in silence for about ten minutes.
PATH_CHECK_TIME_LIMIT_S = 30.0
PATH_CHECK_TIME_LIMIT_ENV = "SPARKDL_AVG_PATH_CHECK_TIME_LIMIT_S"


def path_check_time_limit() -> float:
    """How long a check of a remote location may take before it fails, in seconds.

    ``$SPARKDL_AVG_PATH_CHECK_TIME_LIMIT_S`` when set (read at each check), else :data:`PATH_CHECK_TIME_LIMIT_S` (30 s).

    Raises:
        ConfigurationError: the variable is not a number of seconds above 0.
    """
    given = os.environ.get(PATH_CHECK_TIME_LIMIT_ENV)
    if given is None:
        return PATH_CHECK_TIME_LIMIT_S
    try:
        limit = float(given)
    except ValueError:
        limit = float("nan")
    if not limit > 0 or limit == float("inf"):
        raise ConfigurationError(
            f"The {PATH_CHECK_TIME_LIMIT_ENV} environment variable must be a number of seconds above 0. "
            f"Got {given!r} instead."
        )
    return limit


class _Traced:
    """A ``pyarrow.fs`` filesystem that remembers its latest call: what a remote path check was doing at its end."""

    def __init__(self, filesystem: pafs.FileSystem) -> None:
        self._filesystem = filesystem
        self.operation = f"opening {type(filesystem).__name__}"

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._filesystem, name)
        if not callable(value):
            return value

        def call(*args, **kwargs):
            target = getattr(args[0], "base_dir", args[0]) if args else ""  # a FileSelector: its directory
            self.operation = f"{type(self._filesystem).__name__}.{name}({target!r})"
            return value(*args, **kwargs)

        return call


def _bounded_check(uri: str, subject: str, shown: str, what: str,
                   check: Callable[[pafs.FileSystem, str], None]) -> None:
    """Runs ``check(filesystem, path)`` on ``uri``'s filesystem; on a remote one within :func:`path_check_time_limit`.

    A local check runs here: the operating system answers at once. A remote one (opening the filesystem included:
    ``hdfs://`` connects there) runs in a daemon thread that the caller waits for at most the limit, with the GCS
    client's retries limited to a sixth of it (its backoff overshoots that up to twice, and a check makes several
    requests) so that its own error (no credentials, no such bucket) usually comes first. A check still waiting at the
    limit is left to end by itself (removing, as always, the directories it made).

    Args:
        subject: What the messages call ``uri`` (``"The 'checkpoint_dir' parameter"``).
        shown: The location the messages show: the one the user gave (``uri``, or a directory above it).
        what: What the check does, for the messages (``"checking that a file can be written there"``).
        check: Raises ``PathError`` in the package's words, or any other exception (made :func:`not_writable`'s).

    Raises:
        PathError: from ``check``, or "<subject> must be a directory this process can write. Got '<shown>' instead:
            <cause>.", where for a remote location the cause names the filesystem's operation, how long it took and the
            time limit.
        ConfigurationError: ``$SPARKDL_AVG_PATH_CHECK_TIME_LIMIT_S`` is not a number of seconds above 0.
    """
    if is_local(uri):
        filesystem, path = resolve(uri)
        try:
            check(filesystem, path)
        except PathError:
            raise
        except Exception as exc:  # OSError from the filesystem, ArrowInvalid, ...
            raise not_writable(subject, shown, str(exc)) from None
        return
    limit = path_check_time_limit()
    traced: list = []  # the opened filesystem, once from_uri returned
    outcome: list = []  # None, or what the check raised

    def run() -> None:
        try:
            filesystem, path = resolve(uri, retry_limit_s=limit / 6)
            traced.append(_Traced(filesystem))
            check(traced[0], path)
            outcome.append(None)
        except BaseException as exc:  # handed to the waiting thread
            outcome.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=run, name="sparkdl_avg-path-check", daemon=True)
    thread.start()
    thread.join(limit)
    doing = traced[0].operation if traced else f"pyarrow.fs.FileSystem.from_uri({uri!r})"
    if not outcome:
        raise not_writable(
            subject, shown,
            f"{doing} gave no answer within {limit:g} s, the time limit of a path check ({what}; "
            f"{PATH_CHECK_TIME_LIMIT_ENV} sets it). Check the URI, the network and the filesystem's credentials",
        )
    error = outcome[0]
    if error is None:
        return
    if isinstance(error, PathError) and traced:  # the check's own words
        raise error
    if isinstance(error, PathError):  # from_uri refused the URI
        raise not_writable(subject, shown, str(error)) from None
    raise not_writable(
        subject, shown,
        f"{doing} failed after {time.monotonic() - started:.1f} s ({what}; path checks give up after {limit:g} s): "
        f"{error}",
    ) from None


def check_writable(uri: str, subject: str, in_parent: bool = False) -> None:
    """Raises ``PathError`` unless this process can make ``uri`` a directory and write a file in it.

    The check for an output location, run before any work that writing there at the end would lose: it creates the
    directory (with its missing parents), writes and deletes a small probe file in it, then removes the directories it
    created, so a location that passes is left as it was. On a remote filesystem it gives up after
    :func:`path_check_time_limit` (30 s by default).

    Args:
        uri: Local path or URI of the directory.
        subject: What the message calls it, e.g. ``"The 'checkpoint_dir' parameter"`` or ``"The --output-dir flag"``.
        in_parent: Probe the directory that holds ``uri`` instead (where an output written to a sibling and renamed
            into place is written).

    Raises:
        PathError: "<subject> must be a directory this process can write. Got '<uri>' instead: <cause>." (a file is in
            the way, no filesystem opens the URI, the write was refused, no answer within the time limit, ...).
    """
    _bounded_check(uri, subject, uri, "checking that a file can be written there",
                   lambda filesystem, path: _probe_writable(filesystem, path, subject, uri, in_parent))


def _probe_writable(filesystem: pafs.FileSystem, path: str, subject: str, uri: str, in_parent: bool) -> None:
    """:func:`check_writable`'s probe of ``path`` on ``filesystem``; the filesystem's errors propagate as they are."""
    if in_parent:
        path = posixpath.dirname(path.rstrip("/")) or path
    created = []  # the directories the probe makes, the deepest first
    try:
        info = filesystem.get_file_info(path)
        if info.type not in (pafs.FileType.NotFound, pafs.FileType.Directory):
            raise not_writable(subject, uri, _file_in_the_way(filesystem, path, uri, in_parent))
        if info.type == pafs.FileType.NotFound:
            cause = _file_in_the_way(filesystem, path, uri, in_parent)
            if cause:
                raise not_writable(subject, uri, cause)
            parent = path.rstrip("/")
            while parent and filesystem.get_file_info(parent).type == pafs.FileType.NotFound:
                created.append(parent)
                up = posixpath.dirname(parent)
                parent = "" if up == parent else up
            filesystem.create_dir(path, recursive=True)
        probe = f"{path.rstrip('/')}/{TEMP_PREFIX}probe-{uuid.uuid4().hex[:12]}"
        try:
            with filesystem.open_output_stream(probe) as out:
                out.write(b"sparkdl_avg")
        finally:
            with contextlib.suppress(Exception):
                filesystem.delete_file(probe)
    finally:
        if created:
            with contextlib.suppress(Exception):
                filesystem.delete_dir(created[-1])  # the topmost one the probe made, and what it holds


def not_writable(subject: str, uri: str, cause: str) -> PathError:
    """The ``PathError`` of an output location that cannot be written, in the package's words."""
    cause = " ".join(str(cause).split()).rstrip(".") or "the write failed"
    return PathError(f"{subject} must be a directory this process can write. Got {uri!r} instead: {cause}.")


def _file_in_the_way(filesystem: pafs.FileSystem, path: str, uri: str, in_parent: bool = False) -> str:
    """Why ``path`` cannot become a directory if a file is in the way (at it or above it), else ``""``."""
    current = path.rstrip("/")
    while current:
        info = filesystem.get_file_info(current)
        if info.type == pafs.FileType.File:
            if current == path.rstrip("/") and not in_parent:
                return "it is a file, not a directory"
            return f"{current!r} is a file, not a directory"
        if info.type == pafs.FileType.Directory:
            return ""
        up = posixpath.dirname(current)
        current = "" if up == current else up
    return ""


def make_writable_dir(uri: str, subject: str, given: str, private: bool = False) -> None:
    """:func:`make_dir`, raising ``PathError`` in the package's words when the directory cannot be made.

    On a remote filesystem it gives up after :func:`path_check_time_limit` (30 s by default).

    Args:
        subject: What the message calls the location the user gave (``"The 'staging_dir' parameter"``).
        given: The location the user gave (``uri`` or a directory above it), shown in the message.
        private: See :func:`make_dir`.

    Raises:
        PathError: "<subject> must be a directory this process can write. Got '<given>' instead: <cause>."
    """

    def make(filesystem: pafs.FileSystem, path: str) -> None:
        try:
            _make_dir(filesystem, path, private)
        except OSError:
            in_the_way = ""
            with contextlib.suppress(Exception):
                in_the_way = _file_in_the_way(filesystem, resolve(given)[1], given)
            if in_the_way:
                raise not_writable(subject, given, in_the_way) from None
            raise  # the filesystem's own words, which _bounded_check completes

    _bounded_check(uri, subject, given, "creating a directory there", make)


class OutputDir:
    """An output directory written all at once: files go to a local temporary directory, then into place.

    :meth:`check` fails early (before any training) when the directory exists, is not empty and ``overwrite`` is off,
    or cannot be written (probed as :func:`check_writable` does, where :meth:`commit` writes; on a remote filesystem
    within :func:`path_check_time_limit`). :meth:`commit` uploads the files to a hidden sibling and renames it into
    place; with ``overwrite`` an existing directory is renamed away first and deleted after. On filesystems without
    directory renames (object stores) the files are copied one by one (each appears whole) and ``_SUCCESS`` last; with
    ``overwrite`` an existing one loses its ``_SUCCESS`` first and the old files the new output lacks before the new
    ``_SUCCESS``. The local temporary directory is made on the first :meth:`file` (so a run that fails before writing
    leaves none) and deleted by :meth:`commit` and :meth:`cleanup`, except when ``commit(keep_on_error=True)`` fails:
    then it stays, and the error says where. Committed local directories and files get the usual modes (``0o777`` and
    ``0o666`` less the umask), not the temporary directory's ``0o700``.

    Args:
        uri: Local path or URI of the directory.
        overwrite: Replace an existing non-empty directory. Default ``False``.
        flag: What the messages call the directory. Default ``"--output-dir"`` (the jobs' flag).

    Raises:
        PathError: from :meth:`check` and :meth:`commit`, when the directory exists and ``overwrite`` is off, cannot
            be written, or ``pyarrow.fs`` cannot open ``uri``. The constructor reaches no storage (opening an
            ``hdfs://`` or ``s3://`` filesystem can wait on the network: :meth:`check` does it, within its time limit).
    """

    def __init__(self, uri: str, overwrite: bool = False, flag: str = "--output-dir") -> None:
        self.uri = uri
        self.overwrite = overwrite
        self.flag = flag
        self._resolved: Optional[Tuple[pafs.FileSystem, str]] = None
        self._local: Optional[str] = None

    @property
    def fs(self) -> pafs.FileSystem:
        """The directory's filesystem (:func:`resolve`), opened on first use."""
        return self._open()[0]

    @property
    def path(self) -> str:
        """The directory's path on :attr:`fs`."""
        return self._open()[1]

    def _open(self) -> Tuple[pafs.FileSystem, str]:
        if self._resolved is None:
            self._resolved = resolve(self.uri)
        return self._resolved

    @property
    def _renames(self) -> bool:
        """Whether directories are renamed atomically here (local filesystems and HDFS; not object stores)."""
        return _renames_dirs(self.fs)

    @property
    def local(self) -> str:
        """The local temporary directory the files are written to, made on first use."""
        if self._local is None:
            self._local = tempfile.mkdtemp(prefix="sparkdl_avg-output-")
        return self._local

    def check(self) -> None:
        """Raises ``PathError`` if :meth:`commit` would refuse or fail to write the directory (run it before any work)."""
        subject = f"The {self.flag} flag"
        self._check_named()

        def check(filesystem: pafs.FileSystem, path: str) -> None:
            if not self.overwrite and _exists(filesystem, path, empty_dir=False):
                raise PathError(f"Output directory {self.uri!r} already exists; pass --overwrite to replace it")
            # Where commit writes: a sibling renamed into place, or the directory itself on object stores.
            _probe_writable(filesystem, path, subject, self.uri, in_parent=_renames_dirs(filesystem))

        _bounded_check(self.uri, subject, self.uri, "checking that the output can be written there", check)

    def _check_named(self) -> None:
        # '' resolves to the working directory, whose files --overwrite would replace
        if not str(self.uri).strip():
            raise PathError(f"The {self.flag} flag must name a directory (a path or URI). Got {self.uri!r} instead.")

    def file(self, name: str) -> str:
        """The local path to write ``name`` to before :meth:`commit`."""
        return os.path.join(self.local, name)

    def write_json(self, name: str, data: Any) -> None:
        with open(self.file(name), "w") as f:
            json.dump(data, f, indent=1, default=str)

    def commit(self, keep_on_error: bool = False) -> str:
        """Puts the files in place; returns the directory's URI.

        Args:
            keep_on_error: When putting them in place fails, keep the local temporary directory (:meth:`cleanup` then
                leaves it) and raise a ``PathError`` that says where it is: for outputs that took long to make, such as
                a trained model. Default ``False``. Either way, a copy that failed part-way (a full disk) leaves nothing
                next to the directory.
        """
        try:
            return self._commit()
        except Exception as exc:
            if not keep_on_error or self._local is None:
                raise
            kept, self._local = self._local, None
            # Short, and the useful part first: a failed copytree's own text lists every file.
            raise PathError(
                f"Cannot write the {self.flag} {self.uri!r}: {write_failure(exc)}. Its files "
                f"({', '.join(sorted(os.listdir(kept)))}) were saved to {kept} instead; copy them from there."
            ) from exc

    def _commit(self) -> str:
        self.check()
        fs, path = self.fs, self.path
        if not self._renames:
            names = sorted(os.listdir(self.local))
            # Overwriting in place: the old _SUCCESS goes first, so that no reader takes the directory for complete
            # while it mixes old and new files, and files of the old output that the new one lacks go before the new.
            old = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(f"{path}/_SUCCESS")
            fs.create_dir(path, recursive=True)
            for name in names:
                pafs.copy_files(os.path.join(self.local, name), f"{path}/{name}", destination_filesystem=fs)
            for info in old:
                if info.base_name not in names and info.base_name != "_SUCCESS":
                    if info.type == pafs.FileType.Directory:
                        fs.delete_dir(info.path)
                    else:
                        fs.delete_file(info.path)
            with fs.open_output_stream(f"{path}/_SUCCESS"):
                pass
            self.cleanup()
            return self.uri
        parent = posixpath.dirname(path.rstrip("/"))
        tmp = _temp_path(path)
        fs.create_dir(parent, recursive=True)
        old = None
        try:
            if isinstance(fs, pafs.LocalFileSystem):
                shutil.copytree(self.local, tmp)
                _set_default_modes(tmp)
            else:
                pafs.copy_files(self.local, tmp, destination_filesystem=fs)
            if fs.get_file_info(path).type != pafs.FileType.NotFound:
                old = _temp_path(path, ".old")
                fs.move(path, old)
            fs.move(tmp, path)
        except BaseException:
            with contextlib.suppress(Exception):
                fs.delete_dir(tmp)
            if old is not None and fs.get_file_info(path).type == pafs.FileType.NotFound:
                fs.move(old, path)
            raise
        if old is not None:
            with contextlib.suppress(Exception):
                fs.delete_dir(old)
        self.cleanup()
        return self.uri

    def cleanup(self) -> None:
        """Deletes the local temporary directory (after :meth:`commit`, or instead of it)."""
        if self._local is not None:
            shutil.rmtree(self._local, ignore_errors=True)


def _renames_dirs(filesystem: pafs.FileSystem) -> bool:
    """Whether ``filesystem`` renames directories atomically (local filesystems and HDFS; not object stores)."""
    return filesystem.type_name in ("local", "hdfs")


def _set_default_modes(root: str) -> None:
    """Gives the local tree at ``root`` the modes a plain ``mkdir``/``open`` would: 0o777/0o666 less the umask."""
    umask = _umask()
    os.chmod(root, 0o777 & ~umask)
    for parent, dirs, files in os.walk(root):
        for name in dirs:
            os.chmod(os.path.join(parent, name), 0o777 & ~umask)
        for name in files:
            os.chmod(os.path.join(parent, name), 0o666 & ~umask)
