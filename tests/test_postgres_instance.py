"""The graph runs against the production instance config: PostgreSQL storage on a real server."""

import shutil
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, materialize
from postgres_server import PostgresServer

from zero_assets.assets import ALL_ASSETS

REPO = Path(__file__).resolve().parents[1]
FAST_TRAINING = {"ops": {"trained_checkpoint": {"config": {"max_steps": 4, "checkpoint_every": 2, "batch_size": 4}}}}


@pytest.mark.slow
def test_whole_graph_on_postgres_storage(resources, tmp_path, monkeypatch):
    with PostgresServer() as server:
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        home = tmp_path / "dagster_home"
        home.mkdir()
        shutil.copy(REPO / "deploy" / "dagster.postgres.yaml", home / "dagster.yaml")
        with DagsterInstance.from_config(str(home)) as instance:
            assert type(instance.run_storage).__name__ == "PostgresRunStorage"
            result = materialize(ALL_ASSETS, resources=resources, instance=instance, run_config=FAST_TRAINING)
            assert result.success
        with DagsterInstance.from_config(str(home)) as reopened:  # the history lives in the server
            assert reopened.get_latest_materialization_event(AssetKey("map_report")) is not None
            assert len(reopened.get_runs()) == 1
