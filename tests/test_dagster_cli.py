"""`dagster asset materialize` from the repo root, as a user runs it after `source .venv/bin/activate`."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance

REPO = Path(__file__).resolve().parents[1]


def _materialize(env: dict, selection: str, *extra: str) -> None:
    command = [str(Path(sys.executable).parent / "dagster"), "asset", "materialize", "--select", selection, *extra]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.slow
def test_downstream_selection_reuses_the_persisted_upstream(tiny_raw_root, tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    (tmp_path / "fsx").mkdir()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "DAGSTER_MODULE_NAME": "zero_assets.definitions",  # what the venv's activate script exports
        "ZERO_RAW_URI": str(tiny_raw_root),
        "ZERO_LAKE_URI": str(tmp_path / "lake"),
        "ZERO_FSX_MOUNT": str(tmp_path / "fsx"),
    }
    _materialize(env, "raw_image_index")
    _materialize(env, "validated_images+")  # validated_images and its direct child, arrow_shards

    with DagsterInstance.from_config(str(home)) as instance:
        def latest(asset):
            event = instance.get_latest_materialization_event(AssetKey(asset))
            return event.asset_materialization.metadata if event else None

        index_uri = latest("raw_image_index")["uri"].value
        assert latest("validated_images")["upstream"].value["raw_image_index"]["uri"] == index_uri
        assert latest("arrow_shards")["upstream"].value["validated_images"]["uri"] == latest("validated_images")["uri"].value
        assert latest("fsx_warm_state") is None, "a one-hop selection stops at arrow_shards"
