"""A flaky S3 endpoint (a fault proxy before SeaweedFS): throttling and cut bodies are retried, a 20 s
outage during a run is ridden out, a longer one fails naming the endpoint, and the rerun completes.
"""

from __future__ import annotations

import http.client
import os
import socket
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from dagster import AssetKey
from helpers.graph_runs import materialize_source
from helpers.local_s3 import LocalS3Server

from training_code.lib import storage
from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.core.output_marker import output_is_complete
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets import raw_image_index, validated_images

BUCKET = "zero-faults"
SOURCE = "line_a_camera"
OUTAGE_S = 20.0
SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message><RequestId>fault-proxy</RequestId></Error>"
)


class FaultProxy:
    """An HTTP/1.1 proxy on 127.0.0.1 in front of the S3 server, with faults switched on from the test:

    - `throttle(n)`: the next n requests are answered 503 SlowDown (they never reach the server);
    - `cut(n)`: the next n responses with a body send their headers and half the body, then the
      connection is closed;
    - `outage_on(match, seconds)`: from the first request `match(method, path)` accepts, for
      `seconds`, every request is refused: the connection is closed without an answer.

    Bounded: it serves at most `max_requests` requests and stops `lifetime_s` after it starts."""

    def __init__(self, upstream: str, *, max_requests: int = 20000, lifetime_s: float = 300.0) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.max_requests, self.deadline = max_requests, time.monotonic() + lifetime_s
        self._lock = threading.Lock()
        self.requests = self.throttled = self.cut_bodies = self.refused = 0
        self._throttle = self._cut = 0
        self._outage_match = None
        self._outage_s = 0.0
        self.outage_started = self.outage_ended = None
        proxy = self

        class Handler(_ProxyHandler):
            fault_proxy = proxy

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def throttle(self, n: int) -> None:
        with self._lock:
            self._throttle = n

    def cut(self, n: int) -> None:
        with self._lock:
            self._cut = n

    def outage_on(self, match, seconds: float) -> None:
        with self._lock:
            self._outage_match, self._outage_s = match, seconds
            self.outage_started = self.outage_ended = None

    def in_outage(self) -> bool:
        with self._lock:
            return self._in_outage()

    def _in_outage(self) -> bool:
        return self.outage_started is not None and time.monotonic() < self.outage_ended

    def decide(self, method: str, path: str) -> str:
        """What happens to one request: refuse, throttle, cut or pass."""
        with self._lock:
            self.requests += 1
            if self.requests > self.max_requests or time.monotonic() > self.deadline:
                self.refused += 1
                return "refuse"
            if self._outage_match is not None and self.outage_started is None and self._outage_match(method, path):
                self.outage_started = time.monotonic()
                self.outage_ended = self.outage_started + self._outage_s
            if self._in_outage():
                self.refused += 1
                return "refuse"
            if self._throttle > 0:
                self._throttle -= 1
                self.throttled += 1
                return "throttle"
            return "pass"

    def take_cut(self) -> bool:
        with self._lock:
            if self._cut > 0:
                self._cut -= 1
                self.cut_bodies += 1
                return True
            return False


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fault_proxy: FaultProxy

    def log_message(self, *args) -> None:  # the test's output stays readable
        pass

    def do_GET(self):
        self._forward()

    do_PUT = do_POST = do_HEAD = do_DELETE = do_GET

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                chunk = self.rfile.read(size)
                self.rfile.readline()
                if size == 0:
                    break
                chunks.append(chunk)
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _forward(self) -> None:
        body = self._body()
        fault = self.fault_proxy.decide(self.command, self.path)
        if fault == "refuse":
            return self._drop()
        if fault == "throttle":
            self.send_response(503)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(SLOW_DOWN)))
            self.end_headers()
            self.wfile.write(SLOW_DOWN)
            return
        headers = {
            k: v
            for k, v in self.headers.items()
            if k.lower() not in ("transfer-encoding", "connection", "content-length")
        }
        headers["Content-Length"] = str(len(body))
        upstream = http.client.HTTPConnection(*self.fault_proxy.upstream, timeout=60)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
        finally:
            upstream.close()
        self.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(key, value)
        length = response.getheader("Content-Length") if self.command == "HEAD" else str(len(data))
        self.send_header("Content-Length", length or "0")
        self.end_headers()
        if self.command == "HEAD":
            return
        if len(data) > 1 and self.fault_proxy.take_cut():
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            return self._drop()
        self.wfile.write(data)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    with LocalS3Server(tmp_path_factory.mktemp("s3-faults")) as server:
        server.client().create_bucket(Bucket=BUCKET)
        yield server


@pytest.fixture
def proxy(s3_server, monkeypatch):
    faulty = FaultProxy(s3_server.endpoint_url)
    for key, value in {**s3_server.env(), "ZERO_S3_ENDPOINT_URL": faulty.endpoint_url}.items():
        monkeypatch.setenv(key, value)
    yield faulty
    faulty.close()


