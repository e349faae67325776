"""Paths, URIs and filesystems: the one place where the package reaches storage.

This module owns how a local path or URI becomes a ``pyarrow.fs`` filesystem
and a path on it (:func:`resolve`), the package's whole-file operations on
any such filesystem (:func:`read_bytes`, :func:`exists`, :func:`remove_tree`,
:func:`download`, :func:`local_copy`), the check that an output location
can be written, run before the work whose results go there
(:func:`check_writable`, :func:`make_writable_dir`; on a remote filesystem
bounded by :func:`path_check_time_limit`), its two ways of replacing a file
atomically (:func:`replace_atomically` for local files written by a library
that wants a path, such as Keras' ``model.save``; :func:`open_atomically` and
:func:`write_atomically` for any filesystem), the jobs' all-or-nothing output
directory (:class:`OutputDir`) and the other route to storage, the JVM's
Hadoop ``FileSystem`` over Py4J (``hadoop_*``, driver only), which the Spark
ML persistence uses so that its paths are exactly those Spark's own writers
accept. Everything else (staging, checkpoints, the exchange files, the jobs)
goes through here. It holds no state and runs on executors too.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import posixpath
import shutil
import tempfile
import threading
import time
import uuid
from typing import Any, BinaryIO, Callable, Iterator, Optional, Tuple

import pyarrow.fs as pafs

from ...errors import ConfigurationError, PathError

# Names of temporary files (and directories) written next to their target;
# readers that list a directory (checkpoint.latest) skip them by this prefix.
TEMP_PREFIX = ".tmp-"

# Object stores: an object becomes visible only once its upload (one PUT, or
# a multipart upload's completion) has finished, and a "move" is a copy.
_OBJECT_STORES = ("S3FileSystem", "GcsFileSystem", "AzureFileSystem")

# The longest a check of a remote location may take, in seconds (see path_check_time_limit): without a
# limit a gs:// bucket that does not exist, with no credentials, kept pyarrow's GCS client retrying in
# silence for about ten minutes before the fit could say anything.
PATH_CHECK_TIME_LIMIT_S = 30.0
PATH_CHECK_TIME_LIMIT_ENV = "SPARKDL_AVG_PATH_CHECK_TIME_LIMIT_S"


def path_check_time_limit() -> float:
    """How long a check of a remote location may take before it fails, in seconds.

    The environment variable ``SPARKDL_AVG_PATH_CHECK_TIME_LIMIT_S`` when set
    (read at each check), else :data:`PATH_CHECK_TIME_LIMIT_S` (30 s).

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


def is_local(uri: str) -> bool:
    """Whether ``uri`` is a local path or a ``file://`` URI (else a remote filesystem's URI)."""
    return "://" not in uri or uri.startswith("file://")

def resolve(uri: str, retry_limit_s: Optional[float] = None) -> Tuple[pafs.FileSystem, str]:
    """The ``pyarrow.fs`` filesystem and the path on it for a local path or URI.

    Accepts local paths (made absolute), ``file://`` URIs and every URI
    ``pyarrow.fs.FileSystem.from_uri`` opens (``hdfs://``, ``s3://``,
    ``gs://``, ...); Hadoop's ``s3a://`` and ``s3n://`` are read as ``s3://``.

    Args:
        uri: Local path or URI.
        retry_limit_s: For ``gs://`` (``gcs://``) URIs without a
            ``retry_limit_seconds`` of their own: how long the GCS client may
            retry a request, in seconds (its default is many minutes). Other
            filesystems take no such option from a URI. Default ``None``: the
            filesystem's own.

    Raises:
        PathError: ``pyarrow.fs`` cannot open the URI (an unknown scheme, a
            missing ``libhdfs``, an unreachable name node, ...).
    """
    given = uri
    if uri.startswith(("s3a://", "s3n://")):
        uri = "s3://" + uri.split("://", 1)[1]
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    if retry_limit_s is not None and uri.startswith(("gs://", "gcs://")) and "retry_limit_seconds=" not in uri:
        uri += ("&" if "?" in uri else "?") + f"retry_limit_seconds={retry_limit_s:g}"
    try:
        return pafs.FileSystem.from_uri(uri)
    except Exception as exc:  # ArrowInvalid for the URI itself, OSError for the connection
        raise PathError(f"Cannot open {given!r} with pyarrow.fs: {exc}") from None


def join(base: str, name: str) -> str:
    """``base`` (a directory's path or URI) and ``name`` joined with one ``/``."""
    return base.rstrip("/") + "/" + name


def exists(uri: str, empty_dir: bool = True) -> bool:
    """Whether a file or directory is at ``uri``.

    Args:
        uri: Local path or URI.
        empty_dir: Whether an empty directory counts. Default ``True``.
    """
    filesystem, path = resolve(uri)
    return _exists(filesystem, path, empty_dir)


