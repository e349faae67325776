"""What crosses between the driver and the executors in a round: its formats, files and protocols.

Its modules:

* :mod:`.aggregation`: partial results of a round and their example-weighted sums.
* :mod:`.board`: the standing round job's board: the protocol's one implementation, as step programs over a
  store of entries.
* :mod:`.compression`: compressed deltas: the codecs a worker's round delta can travel in, and error feedback.
* :mod:`.exchange`: what tasks carry to read the round's state and hand back sums (state sources, result
  sinks), the plain and compressed sums' layouts, the raw array format.
* :mod:`.delta_sums`: compressed round sums (``update_compression``): a worker's delta on the wire, its
  shards' sums, its residual.
* :mod:`.fragments`: ``sync_fragments``: the executors' half of fragment rounds (Streaming DiLoCo): own
  weights, adoption, what returns.
* :mod:`.kept`: what a worker keeps between rounds, the executors' half: one protocol around training, one view
  of the worker's round, the files chained from round to round.
* :mod:`.local_broadcast`: what stands for a Spark broadcast where rounds run without Spark (the in-process
  engine).
* :mod:`.local_state`: ``optimizer_state="local"``: each worker's own optimizer variables between its rounds,
  as files.
* :mod:`.round_rows`: the Spark SQL round's rows: what its tasks yield (:class:`ArrowSums`,
  :class:`StoreFlat`) and its reducers sum.
* :mod:`.sparse_rows`: rounds that carry what changed: a worker sends only the rows of its embedding tables
  that moved, with their indices.
* :mod:`.standing`: the standing round job's board as files in a directory (executors on the driver's host).
* :mod:`.standing_net`: the standing round job's protocol through the driver's socket: for executors on hosts
  of their own.
* :mod:`.state_patch`: a round's state as a base the executors keep and the chain of patches since (each round's
  against the round before): the patch format, both halves.
* :mod:`.stats`: the typed round and worker records (``trainer.stats``, ``stats.json``).
"""
