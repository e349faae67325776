"""What ``"auto"`` chooses, from benchmarks: the state transport of a fit (:func:`choose`) and the Spark SQL round's aggregation (:func:`plan_aggregation`).

The rules and their constants come from measurements (docs/benchmarks.md,
"Aggregation paths" and "On a shaped network"). :func:`choose` also builds
the chosen transport, found by name in
:data:`~sparkdl_avg.driver.config.options.TRANSPORTS`.
"""

from __future__ import annotations

import logging
from typing import Optional, Tuple

from ...errors import ConfigurationError
from ...shared.files.fs import join
from ..config.options import AGGREGATIONS, TRANSPORTS, parse_rate
from .base import Site, StateTransport, TransportSettings

logger = logging.getLogger("sparkdl_avg")

#: At most this many bytes of sums per round in all (workers × one model's sums) go straight to the driver
#: under ``aggregation="auto"`` when every executor shares the driver's host; above, reducers sum them from the
#: staging storage: the largest size at which the driver path measured at least as fast on one host
#: (docs/benchmarks.md, "Aggregation paths").
DRIVER_SUM_BYTES = 48 << 20

#: On a classic session whose executors share the driver's host but not its files (a local master with a URI
#: staging directory), ``state_transport="auto"`` keeps Spark's broadcast + ``treeAggregate`` for rounds of at
#: most this many bytes of sums in all, where it measured faster than the Spark SQL round on one host
#: (docs/benchmarks.md, "Aggregation paths").
SPARK_TREE_BYTES = 64 << 20

#: The driver's link rate ``auto`` assumes on a multi-host cluster when ``network_rate`` is not given: 1 Gbit/s.
DEFAULT_NETWORK_RATE = "1gbit"

#: Seconds a sharded round (a second stage of reducer tasks after a shuffle) costs beyond a driver-bound one
#: whatever the model's size: measured on the shaped-network cluster at 10^5 parameters, whose bytes take almost
#: no time on the wire (docs/benchmarks.md, "On a shaped network").
SHARDED_STAGE_S = 0.3


def driver_bound_pays(num_workers: int, nbytes: int, rate_bytes_s: float) -> bool:
    """Whether bringing every worker's sums through the driver's link beats sharding them, on hosts of their own.

    A driver-bound round (Spark's tree at depth 1, the SQL round's ``"driver"``)
    moves ``N × S`` bytes in through the driver's link. A sharded one
    (``"shuffle"``) first exchanges the slices among the workers (each
    worker's link carries ``(N - 1)/N · S`` out and as much in), then brings
    the ``N`` summed slices, ``S`` in all, in through the driver's link, the
    two one after the other, besides the second stage's own cost
    (:data:`SHARDED_STAGE_S`): ``(2 - 1/N) · S / rate + SHARDED_STAGE_S``
    where the workers' links are as fast as the driver's. So the driver path
    pays while ``(N - 1)²/N · S / rate <= SHARDED_STAGE_S`` (at 1 Gbit/s,
    which of the benchmarked sizes pass: docs/benchmarks.md, "On a shaped
    network") and the ``N`` sums together stay within
    :data:`SPARK_TREE_BYTES`, which the driver holds at once (however fast the
    link: ``spark.driver.maxResultSize`` and its memory). The exchange was
    left out until 2026-12-07: on 3 hosts at 100 Mbit/s with 4 MB of sums each
    that made the shuffle look 0.34 s a round cheaper than the tree, and its
    rounds took 5.5-6.8 s against the tree's 4.0-4.6 s
    (docs/benchmarks/overlap_fits.md).
    """
    beyond = (num_workers - 1) ** 2 / num_workers * nbytes / rate_bytes_s  # N·S - (2 - 1/N)·S, in seconds
    return beyond <= SHARDED_STAGE_S and num_workers * nbytes <= SPARK_TREE_BYTES


