"""Paths and URIs as ``pyarrow.fs`` filesystems, and the whole-file and directory operations on them.

:func:`resolve` turns a local path or URI (``hdfs://``, ``s3://``, ``gs://``, ...) into a filesystem
and a path on it; :func:`join`, :func:`exists`, :func:`read_bytes`, :func:`make_dir` and
:func:`remove_tree` work on any of them. The JVM's Hadoop ``FileSystem`` over Py4J (``hadoop_*``,
driver only) is the other route to storage, which the Spark ML persistence uses so that its paths are
exactly those Spark's own writers accept. Writes that readers must never see a part of are in
:mod:`.atomic`; the checks of output locations in :mod:`.fs`, which names all three modules' functions.
It holds no state and runs on executors too.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import pyarrow.fs as pafs

from ...errors import PathError

# Object stores: an object becomes visible only once its upload (one PUT, or
# a multipart upload's completion) has finished, and a "move" is a copy.
_OBJECT_STORES = ("S3FileSystem", "GcsFileSystem", "AzureFileSystem")


def user_path(path):
    """A path as the user gave it (``str`` or ``os.PathLike``) as the ``str`` the library works with: a local
    path's ``~`` expanded, as a shell would; a URI as it is; ``None`` as it is."""
    if path is None:
        return None
    path = os.fspath(path)
    return os.path.expanduser(path) if "://" not in path else path


def is_local(uri: str) -> bool:
    """Whether ``uri`` is a local path or a ``file://`` URI (else a remote filesystem's URI)."""
    return "://" not in uri or uri.startswith("file://")

def resolve(uri: str, retry_limit_s: Optional[float] = None) -> Tuple[pafs.FileSystem, str]:
    """The ``pyarrow.fs`` filesystem and the path on it for a local path or URI.

    Accepts local paths (made absolute), ``file://`` URIs and every URI ``pyarrow.fs.FileSystem.from_uri`` opens
    (``hdfs://``, ``s3://``, ``gs://``, ...); Hadoop's ``s3a://`` and ``s3n://`` are read as ``s3://``.

    Args:
        uri: Local path or URI.
        retry_limit_s: For ``gs://`` (``gcs://``) URIs without a ``retry_limit_seconds`` of their own: how long the
            GCS client may retry a request, in seconds (its default is many minutes). Other filesystems take no such
            option from a URI. Default ``None``: the filesystem's own.

    Raises:
        PathError: ``pyarrow.fs`` cannot open the URI (an unknown scheme, a missing ``libhdfs``, an unreachable name
            node, ...).
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
    for _ in range(3):
        try:
            filesystem.delete_dir(path)
            return
        except FileNotFoundError:  # gone, or a part of it deleted at once by another thread: the rest is still there
            if filesystem.get_file_info(path).type == pafs.FileType.NotFound:
                return


def make_dir(uri: str, private: bool = False) -> None:
    """Creates the directory at ``uri`` and its missing parents; an existing one is fine.

    Args:
        uri: Local path or URI.
        private: For a local directory: mode ``0o700`` (its owner only, like Spark's local scratch directories), also
            when it already exists. Ignored on other filesystems, whose own permissions apply.
    """
    filesystem, path = resolve(uri)
    _make_dir(filesystem, path, private)


def _make_dir(filesystem: pafs.FileSystem, path: str, private: bool) -> None:
    if private and filesystem.type_name == "local":
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)
        return
    filesystem.create_dir(path, recursive=True)


def read_bytes(uri: str) -> bytes:
    """The whole file at ``uri``.

    Raises:
        FileNotFoundError: no file there (``OSError`` for other failures).
    """
    filesystem, path = resolve(uri)
    with filesystem.open_input_stream(path) as f:
        return f.read()


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
