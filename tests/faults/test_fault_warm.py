"""A damaged shard is never left on the warm mount looking valid: locally (fetched, verified, renamed)
and on FSx (`training_code/warm.py` with `fake_lfs.py` for Lustre's `lfs`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.local_s3 import LocalS3Server
from helpers.shard_sets import image_row, pack, write_manifest
from test_fault_s3_outage import FaultProxy

from training_code.lib.aws_clients import AwsUnavailableError
from training_code.lib.shard_format import ShardIntegrityError, verify_shard_file
from zero_assets.backends.local.warm_state import warm_shard_set
from zero_assets.backends.sagemaker.training_set_channel import write_channel_training_set

FAULTS = Path(__file__).resolve().parent
REPO = FAULTS.parents[1]
SOURCE = "line_a_camera"
CATEGORIES = [{"id": 1, "name": "widget"}]
BUCKET = "zero-warm"


def rows(index: int) -> list[dict]:
    return [image_row(SOURCE, index * 4 + row, 2048) for row in range(4)]


@pytest.fixture
def shard_set(tmp_path) -> tuple[Path, list[dict], str]:
    """A local lake holding one arrow_shards output of three shards: (its shards folder, entries, its uri)."""
    lake = str(tmp_path / "lake")
    entries = [entry for index in range(3) for entry in pack(lake, "fp", "train", rows(index), 1 << 30)]
    uri = write_manifest(lake, "fp", entries)
    return Path(uri) / "shards", entries, uri


def flip_a_byte(path: Path) -> None:
    """A same-size edit: the size check passes, the sha256 does not."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def mount_files(mount: Path) -> list[str]:
    return sorted(str(p.relative_to(mount)) for p in mount.rglob("*") if p.is_file())


def test_a_failed_rewarm_leaves_no_damaged_shard_and_no_manifest_on_the_mount(shard_set, tmp_path):
    lake_shards, entries, uri = shard_set
    mount = tmp_path / "fsx"
    first = warm_shard_set(uri, mount, "key")
    assert (first.copied, first.already_warm) == (3, 0)
    warm = mount / "shards"
    damaged = Path(entries[1]["path"]).name
    original = (lake_shards / damaged).read_bytes()
    flip_a_byte(warm / damaged)  # damaged on the mount, so the re-warm fetches it again...
    flip_a_byte(lake_shards / damaged)  # ... from a lake whose copy is damaged too
    with pytest.raises(ShardIntegrityError) as failed:
        warm_shard_set(uri, mount, "key")
    # Neither the damaged copy nor a temporary one (nor its verdict) is left, and nothing vouches for the set.
    intact = sorted(f"shards/{Path(e['path']).name}" for e in entries if Path(e["path"]).name != damaged)
    verdicts = [f"shards/.verified/{Path(name).name}.json" for name in intact]
    assert mount_files(mount) == sorted(["sets/key/masked.parquet", *intact, *verdicts])
    assert f"{lake_shards / damaged}, shard shards/{damaged} in the lake" in str(failed.value)
    for entry in entries:
        if Path(entry["path"]).name != damaged:
            verify_shard_file(warm / Path(entry["path"]).name, entry)

    (lake_shards / damaged).write_bytes(original)  # the lake repaired: the next warm copies only that shard
    again = warm_shard_set(uri, mount, "key")
    assert (again.copied, again.already_warm, again.reused_verdicts) == (1, 2, 2)
    assert (mount / "sets" / "key" / "manifest.json").is_file()
    for entry in json.loads((mount / "sets" / "key" / "manifest.json").read_text())["shards"]:
        verify_shard_file(mount / "sets" / "key" / entry["path"], entry)


@pytest.mark.parametrize("fault", ["missing", "truncated"])
def test_a_fetch_that_fails_leaves_nothing_under_the_shards_name(shard_set, tmp_path, fault):
    lake_shards, entries, uri = shard_set
    mount = tmp_path / "fsx"
    warm_shard_set(uri, mount, "key")
    name = Path(entries[0]["path"]).name
    (mount / "shards" / name).unlink()
    if fault == "missing":
        (lake_shards / name).unlink()
    else:
        (lake_shards / name).write_bytes((lake_shards / name).read_bytes()[:-100])
    with pytest.raises(FileNotFoundError if fault == "missing" else ShardIntegrityError, match=name):
        warm_shard_set(uri, mount, "key")
    assert f"shards/{name}" not in mount_files(mount) and "sets/key/manifest.json" not in mount_files(mount)
    assert f"shards/.verified/{name}.json" not in mount_files(mount), "a verdict outlived its shard"
    assert not [f for f in mount_files(mount) if Path(f).name.startswith(".") and ".verified" not in f], (
        "a temporary copy was left"
    )