def _exists(filesystem: pafs.FileSystem, path: str, empty_dir: bool = True) -> bool:
    info = filesystem.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        return False
    if info.type == pafs.FileType.Directory and not empty_dir:
        return bool(filesystem.get_file_info(pafs.FileSelector(path, allow_not_found=True)))
    return True


def remove_tree(uri: str) -> None:
    """Deletes the directory at ``uri`` and everything in it; a missing one is fine."""
    filesystem, path = resolve(uri)
    with contextlib.suppress(FileNotFoundError):
        filesystem.delete_dir(path)


def make_dir(uri: str, private: bool = False) -> None:
    """Creates the directory at ``uri`` and its missing parents; an existing one is fine.

    Args:
        uri: Local path or URI.
        private: For a local directory: mode ``0o700`` (its owner only, like
            Spark's local scratch directories), also when it already exists.
            Ignored on other filesystems, whose own permissions apply.
    """
    filesystem, path = resolve(uri)
    _make_dir(filesystem, path, private)


def _make_dir(filesystem: pafs.FileSystem, path: str, private: bool) -> None:
    if private and filesystem.type_name == "local":
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)
        return
    filesystem.create_dir(path, recursive=True)


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

    A local check runs here: the operating system answers at once. A remote
    one (opening the filesystem included: ``hdfs://`` connects there) runs
    in a daemon thread that the caller waits for at most the limit, with the
    GCS client's retries limited to a sixth of it (its backoff overshoots
    that up to twice, and a check makes several requests) so that its own
    error (no credentials, no such bucket) usually comes first. A check still
    waiting at the limit is left to end by itself (removing, as always, the
    directories it made).

    Args:
        uri: The location checked.
        subject: What the messages call it (``"The 'checkpoint_dir' parameter"``).
        shown: The location the messages show: the one the user gave (``uri``, or a directory above it).
        what: What the check does, for the messages (``"checking that a file can be written there"``).
        check: The check: raises ``PathError`` in the package's words, or any
            other exception, which becomes :func:`not_writable`'s.

    Raises:
        PathError: from ``check``, or "<subject> must be a directory this
            process can write. Got '<shown>' instead: <cause>.", where for a
            remote location the cause names the filesystem's operation, how
            long it took and the time limit.
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

    The check for an output location, run before any work that writing there
    at the end would lose: it creates the directory (with its missing
    parents), writes and deletes a small probe file in it, then removes the
    directories it created, so a location that passes is left as it was.
    On a remote filesystem it gives up after :func:`path_check_time_limit`
    (30 s by default).

    Args:
        uri: Local path or URI of the directory.
        subject: What the message calls it, e.g. ``"The 'checkpoint_dir'
            parameter"`` or ``"The --output-dir flag"``.
        in_parent: Probe the directory that holds ``uri`` instead (where an
            output written to a sibling and renamed into place is written).

    Raises:
        PathError: "<subject> must be a directory this process can write.
            Got '<uri>' instead: <cause>." (a file is in the way, no
            filesystem opens the URI, the write was refused, no answer
            within the time limit, ...).
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


# What a full filesystem says, by errno and in the text of errors that carry none (pyarrow keeps the
# errno; shutil.copytree's Error only lists "[Errno 28] No space left on device" per file).
_FULL = {errno.ENOSPC: "No space left on device", errno.EDQUOT: "Disk quota exceeded"}


def is_full(exc: BaseException) -> bool:
    """Whether ``exc`` is a write that failed because the filesystem has no room left (``ENOSPC``, ``EDQUOT``)."""
    return isinstance(exc, OSError) and (exc.errno in _FULL or any(text in str(exc) for text in _FULL.values()))


def write_failure(exc: BaseException) -> str:
    """Why a write failed, in a few words on one line, for messages that go on to say what is intact.

    ``"the disk is full (no space left on device)"`` (or ``"the disk quota
    is exceeded"``) when :func:`is_full`; else the error's own text, and for
    ``shutil.copytree``'s ``Error``, which lists every file that failed, the
    first file's reason only.
    """
    if is_full(exc):
        quota = exc.errno == errno.EDQUOT or _FULL[errno.EDQUOT] in str(exc)
        return "the disk quota is exceeded" if quota else "the disk is full (no space left on device)"
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list) and exc.args[0]:
        first = exc.args[0][0]  # (source, destination, why)
        cause = str(first[-1]) if isinstance(first, tuple) else str(first)
    else:
        cause = str(exc) or type(exc).__name__
    return " ".join(cause.split()).rstrip(".")


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
        uri: The directory to make.
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


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def read_bytes(uri: str) -> bytes:
    """The whole file at ``uri``.

    Raises:
        FileNotFoundError: no file there (``OSError`` for other failures).
    """
    filesystem, path = resolve(uri)
    with filesystem.open_input_stream(path) as f:
        return f.read()


