"""The graph runs against the production instance config: PostgreSQL storage on a real server."""

from pathlib import Path

import pytest
import yaml
from dagster import AssetKey, DagsterInstance
from helpers.graph_runs import materialize_graph, sources_of
from helpers.postgres_server import PostgresServer

REPO = Path(__file__).resolve().parents[2]
FAST_TRAINING = {"ops": {"trained_checkpoint": {"config": {"max_steps": 4, "checkpoint_every": 2, "batch_size": 4}}}}


def production_config_without_ecs() -> dict:
    """deploy/dagster.postgres.yaml as is, less its `run_launcher` block: there is no ECS here, so runs use
    Dagster's default launcher (tests/e2e/test_ecs_run_launcher.py tests that block against moto's ECS). The
    default launcher cannot resume a run, so run monitoring keeps its timeouts with no resume attempts."""
    config = yaml.safe_load((REPO / "deploy" / "dagster.postgres.yaml").read_text())
    assert config.pop("run_launcher")["class"] == "EcsRunLauncher"
    assert config["run_monitoring"]["max_resume_run_attempts"] > 0, "the ECS launcher resumes dead run workers"
    config["run_monitoring"]["max_resume_run_attempts"] = 0
    return config


@pytest.mark.slow
def test_whole_graph_on_postgres_storage(resources, tiny_raw_root, tmp_path, monkeypatch):
    with PostgresServer() as server:
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        home = tmp_path / "dagster_home"
        home.mkdir()
        (home / "dagster.yaml").write_text(yaml.safe_dump(production_config_without_ecs()))
        with DagsterInstance.from_config(str(home)) as instance:
            assert type(instance.run_storage).__name__ == "PostgresRunStorage"
            assert type(instance.run_launcher).__name__ == "DefaultRunLauncher"
            per_source, tail = materialize_graph(
                tiny_raw_root, instance=instance, resources=resources, run_config=FAST_TRAINING
            )
            assert all(r.success for r in per_source.values()) and tail.success
        with DagsterInstance.from_config(str(home)) as reopened:  # the history lives in the server
            assert reopened.get_latest_materialization_event(AssetKey("map_report")) is not None
            assert len(reopened.get_runs()) == len(sources_of(tiny_raw_root)) + 1  # one run per source, then the tail
            assert sorted(reopened.get_dynamic_partitions("raw_sources")) == sources_of(tiny_raw_root)