def test_masked_rows_that_differ_from_the_manifest_are_never_warmed(shard_set, tmp_path):
    lake_shards, entries, uri = shard_set
    masked = Path(uri) / "masked.parquet"
    masked.write_bytes(masked.read_bytes() + b"x")
    with pytest.raises(ShardIntegrityError, match=f"{masked}: .*manifest.json says"):
        warm_shard_set(uri, tmp_path / "fsx", "key")
    assert not (tmp_path / "fsx" / "sets").exists(), "nothing of the set was written"


@pytest.mark.parametrize(
    ("path", "refusal"),
    [
        ("../../elsewhere/shards/{name}", "leaves the arrow_shards folder"),
        ("/abs/shards/{name}", "leaves the arrow_shards folder"),
        ("shards/./{name}", "leaves the arrow_shards folder"),
        ("shards/train-00000.arrow", "is not named by its content"),
    ],
)
def test_a_manifest_whose_shard_paths_escape_or_hide_their_content_is_refused(shard_set, tmp_path, path, refusal):
    _, entries, uri = shard_set
    manifest_path = Path(uri) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["shards"][0]["path"] = path.format(name=Path(entries[0]["path"]).name)
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=refusal):
        warm_shard_set(uri, tmp_path / "fsx", "key")
    assert mount_files(tmp_path / "fsx") == [], "refused before anything was copied"


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    with LocalS3Server(tmp_path_factory.mktemp("s3-warm")) as server:
        server.client().create_bucket(Bucket=BUCKET)
        yield server


class CutShardBodies(FaultProxy):
    """The fault proxy, cutting every response body of a GET of a shard (`.arrow`) mid-way."""

    cutting = False

    def decide(self, method: str, path: str) -> str:
        self.cutting = method == "GET" and ".arrow" in path.partition("?")[0]
        return super().decide(method, path)

    def take_cut(self) -> bool:
        return self.cutting


def test_a_rewarm_whose_s3_fetch_is_cut_mid_way_leaves_nothing_on_the_mount(s3_server, tmp_path, monkeypatch):
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    lake = f"s3://{BUCKET}/lake"
    entries = [entry for index in range(3) for entry in pack(lake, "fp", "train", rows(index), 1 << 30)]
    uri = write_manifest(lake, "fp", entries)
    mount = tmp_path / "fsx"
    warm_shard_set(uri, mount, "key")
    damaged = Path(entries[0]["path"]).name
    flip_a_byte(mount / "shards" / damaged)
    proxy = CutShardBodies(s3_server.endpoint_url)
    try:
        monkeypatch.setenv("ZERO_S3_ENDPOINT_URL", proxy.endpoint_url)
        monkeypatch.setenv("ZERO_AWS_RETRY_WINDOW_S", "1")  # give up soon: every try is cut
        with pytest.raises(AwsUnavailableError, match=f"download {lake}/arrow_shards/fp/shards/{damaged}"):
            warm_shard_set(uri, mount, "key")
    finally:
        proxy.close()
    intact = sorted(f"shards/{Path(e['path']).name}" for e in entries if Path(e["path"]).name != damaged)
    verdicts = [f"shards/.verified/{Path(name).name}.json" for name in intact]
    assert mount_files(mount) == sorted(["sets/key/masked.parquet", *intact, *verdicts]), (
        "a damaged, partial or temporary copy was left, or the set's manifest"
    )


# --- the FSx warm job ------------------------------------------------------------------------------


@pytest.fixture
def channel(tmp_path) -> tuple[Path, str, list[Path]]:
    """The SageMaker channel of a warm shard set, as the warm step lays it out: the shard root (a copy
    of the lake's arrow_shards/, standing in for FSx), the set's folder in it, and its shards there."""
    lake = str(tmp_path / "lake")
    entries = [entry for index in range(3) for entry in pack(lake, "fp", "train", rows(index), 1 << 30)]
    uri = write_manifest(lake, "fp", entries, masked={entries[0]["path"]: [rows(0)[0]["key"]]})
    found, _ = write_channel_training_set(uri, lake, "c" * 64)
    root = tmp_path / "fsx" / "arrow_shards"
    shutil.copytree(Path(lake) / "arrow_shards", root)
    return root, found.folder, [root / "fp" / entry["path"] for entry in entries]


