"""One build per output across hosts: with an s3:// lake the output's lease is an object on S3 beside
the output, taken, renewed, released and taken over with conditional writes on a real S3-compatible
server on loopback (SeaweedFS, which honours `If-None-Match: *` and `If-Match`).

- Two hosts (real processes, each with its own DAGSTER_HOME and its own local disk, so its own jobs
  folder) on one s3:// lake and raw root materialize the same per-source asset with the same
  fingerprint at once: one job runs, the other waits on the S3 lease and reports a hit.
- A host killed (kill -9) while it holds the lease leaves it on S3; the other host takes it over once
  its heartbeat is stale by S3's clock, and builds.
- The store itself: a live lease is respected and renewed (its ETag changes with each heartbeat), a
  stale one is taken over by exactly one of several racing takers, a host whose clock is an hour off
  judges staleness by S3's clock all the same, and a release never deletes a lease taken over.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from botocore.exceptions import ConnectionClosedError
from fault_processes import FAULTS, REPO, finish, wait_for
from test_fault_concurrent_runs import Tail

from training_code.lib import storage
from training_code.lib.s3_storage import s3_client, split_s3
from zero_assets.core.job_request import LEASE_SUFFIX, output_lease_location
from zero_assets.core.output_marker import OUTPUT_MARKER, output_is_complete
from zero_assets.launch.output_lease import hold_lease, lease_store, try_acquire
from zero_assets.ops.garbage import unit_of

BUCKET = "zero-lease"
SOURCE = "line_a_camera"
STALE_S = 10  # the lease's stale limit in these tests (ZERO_OUTPUT_LEASE_STALE_S): the shortest allowed
# The store's own tests judge with a shorter limit, yet one no request on a loaded machine outlasts
# (a racing taker refused at once reads the winner's lease some seconds later), and wait past it.
SHORT_STALE_S, PAST_STALE_S = 5, 6.5


@pytest.fixture(scope="module")
def bucket(s3_server) -> str:
    s3_server.client().create_bucket(Bucket=BUCKET)
    return BUCKET


@pytest.fixture
def lake_root(bucket, s3_env, tmp_path) -> str:
    """A fresh s3:// root for this test on the loopback server, its endpoint in this process's environment."""
    return f"s3://{bucket}/{tmp_path.name}"


