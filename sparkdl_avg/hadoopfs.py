"""Whole-file reads and writes on any filesystem Spark's own writers accept.

The Spark ML persistence of :mod:`sparkdl_avg.ml` keeps the Keras model as a
``model.keras`` file inside the stage's directory. These helpers go through
the JVM's Hadoop ``FileSystem`` (over Py4J, driver only), so the same paths
work as for ``df.write`` and ``PipelineModel.save``: local, ``hdfs://``,
``s3a://``, ``abfss://``, ``dbfs:/``, ...
"""

from __future__ import annotations


def _fs_and_path(sc, path: str):
    jvm = sc._jvm
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    return hpath.getFileSystem(sc._jsc.hadoopConfiguration()), hpath


def write_bytes(sc, path: str, data: bytes) -> None:
    """Writes ``data`` to a new file at ``path``; fails if the file exists."""
    fs, hpath = _fs_and_path(sc, path)
    out = fs.create(hpath, False)
    try:
        out.write(bytearray(data))
    finally:
        out.close()


def read_bytes(sc, path: str) -> bytes:
    """Reads the whole file at ``path``."""
    fs, hpath = _fs_and_path(sc, path)
    stream = fs.open(hpath)
    try:
        return bytes(sc._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
    finally:
        stream.close()