def run_warm_job(root: Path, folder: str, tmp_path: Path, with_lfs: bool) -> subprocess.CompletedProcess:
    """`python -m training_code.warm` on `root`, with `fake_lfs.py` as `lfs` (its archive: the lake) or without."""
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    lfs = tools / "lfs"
    lfs.write_text(f'#!/bin/sh\nexec {sys.executable} {FAULTS / "fake_lfs.py"} "$@"\n')
    lfs.chmod(0o755)
    environment = {
        **os.environ,
        "SM_CHANNEL_SHARDS": str(root),
        "ZERO_OPT_ML": str(tmp_path / "opt_ml"),
        "FAKE_LFS_ROOT": str(root),
        "FAKE_LFS_ARCHIVE": str(tmp_path / "lake" / "arrow_shards"),
        "FAKE_LFS_STATE": str(tmp_path / "lfs_state.json"),
        "PATH": os.pathsep.join([str(tools)] * with_lfs + [os.environ["PATH"]]),
    }
    environment.pop("DAGSTER_PIPES_CONTEXT", None)
    return subprocess.run(
        [sys.executable, "-m", "training_code.warm", "--training-set", folder],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def lfs_states(tmp_path: Path) -> dict[str, str]:
    path = tmp_path / "lfs_state.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def reported(done: subprocess.CompletedProcess) -> dict:
    """The metadata the job reported (outside a Pipes session, its materialization line on stdout)."""
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith('{"event": "materialization"'))
    return json.loads(line)["metadata"]


def test_the_fsx_warm_job_restores_and_verifies_only_shards_without_a_holding_verdict(channel, tmp_path):
    root, folder, shards = channel
    released = {str(path): "released" for path in shards}
    for path in shards:
        path.write_bytes(b"\0" * path.stat().st_size)  # imported metadata, no bytes yet
    (tmp_path / "lfs_state.json").write_text(json.dumps(released))
    done = run_warm_job(root, folder, tmp_path, with_lfs=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert set(lfs_states(tmp_path).values()) == {"archived"}
    first = reported(done)
    assert (first["shards"], first["verified"], first["reused_verdicts"]) == (3, 3, 0)
    assert all((path.parent / ".verified" / f"{path.name}.json").is_file() for path in shards)

    # Again: every shard on its recorded verdict, none restored or read.
    again = reported(run_warm_job(root, folder, tmp_path, with_lfs=True))
    assert (again["verified"], again["verified_bytes"], again["reused_verdicts"]) == (0, 0, 3)
    # One Lustre released since (its data dropped for space) is restored, which rewrites it: verified again.
    (tmp_path / "lfs_state.json").write_text(json.dumps({str(shards[1]): "released"}))
    released = reported(run_warm_job(root, folder, tmp_path, with_lfs=True))
    assert (released["verified"], released["reused_verdicts"], released["restored_again"]) == (1, 2, 1)
    # A shard edited on the file system since has no holding verdict: it alone is verified again.
    shards[2].write_bytes(shards[2].read_bytes())  # the same bytes, a new mtime and ctime
    third = reported(run_warm_job(root, folder, tmp_path, with_lfs=True))
    assert (third["verified"], third["reused_verdicts"]) == (1, 2)


def test_the_fsx_warm_job_releases_a_shard_damaged_in_the_lake_and_names_a_dirty_one(channel, tmp_path):
    root, folder, shards = channel
    archive = tmp_path / "lake" / "arrow_shards"
    in_lake, on_fsx = shards[0], shards[2]
    flip_a_byte(archive / in_lake.relative_to(root))  # the lake's object is damaged: a restore copied it faithfully
    shutil.copyfile(archive / in_lake.relative_to(root), in_lake)
    flip_a_byte(on_fsx)  # written on the file system after its restore
    (tmp_path / "lfs_state.json").write_text(json.dumps({str(on_fsx): "dirty"}))
    damaged_bytes = in_lake.read_bytes()

    done = run_warm_job(root, folder, tmp_path, with_lfs=True)
    assert done.returncode != 0 and '"event": "materialization"' not in done.stdout
    assert f"2 of 3 shards under {root} do not match their manifest" in done.stderr
    assert f"{in_lake}: sha256" in done.stderr and "damaged in the lake" in done.stderr
    assert f"{on_fsx}: sha256" in done.stderr and "hsm state dirty" in done.stderr
    assert "delete arrow_shards/fp/shards there" in done.stderr
    # The file system keeps no loaded copy of the lake-damaged bytes; the dirty file stays (Lustre keeps it).
    states = lfs_states(tmp_path)
    assert states[str(in_lake)] == "released" and in_lake.read_bytes() != damaged_bytes
    assert states[str(on_fsx)] == "dirty" and on_fsx.is_file()
    assert not (in_lake.parent / ".verified" / f"{in_lake.name}.json").exists(), "no verdict for a damaged shard"


def test_the_fsx_warm_job_without_lfs_names_every_damaged_shard(channel, tmp_path):
    root, folder, shards = channel
    for path in shards[:2]:
        flip_a_byte(path)
    done = run_warm_job(root, folder, tmp_path, with_lfs=False)
    assert done.returncode != 0 and '"event": "materialization"' not in done.stdout
    assert "2 of 3 shards" in done.stderr and done.stderr.count("cannot be released") == 2
