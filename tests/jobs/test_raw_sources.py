"""`zero-assets sources`: the raw root's top-level folders from one delimiter listing, never the whole
lake; `--register` adds the new ones as partitions and refuses names that cannot be one."""

import os
import subprocess
import sys
from pathlib import Path

from helpers.local_s3 import LocalS3Server

from zero_assets.defs.change_detection.raw_sources import list_sources, register_sources

ZERO_ASSETS = Path(sys.executable).with_name("zero-assets")


def test_local_sources_are_the_top_level_folders_and_register_adds_only_new_ones(tmp_path, instance):
    raw = tmp_path / "raw"
    for key in ("cam_a/lot_1/x.jpg", "cam_b/y.jpg", "top.jpg", ".hidden/z.jpg"):
        (raw / key).parent.mkdir(parents=True, exist_ok=True)
        (raw / key).write_bytes(b"x")
    (raw / "linked").symlink_to(tmp_path, target_is_directory=True)  # a symlinked folder is not a source
    assert list_sources(str(raw)) == ["cam_a", "cam_b"]
    assert register_sources(instance, ["cam_a"]) == (["cam_a"], {})
    assert register_sources(instance, ["cam_a", "cam_b", "bad...name"]) == (
        ["cam_b"],
        {"bad...name": "it contains '...', which Dagster refuses in partition keys"},
    )
    assert sorted(instance.get_dynamic_partitions("raw_sources")) == ["cam_a", "cam_b"]


def test_s3_sources_cost_one_delimiter_listing(tmp_path, monkeypatch):
    with LocalS3Server(tmp_path / "s3") as s3:
        for name, value in s3.env().items():
            monkeypatch.setenv(name, value)
        client = s3.client()
        client.create_bucket(Bucket="lake")
        for key in (
            "raw/cam_a/lot_1/x.jpg",
            "raw/cam_a/y.jpg",
            "raw/cam_b/deep/er/z.jpg",
            "raw/top.jpg",
            "raw-old/cam_c/w.jpg",
        ):
            client.put_object(Bucket="lake", Key=key, Body=b"x")
        calls = []
        from training_code.lib.storage import s3_client

        s3_client().meta.events.register(
            "provide-client-params.s3.ListObjectsV2", lambda params, **_: calls.append(dict(params))
        )
        assert list_sources("s3://lake/raw") == ["cam_a", "cam_b"]
        assert [(c["Prefix"], c.get("Delimiter")) for c in calls] == [("raw/", "/")], (
            "one listing of the top level only"
        )


def test_cli_lists_and_registers(tmp_path):
    raw = tmp_path / "raw"
    for source in ("cam_a", "cam_b"):
        (raw / source).mkdir(parents=True)
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "ZERO_RAW_URI": str(raw), "DAGSTER_HOME": str(home)}
    listed = subprocess.run([str(ZERO_ASSETS), "sources"], env=env, capture_output=True, text=True, check=True)
    assert listed.stdout.split() == ["cam_a", "cam_b"]
    first = subprocess.run(
        [str(ZERO_ASSETS), "sources", "--register"], env=env, capture_output=True, text=True, check=True
    )
    assert first.stdout.splitlines() == ["cam_a\tadded", "cam_b\tadded"]
    (raw / "cam_c").mkdir()
    again = subprocess.run(
        [str(ZERO_ASSETS), "sources", "--register"], env=env, capture_output=True, text=True, check=True
    )
    assert again.stdout.splitlines() == ["cam_a\tregistered", "cam_b\tregistered", "cam_c\tadded"]