def _temp_path(path: str, suffix: str = "") -> str:
    """A unique name next to ``path``: same directory, so that moving it over ``path`` is a rename."""
    parent, base = posixpath.split(path.rstrip("/"))
    return f"{parent}/{TEMP_PREFIX}{base}-{uuid.uuid4().hex[:12]}{suffix}"


def refuse_existing(uri: str) -> None:
    """Raises ``PathError`` if something exists at ``uri`` (a job's output without ``--overwrite``)."""
    filesystem, path = resolve(uri)
    _refuse_existing(filesystem, path, uri)


def _refuse_existing(filesystem: pafs.FileSystem, path: str, uri: str) -> None:
    if filesystem.get_file_info(path).type != pafs.FileType.NotFound:
        raise PathError(f"{uri!r} already exists; pass --overwrite to replace it")


@contextlib.contextmanager
def open_atomically(uri: str, overwrite: bool = True, parents: bool = True) -> Iterator[BinaryIO]:
    """Yields a binary output stream whose bytes appear at ``uri`` all at once.

    The stream writes a temporary file next to ``uri``; when the block ends
    without an error it is moved over ``uri`` (a rename locally and on HDFS,
    so a reader sees the old file or the new one, never a part), otherwise
    it is deleted. On HDFS replacing a file is delete + rename.

    Args:
        uri: Local path or URI of the file.
        overwrite: Replace an existing file. Default ``True``.
        parents: Create missing parent directories. Default ``True``;
            without, a missing directory fails the write (``OSError``).

    Raises:
        PathError: ``overwrite`` is off and something exists at ``uri``.
    """
    filesystem, path = resolve(uri)
    if not overwrite:
        _refuse_existing(filesystem, path, uri)
    if parents:
        filesystem.create_dir(posixpath.dirname(path), recursive=True)
    tmp = _temp_path(path)
    try:
        with filesystem.open_output_stream(tmp) as out:
            yield out
        filesystem.move(tmp, path)
    except BaseException:
        with contextlib.suppress(Exception):
            filesystem.delete_file(tmp)
        raise


def write_atomically(uri: str, data: bytes, overwrite: bool = True) -> None:
    """Writes ``data`` as the file at ``uri`` so that readers never see a part of it.

    Every file :mod:`sparkdl_avg.driver.checkpoint.files` writes goes through here (the
    tests inject write failures by replacing this function).

    Args:
        uri: Local path or URI of the file; parent directories are created.
        data: The file's bytes.
        overwrite: Replace an existing file. Default ``True``.

    Raises:
        PathError: ``overwrite`` is off and something exists at ``uri``.
    """
    filesystem, path = resolve(uri)
    if type(filesystem).__name__ in _OBJECT_STORES:
        if not overwrite:
            _refuse_existing(filesystem, path, uri)
        # No rename on object stores (a move is a server-side copy), and none is needed:
        # the bytes are all here, and an object appears only once its upload completes,
        # so this single PUT is already atomic.
        with filesystem.open_output_stream(path) as out:
            out.write(data)
        return
    with open_atomically(uri, overwrite) as out:
        out.write(data)


