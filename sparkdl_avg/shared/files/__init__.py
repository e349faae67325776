"""Paths, URIs and file systems: the one place the package reaches storage (:mod:`.fs`)."""