def test_throttling_and_cut_bodies_are_retried_for_reads_writes_and_listings(proxy, s3_server, tmp_path):
    root = f"s3://{BUCKET}/{tmp_path.name}"
    big = os.urandom(9 * 1024 * 1024)  # above the 8 MiB multipart threshold: an upload in parts
    folder = tmp_path / "out"
    (folder / "sub").mkdir(parents=True)
    (folder / "big.bin").write_bytes(big)
    for i in range(5):
        (folder / "sub" / f"part-{i}.bin").write_bytes(os.urandom(50_000 + i))
    (folder / "manifest.json").write_text('{"files": []}')

    proxy.throttle(2)
    storage.write_bytes_atomic(f"{root}/one.bin", b"one" * 1000)
    proxy.throttle(2)
    assert storage.publish_folder(folder, f"{root}/set")[-1] == "manifest.json"
    assert proxy.throttled == 4

    proxy.cut(3)  # three GETs in a row cut half-way: the read starts over each time
    assert storage.read_bytes(f"{root}/one.bin") == b"one" * 1000
    assert proxy.cut_bodies == 3
    proxy.cut(2)
    storage.fetch_file(f"{root}/set/big.bin", tmp_path / "fetched" / "big.bin")
    assert (tmp_path / "fetched" / "big.bin").read_bytes() == big
    proxy.cut(2)
    listed = {o.key: o.size for o in storage.list_objects(f"{root}/set")}
    assert listed == {p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.rglob("*") if p.is_file()}
    proxy.cut(3)
    proxy.throttle(2)
    storage.download_prefix(f"{root}/set", tmp_path / "down")
    for path in folder.rglob("*"):
        if path.is_file():
            assert (tmp_path / "down" / path.relative_to(folder)).read_bytes() == path.read_bytes()
    proxy.throttle(2)
    assert storage.exists(f"{root}/set/manifest.json")
    assert proxy.cut_bodies == 10 and proxy.throttled == 8, "every planted fault was met and retried"


def _resources(root: str, tmp_path: Path) -> dict:
    settings = ZeroSettings(raw_uri=f"{root}/raw", lake_uri=f"{root}/lake")
    return {"settings": settings, "jobs": LocalJobRunner(settings=settings)}


def _output(result) -> tuple[str, str]:
    event = next(e for e in result.get_asset_materialization_events() if e.asset_key == AssetKey("validated_images"))
    metadata = event.materialization.metadata
    return str(metadata["dagster/uri"].value), str(metadata["fingerprint"].value)


def _third_published_file():
    """Matches the third write of the validation output: the outage starts in the middle of its publication."""
    writes = []

    def match(method: str, path: str) -> bool:
        if method == "PUT" and "/lake/validated_images/" in path:
            writes.append(path)
        return len(writes) == 3

    return match


def test_an_outage_in_the_middle_of_a_run_is_ridden_out(proxy, tiny_raw_root, instance, tmp_path):
    root = f"s3://{BUCKET}/{tmp_path.name}"
    storage.publish_folder(tiny_raw_root, f"{root}/raw")
    proxy.outage_on(_third_published_file(), OUTAGE_S)

    started = time.monotonic()
    result = materialize_source(
        SOURCE, instance=instance, resources=_resources(root, tmp_path), assets=[raw_image_index, validated_images]
    )
    assert result.success
    assert proxy.outage_started is not None and proxy.refused > 0, "the outage happened during the run"
    assert proxy.outage_ended - proxy.outage_started == OUTAGE_S and time.monotonic() - started > OUTAGE_S
    uri, fingerprint = _output(result)
    assert output_is_complete(uri, fingerprint), "every file the manifest names is there, marker last"


def test_an_outage_past_the_retry_window_names_the_endpoint_and_the_rerun_completes(
    proxy, tiny_raw_root, instance, tmp_path, monkeypatch
):
    root = f"s3://{BUCKET}/{tmp_path.name}"
    storage.publish_folder(tiny_raw_root, f"{root}/raw")
    resources = _resources(root, tmp_path)
    monkeypatch.setenv("ZERO_AWS_RETRY_WINDOW_S", "3")  # the window, shortened so the outage outlasts it
    monkeypatch.setenv("ZERO_AWS_MAX_ATTEMPTS", "2")
    proxy.outage_on(_third_published_file(), 12.0)

    failed = materialize_source(
        SOURCE, instance=instance, resources=resources, raise_on_error=False, assets=[raw_image_index, validated_images]
    )
    assert not failed.success and proxy.refused > 0
    message = failed.get_step_failure_events()[0].step_failure_data.error.to_string()  # with the errors it wraps
    assert proxy.endpoint_url in message and f"{root}/lake/validated_images/{SOURCE}/" in message, message

    while proxy.in_outage():
        time.sleep(0.2)
    published = {o.key for o in storage.list_objects(f"{root}/lake/validated_images")}
    assert published and not any(k.endswith(("_output.json", "manifest.json")) for k in published), (
        f"cut off mid-publication, without manifest or marker: {sorted(published)}"
    )
    monkeypatch.delenv("ZERO_AWS_RETRY_WINDOW_S")
    monkeypatch.delenv("ZERO_AWS_MAX_ATTEMPTS")
    rerun = materialize_source(SOURCE, instance=instance, resources=resources, assets=[validated_images])
    assert rerun.success
    uri, fingerprint = _output(rerun)
    assert output_is_complete(uri, fingerprint), "the rerun published every file, manifest and marker last"