@contextlib.contextmanager
def replace_atomically(path: str, suffix: str = "") -> Iterator[str]:
    """Yields a temporary local path next to ``path``; renames it over ``path`` on success.

    For writers that insist on a local path of their own (Keras'
    ``model.save``, Plotly's ``write_html``, ``open``). An existing file at
    ``path`` stays untouched until the new one is complete; on an exception
    the temporary file is removed. The new file gets the usual permissions
    (``0o666`` less the umask).

    Args:
        path: The local file to (re)place.
        suffix: Suffix of the temporary name (some writers, like Keras'
            ``model.save``, insist on an extension such as ``.keras``).
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    # mkstemp reserves the name, so two writers never share a temporary file.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=TEMP_PREFIX, suffix=suffix)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp made it 0o600
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def download(uri: str, local_path: str) -> None:
    """Copies the file at ``uri`` to the local file ``local_path``, whole (through a temporary name).

    Raises:
        FileNotFoundError: no file at ``uri``.
    """
    filesystem, path = resolve(uri)
    with replace_atomically(local_path) as tmp:
        with filesystem.open_input_stream(path) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)  # 4 MiB chunks


@contextlib.contextmanager
def local_copy(uri: str) -> Iterator[str]:
    """Yields a local path holding the file at ``uri``: the path itself when local, else a temporary copy.

    Raises:
        PathError: no file at ``uri``.
    """
    filesystem, path = resolve(uri)
    if isinstance(filesystem, pafs.LocalFileSystem):
        if not os.path.isfile(path):
            raise PathError(f"No such file: {uri!r}")
        yield path
        return
    tmp = tempfile.mkdtemp(prefix="sparkdl_avg-model-")
    try:
        local = os.path.join(tmp, os.path.basename(path) or "model.keras")
        try:
            download(uri, local)
        except FileNotFoundError:
            raise PathError(f"No such file: {uri!r}") from None
        yield local
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class OutputDir:
    """An output directory written all at once: files go to a local temporary directory, then into place.

    :meth:`check` fails early (before any training) when the directory exists,
    is not empty and ``overwrite`` is off, or cannot be written (probed as
    :func:`check_writable` does, where :meth:`commit` writes; on a remote
    filesystem within :func:`path_check_time_limit`). :meth:`commit` uploads the files to
    a hidden sibling and renames it into place; with ``overwrite`` an
    existing directory is renamed away first and deleted after. On
    filesystems without directory renames (object stores) the files are
    copied one by one (each appears whole) and ``_SUCCESS`` last; with
    ``overwrite`` an existing one loses its ``_SUCCESS`` first and the old
    files the new output lacks before the new ``_SUCCESS``. The local
    temporary directory is made on the first :meth:`file` (so a run that
    fails before writing leaves none) and deleted by :meth:`commit` and
    :meth:`cleanup`, except when ``commit(keep_on_error=True)`` fails: then it
    stays, and the error says where. Committed local directories and files get the usual
    modes (``0o777`` and ``0o666`` less the umask), not the temporary
    directory's ``0o700``.

    Args:
        uri: Local path or URI of the directory.
        overwrite: Replace an existing non-empty directory. Default ``False``.
        flag: What the messages call the directory. Default ``"--output-dir"`` (the jobs' flag).

    Raises:
        PathError: from :meth:`check` and :meth:`commit`, when the directory
            exists and ``overwrite`` is off, cannot be written, or
            ``pyarrow.fs`` cannot open ``uri``. The constructor reaches no
            storage (opening an ``hdfs://`` or ``s3://`` filesystem can wait
            on the network: :meth:`check` does it, within its time limit).
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
            keep_on_error: When putting them in place fails, keep the local
                temporary directory (:meth:`cleanup` then leaves it) and raise
                a ``PathError`` that says where it is: for outputs that took
                long to make, such as a trained model. Default ``False``.
                Either way, a copy that failed part-way (a full disk) leaves
                nothing next to the directory.
        """
        try:
            return self._commit()
        except Exception as exc:
            if not keep_on_error or self._local is None:
                raise
            kept, self._local = self._local, None
            # Short, and the useful part first: a failed copytree's own text lists every file, ~1 kB.
            raise PathError(
                f"Cannot write the {self.flag} {self.uri!r}: {write_failure(exc)}. Its files "
                f"({', '.join(sorted(os.listdir(kept)))}) were saved to {kept} instead; copy them from there."
            ) from exc

    def _commit(self) -> str:
        self.check()
        fs, path = self.fs, self.path
        # Directory renames are atomic only on local filesystems and HDFS.
        if not self._renames:
            names = sorted(os.listdir(self.local))
            # Overwriting in place: the old _SUCCESS goes first, so that no reader takes the
            # directory for complete while it mixes old and new files, and files of the old
            # output that the new one lacks go before the new _SUCCESS.
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


# ------------------------------------------------ Hadoop FileSystem (driver only)
#
# Spark ML persistence writes its metadata with Spark's own writers, so the
# model file beside it must go wherever they go: local, hdfs://, s3a://,
# abfss://, dbfs:/, ... That is the JVM's Hadoop FileSystem, reached through
# the SparkContext's Py4J gateway, not pyarrow.fs.


def _hadoop_fs_and_path(sc, path: str):
    hpath = sc._jvm.org.apache.hadoop.fs.Path(path)
    return hpath.getFileSystem(sc._jsc.hadoopConfiguration()), hpath


def hadoop_write_bytes(sc, path: str, data: bytes) -> None:
    """Writes ``data`` to a new file at ``path`` through Hadoop's ``FileSystem``; fails if the file exists."""
    filesystem, hpath = _hadoop_fs_and_path(sc, path)
    out = filesystem.create(hpath, False)
    try:
        out.write(bytearray(data))
    finally:
        out.close()


def hadoop_read_bytes(sc, path: str) -> bytes:
    """The whole file at ``path``, read through Hadoop's ``FileSystem``."""
    filesystem, hpath = _hadoop_fs_and_path(sc, path)
    stream = filesystem.open(hpath)
    try:
        return bytes(sc._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
    finally:
        stream.close()


def hadoop_exists(sc, path: str) -> bool:
    """Whether anything is at ``path``, asked of Hadoop's ``FileSystem`` (any path Spark writes)."""
    filesystem, hpath = _hadoop_fs_and_path(sc, path)
    return bool(filesystem.exists(hpath))