@dataclass
class Host:
    """One machine of the production layout: its own DAGSTER_HOME and local disk (where an s3:// lake's
    job folders are); the raw root and the lake on S3, shared with every other host."""

    root: Path
    raw: str
    lake: str
    env: dict[str, str]

    def __post_init__(self) -> None:
        self.home.mkdir(parents=True)
        shutil.copy(REPO / "dagster.yaml", self.home / "dagster.yaml")

    @property
    def home(self) -> Path:
        return self.root / "dagster_home"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def local(self) -> Path:
        return self.root / "local"  # this host's `.zero/`

    def run_folders(self, asset: str) -> list[str]:
        return sorted(p.name for p in self.local.glob(f"jobs/{asset}/*/runs/*"))

    def start(self, select: str, *extra: str) -> subprocess.Popen:
        environment = {
            **os.environ,
            **self.env,
            "DAGSTER_HOME": str(self.home),
            "PYTHONPATH": os.pathsep.join([str(FAULTS), str(REPO), os.environ.get("PYTHONPATH", "")]),
        }
        command = [sys.executable, str(FAULTS / "fault_driver.py"), "--home", str(self.home), "--raw", self.raw]
        command += ["--state", str(self.state), "--lake", self.lake, "--local-state", str(self.local)]
        command += ["--select", select, "--source", SOURCE, *extra]
        return subprocess.Popen(
            command, cwd=REPO, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def run(self, select: str, *extra: str, timeout: float = 240) -> dict:
        return finish(self.start(select, *extra), timeout)


def two_hosts(tmp_path: Path, tiny_raw_root: Path, root: str, s3_server) -> tuple[Host, Host]:
    """Hosts a and b on one raw root and lake on S3, each with `raw_image_index` recorded in its own
    instance (b finds a's index complete on S3 and records a hit: no second index is built)."""
    raw, lake = f"{root}/raw", f"{root}/lake"
    storage.publish_folder(tiny_raw_root / SOURCE, f"{raw}/{SOURCE}")
    env = {**s3_server.env(), "ZERO_OUTPUT_LEASE_STALE_S": str(STALE_S)}
    a, b = (Host(tmp_path / name, raw, lake, env) for name in ("host_a", "host_b"))
    first, second = a.run("raw_image_index"), b.run("raw_image_index")
    assert first["success"] and second["success"], (first["log"][-3000:], second["log"][-3000:])
    assert second["assets"]["raw_image_index"]["cache"] == "hit", (first["assets"], second["assets"])
    return a, b


def lease_objects(lake: str) -> list[str]:
    return [o.key for o in storage.list_objects(lake) if o.key.endswith(LEASE_SUFFIX)]


def test_two_hosts_on_one_s3_lake_build_an_output_once(tmp_path, tiny_raw_root, lake_root, s3_env):
    a, b = two_hosts(tmp_path, tiny_raw_root, lake_root, s3_env)
    first = Tail(a.start("validated_images", "--hold-before-marker"))  # inside the lease, output published
    try:
        wait_for((a.state / "held-before-marker").is_file, timeout=180, what="host a holding the lease")
        held = lease_objects(a.lake)
        second = Tail(b.start("validated_images"))
        wait_for(lambda: "waiting for it" in second.text or second.process.poll() is not None, timeout=180)
        assert "waiting for it" in second.text, f"host b never saw host a's lease and built too:\n{second.text[-3000:]}"
    finally:
        (a.state / "release").touch()
    one, two = first.result(240), second.result(240)

    assert one["success"] and two["success"], (one["log"][-2000:], two["log"][-2000:])
    built, reused = one["assets"]["validated_images"], two["assets"]["validated_images"]
    assert built["cache"] == "miss" and reused["cache"] == "hit", (built, reused)
    assert f"run {one['run_id']} built the same inputs while this run waited" in reused["cache_reason"]
    assert reused["dagster/uri"] == built["dagster/uri"] and built["dagster/uri"].startswith(a.lake)
    assert [f"{a.lake}/{key}" for key in held] == [built["dagster/uri"] + LEASE_SUFFIX], "the lease beside the output"
    assert a.run_folders("validated_images") == [one["run_id"]], "one job was launched, by host a"
    assert b.run_folders("validated_images") == [], "host b launched no job"
    marker = json.loads(storage.read_bytes(f"{built['dagster/uri']}/{OUTPUT_MARKER}"))
    assert output_is_complete(built["dagster/uri"], marker["fingerprint"])
    assert lease_objects(a.lake) == [], "the lease is released"


def test_a_killed_hosts_s3_lease_is_taken_over_once_stale(tmp_path, tiny_raw_root, lake_root, s3_env):
    a, b = two_hosts(tmp_path, tiny_raw_root, lake_root, s3_env)
    first = a.start("validated_images", "--pause-before-marker")
    wait_for((a.state / "paused-before-marker").is_file, timeout=180, what="host a pausing inside the lease")
    [killed_run] = a.run_folders("validated_images")
    held = {key: json.loads(storage.read_bytes(f"{a.lake}/{key}")) for key in lease_objects(a.lake)}
    second = Tail(b.start("validated_images"))
    try:
        wait_for(lambda: "waiting for it" in second.text or second.process.poll() is not None, timeout=180)
        assert "waiting for it" in second.text, f"host b never saw host a's lease and built too:\n{second.text[-3000:]}"
    finally:
        os.kill(first.pid, signal.SIGKILL)  # inside the lease: its heartbeat stops with it
        first.wait(timeout=30)
    killed_at = time.monotonic()
    wait_for(lambda: "took over the lease" in second.text, timeout=120, what="host b taking the lease over")
    # The dead owner's last heartbeat was at most one heartbeat (3 s) before the kill.
    assert time.monotonic() - killed_at > STALE_S - 3 - 1, "taken over only once its heartbeat was stale"
    again = second.result(240)

    assert again["success"], again["log"][-3000:]
    out = again["assets"]["validated_images"]["dagster/uri"]
    assert again["assets"]["validated_images"]["cache"] == "miss"
    assert f"took over the lease on {out} from run {killed_run}" in again["log"] and "by S3's clock" in again["log"]
    assert b.run_folders("validated_images"), "host b built it"
    assert output_is_complete(out, json.loads(storage.read_bytes(f"{out}/{OUTPUT_MARKER}"))["fingerprint"])
    assert lease_objects(a.lake) == [], "host b released the lease it took over"
    assert [(key, owner["run_id"], owner["pid"]) for key, owner in held.items()] == [
        (out.removeprefix(a.lake + "/") + LEASE_SUFFIX, killed_run, first.pid)
    ], "the killed host's lease was on S3 beside the output"


def test_an_s3_outputs_lease_is_beside_it_and_a_local_outputs_on_this_machine(tmp_path):
    fingerprint = "0123456789abcdef" * 4
    for asset, key in [
        ("validated_images", "validated_images/src/0123456789abcdef"),
        ("training_set", "training_set/0123456789abcdef"),
    ]:
        out = f"s3://bucket/lake/{key}"
        assert output_lease_location(tmp_path, asset, fingerprint, out) == out + LEASE_SUFFIX
        assert unit_of(key + LEASE_SUFFIX, {asset}) is None, "gc never takes a lease for an output or deletes it"
        assert unit_of(f"{key}/{OUTPUT_MARKER}", {asset}) == (key, "output")
    local = output_lease_location(tmp_path, "validated_images", fingerprint, str(tmp_path / "lake" / "x"))
    assert local == str(tmp_path / "validated_images" / "0123456789abcdef" / "lease.json")


def _etag(uri: str) -> str:
    bucket, key = split_s3(uri)
    return s3_client().head_object(Bucket=bucket, Key=key)["ETag"]


def _foreign_lease(uri: str, run_id: str) -> None:
    """A lease written by a run on another host, as its own store writes it."""
    record = {"run_id": run_id, "token": "far", "host": socket.gethostname() + "-other", "pid": 1}
    storage.write_bytes_atomic(uri, json.dumps(record).encode())


def test_a_live_s3_lease_is_renewed_and_respected_and_released(lake_root):
    uri = f"{lake_root}/asset/0123456789abcdef{LEASE_SUFFIX}"
    with hold_lease(uri, "run-a", heartbeat_s=0.5) as lease:
        assert lease.version == _etag(uri)
        taken, owner = try_acquire(uri, "run-b", stale_after_s=STALE_S)
        assert taken is None and owner["run_id"] == "run-a" and owner["pid"] == os.getpid()
        wait_for(lambda: _etag(uri) != lease.version, timeout=10, what="a heartbeat rewriting the lease")
    assert not storage.exists(uri), "released"


def test_a_stale_s3_lease_is_taken_over_by_s3s_clock_whatever_this_hosts_clock_says(lake_root, monkeypatch):
    uri = f"{lake_root}/asset/fedcba9876543210{LEASE_SUFFIX}"
    _foreign_lease(uri, "run-far")
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 3600)  # this host's clock an hour ahead
    taken, owner = try_acquire(uri, "run-b", stale_after_s=SHORT_STALE_S)
    assert taken is None and owner["run_id"] == "run-far", "fresh by S3's clock, whatever this host's says"
    monkeypatch.setattr(time, "time", lambda: real_time() - 3600)  # and an hour behind
    time.sleep(PAST_STALE_S)
    taken, _ = try_acquire(uri, "run-b", stale_after_s=SHORT_STALE_S)
    assert taken is not None and "run-far" in taken.took_over and "by S3's clock" in taken.took_over
    assert json.loads(storage.read_bytes(uri))["run_id"] == "run-b"


