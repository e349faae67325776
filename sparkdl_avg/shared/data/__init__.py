"""Staged data, as both sides see it: the staged dataset's format, its columns and their kinds (one registry), exact value conversions, the example order, preprocessing, value checks.

Its other modules:

* :mod:`.example_order`: which examples each worker trains on, in which round of which epoch.
* :mod:`.preprocess`: the user's preprocessing function: shipped to executors, called per minibatch, its
  output checked.
* :mod:`.staged_dataset`: the staged dataset: its description, its on-disk format (Arrow IPC files written
  once per fit) and its reading.
* :mod:`.value_checks`: the value checks of staged data: what ``check_data`` checks and the messages that name
  the culprit.
"""
