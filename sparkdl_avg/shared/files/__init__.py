"""Paths, URIs and file systems: the one place the package reaches storage, importable from :mod:`.fs`.

:mod:`.uris` (a path or URI as a ``pyarrow.fs`` filesystem; whole-file operations; Hadoop's ``FileSystem``),
:mod:`.atomic` (writes readers never see a part of; whole copies; why a write failed) and :mod:`.fs` (the
checks of output locations, the jobs' output directory, and every name of the other two).
"""
