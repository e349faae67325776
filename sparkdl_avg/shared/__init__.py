"""What both sides import: formats, records, the example order, the error protocol, file systems.

Code here imports neither :mod:`sparkdl_avg.driver` nor :mod:`sparkdl_avg.executor`
(``tests/test_layering.py``).
"""
