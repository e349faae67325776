"""Writing local files so that readers never see a half-written one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Iterator


@contextlib.contextmanager
def replace_atomically(path: str, suffix: str = "") -> Iterator[str]:
    """Yields a temporary path next to ``path``; renames it over ``path`` on success.

    An existing file at ``path`` stays untouched until the new one is
    complete; on an exception the temporary file is removed. The new file
    gets the usual permissions (``0o666`` less the umask).

    Args:
        path: The file to (re)place.
        suffix: Suffix of the temporary name (some writers, like Keras'
            ``model.save``, insist on an extension such as ``.keras``).
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=suffix)
    os.close(fd)
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise
