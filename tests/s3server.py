"""A real S3-compatible HTTP server on loopback for the object-storage tests: moto's standalone
server (`moto_server`, a separate process speaking the S3 REST API), never an in-process mock.

`S3Server.start()` picks a free port, waits until the server answers, creates a bucket, and writes
a multi-storage-client config whose profile points at it (what MSC_CONFIG names in a pod).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from megatron_contract.ports import free_port

ACCESS_KEY = "test-access-key"
SECRET_KEY = "test-secret-key"
REGION = "us-east-1"


def moto_server_command() -> list[str]:
    exe = Path(sys.executable).with_name("moto_server")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("moto_server")
    if found is None:
        raise RuntimeError("moto_server is not installed: pip install -e '.[dev]'")
    return [found]


@dataclass
class S3Server:
    proc: subprocess.Popen[bytes]
    endpoint: str
    bucket: str
    msc_config: Path
    log: IO[bytes]
    profile: str = "ckpt"

    @classmethod
    def start(cls, workdir: Path, bucket: str = "checkpoints") -> S3Server:
        port = free_port()
        log = (workdir / "moto.log").open("wb")
        proc = subprocess.Popen(
            [*moto_server_command(), "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        endpoint = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    log.close()
                    raise RuntimeError(
                        f"moto_server did not start: see {workdir / 'moto.log'}"
                    ) from None
                time.sleep(0.2)
        config = workdir / "msc_config.yaml"
        server = cls(proc, endpoint, bucket, config, log)
        server.client().create_bucket(Bucket=bucket)
        config.write_text(
            "profiles:\n"
            f"  {server.profile}:\n"
            "    storage_provider:\n"
            "      type: s3\n"
            "      options:\n"
            f"        base_path: {bucket}\n"
            f"        endpoint_url: {endpoint}\n"
            f"        region_name: {REGION}\n"
            "    credentials_provider:\n"
            "      type: S3Credentials\n"
            "      options:\n"
            f"        access_key: {ACCESS_KEY}\n"
            f"        secret_key: {SECRET_KEY}\n",
            encoding="utf-8",
        )
        return server

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def keys(self, prefix: str) -> list[str]:
        """Every object key under `prefix`, straight from the server (not through MSC)."""
        out: list[str] = []
        pages = (
            self.client()
            .get_paginator("list_objects_v2")
            .paginate(Bucket=self.bucket, Prefix=prefix)
        )
        for page in pages:
            out += [item["Key"] for item in page.get("Contents", [])]
        return sorted(out)

    def read(self, key: str) -> bytes:
        body: bytes = self.client().get_object(Bucket=self.bucket, Key=key)["Body"].read()
        return body

    def env(self) -> dict[str, str]:
        return {**os.environ, "MSC_CONFIG": str(self.msc_config)}

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
