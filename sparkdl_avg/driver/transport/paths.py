"""The old module of the state transports, whose names now live in the modules of :mod:`sparkdl_avg.driver.transport`.

Kept so that references and scripts naming ``transport.paths`` keep
working: :func:`choose` and the ``"auto"`` rules in :mod:`.policy`, the
protocol and settings in :mod:`.base`, one module per transport
(:mod:`.spark`, :mod:`.files`, :mod:`.sql`), the aggregation paths in
:mod:`.sql_paths`, the standing job in :mod:`.standing`, the shard keys in
:mod:`.murmur3`. Setting a module constant here changes nothing: set it
where it lives.
"""

from .base import AGGREGATIONS, TRANSPORTS, Published, StateTransport, TransportSettings  # noqa: F401
from .files import FileTransport  # noqa: F401
from .murmur3 import shard_keys, spark_int_hash  # noqa: F401
from .policy import (  # noqa: F401
    DEFAULT_NETWORK_RATE,
    DRIVER_SUM_BYTES,
    SHARDED_STAGE_S,
    SPARK_TREE_BYTES,
    choose,
    driver_bound_pays,
    plan_aggregation,
)
from .spark import SparkTransport  # noqa: F401
from .sql import SqlTransport  # noqa: F401
from .sql_paths import assemble, read_rows  # noqa: F401
from .standing import STANDING, STANDING_CLOSE_S, STANDING_DEADLINE_S, STANDING_IDLE_S  # noqa: F401
