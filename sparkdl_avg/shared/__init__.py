"""What both sides import: staged data, the round's wire formats, the model's spec, the error protocol, files.

Code here imports neither :mod:`sparkdl_avg.driver` nor :mod:`sparkdl_avg.executor`
(``tests/test_layering.py``). Its folders, and one module:

- :mod:`.data`: the staged dataset, its columns, the example order, preprocessing, value checks;
- :mod:`.wire`: what a round's tasks read and hand back (partial sums, compressed deltas, exchange files, standing jobs, local states, stats records);
- :mod:`.model`: the compiled model described for executors, custom objects, GPUs, TensorFlow's quiet import;
- :mod:`.errors`: errors raised on executors and re-raised on the driver, Ctrl-C during a fit;
- :mod:`.files`: paths, URIs and file systems (``pyarrow.fs``);
- :mod:`.registry`: the one registry idiom, classes found by name (rules, transports, adapters, column kinds).
"""