@pytest.mark.parametrize("stale", [False, True])
def test_of_racing_takers_of_an_s3_lease_exactly_one_wins(lake_root, stale):
    uri = f"{lake_root}/asset/{'stale' if stale else 'free'}{LEASE_SUFFIX}"
    if stale:
        _foreign_lease(uri, "run-far")
        time.sleep(PAST_STALE_S)
    start = threading.Barrier(8)

    def take(i: int):
        start.wait()
        return try_acquire(uri, f"run-{i}", stale_after_s=SHORT_STALE_S)[0]

    with ThreadPoolExecutor(8) as pool:
        winners = [lease for lease in pool.map(take, range(8)) if lease is not None]
    assert len(winners) == 1, [w.record["run_id"] for w in winners]
    assert json.loads(storage.read_bytes(uri))["token"] == winners[0].token
    assert bool(winners[0].took_over) == stale


def test_a_release_leaves_a_lease_another_run_took_over(lake_root):
    uri = f"{lake_root}/asset/0011223344556677{LEASE_SUFFIX}"
    with hold_lease(uri, "run-slow", heartbeat_s=600):  # no heartbeat: judged gone once stale
        time.sleep(PAST_STALE_S)
        taken, _ = try_acquire(uri, "run-next", stale_after_s=SHORT_STALE_S)
        assert taken is not None and "run-slow" in taken.took_over
    assert json.loads(storage.read_bytes(uri))["token"] == taken.token, "run-slow's release left run-next's lease"


def test_a_conditional_write_whose_answer_was_lost_is_known_by_its_token(lake_root):
    """The answer to a conditional PUT is lost after S3 applied it (the connection drops): the retry
    is refused (412) by the write it repeats, and the lease's token says the write was this run's."""
    uri = f"{lake_root}/asset/8899aabbccddeeff{LEASE_SUFFIX}"
    events = s3_client().meta.events
    lost = []

    def lose_the_answer(**kwargs) -> None:
        if len(lost) < 2 and kwargs["http_response"].status_code == 200:
            lost.append(kwargs["model"].name)
            raise ConnectionClosedError(endpoint_url=f"{uri} (answer dropped by the test)")

    store = lease_store(uri)
    events.register("after-call.s3.PutObject", lose_the_answer)
    try:
        lease, owner = store.try_acquire("run-a", SHORT_STALE_S)
        assert lease is not None, f"refused by its own write: {owner}"
        renewed = store.renew(lease)
    finally:
        events.unregister("after-call.s3.PutObject", lose_the_answer)
    assert lost == ["PutObject", "PutObject"], "both answers were lost, the take's and the heartbeat's"
    assert renewed is not None and renewed.version == _etag(uri) != lease.version
    assert json.loads(storage.read_bytes(uri))["token"] == lease.token
    store.release(renewed)
    assert not storage.exists(uri)