def plan_aggregation(aggregation: str, shards: Optional[int], num_workers: int, nbytes: int,
                     network_rate: Optional[float] = None, one_host_files: bool = False) -> Tuple[str, int]:
    """``(aggregation, shards)`` the Spark SQL round uses (see :mod:`.sql_paths`).

    ``"auto"`` with ``one_host_files`` (Spark Connect with a local server
    and staging directory: client and executors share its files) reads the
    workers' files on the driver. On hosts of their own (``network_rate``:
    the driver's link, bytes/s) it sums on the driver while
    :func:`driver_bound_pays`, else through the shuffle, which measured
    faster than the storage reducers on the shaped-network cluster at every
    size (the store's HTTP requests, its one link and its CPU;
    docs/benchmarks.md, "On a shaped network"). With ``network_rate=None``
    (every executor on the driver's host) it sums on the driver when all the
    workers' sums together are at most :data:`DRIVER_SUM_BYTES`, else
    through the staging storage, which measured faster than the shuffle
    there. A path that is not sharded takes one shard; ``shards=None`` gives
    one shard per worker, each at least 256 kB, and enough shards that none
    exceeds 64 MB.
    """
    how = aggregation
    if how == "auto":
        if one_host_files:
            how = "files"
        elif network_rate is not None:
            how = "driver" if driver_bound_pays(num_workers, nbytes, network_rate) else "shuffle"
        else:
            how = "driver" if num_workers * nbytes <= DRIVER_SUM_BYTES else "storage"
    if not AGGREGATIONS.get(how).sharded:
        return how, 1
    if shards is None:
        # At most 64 MB per slice: one Arrow binary value each, well under Spark Connect's 128 MB messages.
        shards = max(1, min(num_workers, nbytes // (256 << 10)), -(-nbytes // (64 << 20)))
    return how, int(shards)


def auto_transport(settings: TransportSettings, site: Site) -> str:
    """The state transport ``state_transport="auto"`` takes (the rule: :func:`choose`)."""
    if site.connect:
        return "sql"
    if settings.overlap and settings.standing:
        # overlap_rounds: the Spark SQL round's standing job, where rounds are announced a round ahead (through
        # local files on one host, else through the driver's socket); standing_rounds="off" chooses as below
        return "sql"
    if site.local_fs and site.one_host:
        return "files"
    n, nbytes = settings.num_workers, settings.sums_bytes
    if n is not None and nbytes is not None:
        tree = driver_bound_pays(n, nbytes, site.rate) if site.rate is not None else n * nbytes <= SPARK_TREE_BYTES
        if tree:
            return "spark"
    return "sql"


#: Spark settings with which a session encrypts its own traffic (RPC and block transfers, or TLS); the standing job's
#: socket (:mod:`sparkdl_avg.shared.wire.standing_net`) is authenticated by a key, not encrypted.
ENCRYPTION_SETTINGS = ("spark.network.crypto.enabled", "spark.ssl.enabled")


def local_staging(root: str) -> bool:
    """Whether a staging root is a local directory: by its URI's scheme (resolving an hdfs:// or s3:// root would
    connect to it)."""
    return "://" not in root or root.startswith("file://")


def round_socket(overlap: bool, standing_rounds: str, connect: bool, one_host: bool, local_fs: bool) -> bool:
    """Whether a fit's overlapped rounds run through the driver's socket: ``overlap_rounds`` on a classic session, in
    a standing job (not ``standing_rounds="off"``), unless the executors share the driver's host and a local staging
    directory (its files then), or ``standing_rounds="socket"`` asks for the socket."""
    if connect or not overlap or standing_rounds == "off":
        return False
    return standing_rounds == "socket" or not (one_host and local_fs)


def check_standing_rounds(standing_rounds: str, connect: bool, socket: bool = False, conf=None) -> None:
    """Refuses what the standing job cannot do on this session; ``fit`` calls it once it knows the session.

    ``socket``: the fit's rounds would run through the driver's socket (:func:`round_socket`); ``conf``: the classic
    session's ``SparkConf``.

    Raises:
        ConfigurationError: ``"socket"`` under Spark Connect, whose standing job waits on files the client writes;
            the driver's socket on a session that encrypts Spark's traffic (:data:`ENCRYPTION_SETTINGS`).
    """
    if connect and standing_rounds == "socket":
        raise ConfigurationError(
            "The 'standing_rounds' parameter must be 'auto' or 'off' under Spark Connect (its standing job waits on "
            "files that the client writes under the staging directory, not on a socket). Got 'socket' instead.")
    encrypted = [k for k in ENCRYPTION_SETTINGS if conf is not None and str(conf.get(k, "false")).lower() == "true"]
    if socket and encrypted:
        raise ConfigurationError(
            "The 'standing_rounds' parameter must be 'off' with overlap_rounds=True on a session that encrypts "
            f"Spark's traffic ({', '.join(f'{k}=true' for k in encrypted)}): overlapped rounds on hosts of their own "
            "send each round's weights and sums through a socket of the driver's own, which is authenticated but "
            "not encrypted. With 'off' each round runs as a Spark job of its own, its state and sums through "
            "Spark's channels and the staging directory (its communication then no longer overlaps the compute). "
            f"Got standing_rounds={standing_rounds!r}.")


def choose(settings: TransportSettings, engine, staging_root: str, fit_name: str) -> StateTransport:
    """The transport of one fit for ``settings`` (``settings.mode``: ``"auto"`` or a registered name).

    ``"auto"``: under Spark Connect the Spark SQL round (the only one there;
    summing the workers' files on the client when the server's executors
    share its host and the staging directory is local, see
    :class:`~sparkdl_avg.driver.transport.sql.SqlTransport`); on a classic
    session files when every executor runs on the driver's host
    (``local[N]``, ``local-cluster``) and the staging directory is local;
    with ``overlap_rounds`` on a classic session, wherever it runs, the
    Spark SQL round's standing job (through the driver's socket on hosts of
    their own), unless ``standing_rounds="off"``. On hosts of their own (any other master) Spark's tree while
    :func:`driver_bound_pays` for ``settings.num_workers`` sums of
    ``settings.sums_bytes`` each through a link of ``settings.network_rate``
    (default :data:`DEFAULT_NETWORK_RATE`), else the Spark SQL round, which
    then shards through the shuffle (:func:`plan_aggregation`); with a local
    master and a URI staging directory, the tree up to
    :data:`SPARK_TREE_BYTES` of sums in all. On the in-process engine its own transport
    (:mod:`.inprocess`). ``fit_name`` names the fit's directory under ``staging_root``.

    Raises:
        ConfigurationError: a transport that Spark Connect cannot run, under it; a bad ``network_rate``.
    """
    if engine.in_process:
        from .inprocess import InProcessTransport

        return InProcessTransport(engine, settings)
    one_host = engine.one_host
    site = Site(
        connect=engine.connect,
        one_host=one_host,
        local_fs=local_staging(staging_root),
        rate=None if one_host else parse_rate(settings.network_rate if settings.network_rate is not None
                                              else DEFAULT_NETWORK_RATE),
        root=staging_root,
    )
    name = auto_transport(settings, site) if settings.mode == "auto" else settings.mode
    cls = TRANSPORTS.get(name)
    if site.connect and not cls.connect:
        offered = " or ".join(repr(n) for n in ("auto", *(c.name for c in TRANSPORTS.entries() if c.connect)))
        raise ConfigurationError(
            f"The 'state_transport' parameter must be {offered} under Spark Connect (it has no "
            f"broadcasts or RDDs). Got {settings.mode!r} instead."
        )
    return cls.for_fit(engine, join(staging_root, fit_name), settings, site)
