"""Writes that readers never see a part of, whole copies, and what a failed write says.

:func:`open_atomically` and :func:`write_atomically` (any filesystem: a temporary name next to the
file, then a rename; one PUT on object stores), :func:`replace_atomically` (local files written by a
library that wants a path, such as Keras' ``model.save``), :func:`download` and :func:`local_copy`
(a file brought here whole), :func:`refuse_existing` (a job's output without ``--overwrite``), and
:func:`is_full` / :func:`write_failure` (why a write failed, in a few words). Temporary names start
with :data:`TEMP_PREFIX`, which readers that list a directory skip. It holds no state and runs on
executors too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import shutil
import tempfile
import uuid
from typing import BinaryIO, Iterator

import pyarrow.fs as pafs

from ...errors import PathError
from .uris import _OBJECT_STORES, resolve

# Names of temporary files (and directories) written next to their target;
# readers that list a directory (checkpoint.latest) skip them by this prefix.
TEMP_PREFIX = ".tmp-"


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


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

    The stream writes a temporary file next to ``uri``; when the block ends without an error it is moved over ``uri``
    (a rename locally and on HDFS, so a reader sees the old file or the new one, never a part), otherwise it is
    deleted. On HDFS replacing a file is delete + rename.

    Args:
        uri: Local path or URI of the file.
        overwrite: Replace an existing file. Default ``True``.
        parents: Create missing parent directories. Default ``True``; without, a missing directory fails the write
            (``OSError``).

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

    Every file :mod:`sparkdl_avg.driver.checkpoint.files` writes goes through here (the tests inject write failures
    by replacing this function).

    Args:
        uri: Local path or URI of the file; parent directories are created.
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

    For writers that insist on a local path of their own (Keras' ``model.save``, Plotly's ``write_html``, ``open``).
    An existing file at ``path`` stays untouched until the new one is complete; on an exception the temporary file is
    removed. The new file gets the usual permissions (``0o666`` less the umask).

    Args:
        path: The local file to (re)place.
        suffix: Suffix of the temporary name (some writers, like Keras' ``model.save``, insist on an extension such as
            ``.keras``).
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
            raise PathError(f"No such file: {uri!r}; expected an existing file (check the path, and that this "
                            "machine can reach it).")
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


# What a full filesystem says, by errno and in the text of errors that carry none (pyarrow keeps the
# errno; shutil.copytree's Error only lists "[Errno 28] No space left on device" per file).
_FULL = {errno.ENOSPC: "No space left on device", errno.EDQUOT: "Disk quota exceeded"}


def is_full(exc: BaseException) -> bool:
    """Whether ``exc`` is a write that failed because the filesystem has no room left (``ENOSPC``, ``EDQUOT``)."""
    return isinstance(exc, OSError) and (exc.errno in _FULL or any(text in str(exc) for text in _FULL.values()))


def write_failure(exc: BaseException) -> str:
    """Why a write failed, in a few words on one line, for messages that go on to say what is intact.

    ``"the disk is full (no space left on device)"`` (or ``"the disk quota is exceeded"``) when :func:`is_full`; else
    the error's own text, and for ``shutil.copytree``'s ``Error``, which lists every file that failed, the first
    file's reason only.
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
