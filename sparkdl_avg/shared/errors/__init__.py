"""Errors across the driver/executor boundary (:mod:`.remote_errors`) and Ctrl-C during a fit (:mod:`.interrupt`)."""
