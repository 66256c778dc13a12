"""A local S3-compatible server (moto's standalone server, from the ``dev`` extra) on
127.0.0.1: what the tests and the benchmark run object storage against, and a way to try
blobhouse on ``s3://`` without an account.

>>> import pyarrow as pa
>>> from blobhouse import blob_array, write_table
>>> with LocalS3Server() as s3:
...     uri = f"s3://{s3.bucket('demo')}/t"
...     table = write_table(pa.table({"b": blob_array([b"x"])}), uri, storage_options=s3.options)
...     table.read_blobs("b", [0])
[b'x']
"""

from __future__ import annotations

import functools
import os
import re
import socket
import subprocess
import sys
import time
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
        return {**CREDENTIALS, "aws_region": "us-east-1", "aws_endpoint": self.endpoint}

    def __enter__(self) -> LocalS3Server:
        os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")  # no cloud credential lookups
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        sink = open(self.log or os.devnull, "ab")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=sink,
            stderr=sink,
        )
        sink.close()
        self.endpoint = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return self
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError(
                        f"the S3 server did not start on {self.endpoint} (is moto installed? "
                        "it comes with the dev extra)"
                    ) from None
                time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
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

    def requests(self) -> dict[str, int]:
        """Requests logged so far, by method (needs ``log``)."""
        counts: dict[str, int] = {}
        text = _COLORS.sub("", self.log.read_text(errors="replace"))  # werkzeug colours statuses
        for line in text.splitlines():
            parts = line.split('"')
            if len(parts) >= 3 and " HTTP/" in parts[1]:
                method = parts[1].split(" ", 1)[0]
                counts[method] = counts.get(method, 0) + 1
        return counts
