"""What the Dagster UI shows of the graph, asked through its GraphQL API (a real `dagster-webserver` on
the code location `dagster dev` loads): each source's quarantine check has its own status (the check is declared with
the per-source partitions), the assets carry kinds the UI has icons for, and each job-backed asset
links to the job script it runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import make_resources
from dagster import (
    AssetCheckSeverity,
    AssetMaterialization,
    AssetSelection,
    DagsterInstance,
    MetadataValue,
    materialize,
)
from helpers.readme_shell import free_port

from zero_assets.core.settings import REPO_ROOT
from zero_assets.defs.assets import ALL_ASSETS, SOURCE_SPECS
from zero_assets.defs.checks import quarantine_rate_under_limit
from zero_assets.defs.partitions import RAW_SOURCES

DEFINITIONS = str(REPO_ROOT / "zero_assets" / "definitions.py")
UI_ICONS = {
    "sagemaker",
    "pytorch",
    "huggingface",
    "wandb",
    "parquet",
    "arrow",
    "json",
    "s3",
    "duckdb",
}  # shipped by the UI

CHECK_STATUS = """
{ assetNodes { assetKey { path } kinds
    assetChecksOrError { ... on AssetChecks { checks { name
        partitionDefinition { name }
        partitionStatuses { ... on AssetCheckDefaultPartitionStatuses { succeededPartitions failedPartitions } }
    } } } } }
"""
CODE_REFERENCES = """
{ assetNodes { assetKey { path }
    metadataEntries { label ... on CodeReferencesMetadataEntry { codeReferences {
        ... on LocalFileCodeReference { filePath lineNumber label } } } } } }
"""


def _record_validation(instance, source: str, quarantined: int, limit: float) -> None:
    """A validated_images materialization of `source` as a run would record it (the counts and the limit
    its config ran with: what the check judges)."""
    instance.add_dynamic_partitions(RAW_SOURCES.name, [source])
    config = {"max_quarantine_rate": limit}
    instance.report_runless_asset_event(
        AssetMaterialization(
            asset_key="validated_images",
            partition=source,
            metadata={
                "images_in": 20,
                "quarantined": quarantined,
                "fingerprint_inputs": MetadataValue.json({"config": config}),
            },
        )
    )


def _run_check(instance, resources, source: str):
    """The check alone for one source, as the UI's "Execute" on that partition launches it: a run
    tagged with the partition (a run of checks alone takes no partition key)."""
    result = materialize(
        [*SOURCE_SPECS, *ALL_ASSETS, quarantine_rate_under_limit],
        selection=AssetSelection.checks(quarantine_rate_under_limit),
        tags={"dagster/partition": source},
        resources=resources,
        instance=instance,
        raise_on_error=False,
    )
    [evaluation] = result.get_asset_check_evaluations()
    return evaluation


@pytest.fixture(scope="module")
def ui(tmp_path_factory, tiny_raw_root):
    """`dagster-webserver` on the code location `dagster dev` loads, over an instance in a temp folder:
    (its GraphQL URL, the instance, resources on the tiny raw root)."""
    home = tmp_path_factory.mktemp("dagster_home")
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    port = free_port()
    log = home / "webserver.log"
    with DagsterInstance.from_config(str(home)) as instance, open(log, "wb") as out:
        server = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("dagster-webserver")),
                "-f",
                DEFINITIONS,
                "-a",
                "defs",
                "-p",
                str(port),
            ],
            cwd=REPO_ROOT,
            env={**os.environ, "DAGSTER_HOME": str(home)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            _wait_for(f"http://127.0.0.1:{port}/server_info", server, log)
            yield f"http://127.0.0.1:{port}/graphql", instance, make_resources(tiny_raw_root, home / "state")
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)


def _wait_for(url: str, server: subprocess.Popen, log: Path, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"dagster-webserver exited with {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer in {timeout_s} s:\n{log.read_text()[-3000:]}")


def _nodes(url: str, query: str) -> dict[str, dict]:
    request = urllib.request.Request(
        url, data=json.dumps({"query": query}).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        answer = json.loads(response.read())
    assert not answer.get("errors"), answer["errors"]
    return {"/".join(node["assetKey"]["path"]): node for node in answer["data"]["assetNodes"]}


def test_each_source_shows_its_own_quarantine_check_status(ui):
    url, instance, resources = ui
    _record_validation(instance, "line_a_camera", quarantined=1, limit=0.2)
    _record_validation(instance, "warehouse_scanner", quarantined=9, limit=0.2)
    passed = _run_check(instance, resources, "line_a_camera")
    failed = _run_check(instance, resources, "warehouse_scanner")
    assert passed.passed and not failed.passed and failed.severity == AssetCheckSeverity.ERROR
    assert (passed.partition, failed.partition) == ("line_a_camera", "warehouse_scanner")
    [check] = [
        c
        for c in _nodes(url, CHECK_STATUS)["validated_images"]["assetChecksOrError"]["checks"]
        if c["name"] == "quarantine_rate_under_limit"
    ]
    assert check["partitionDefinition"]["name"] == RAW_SOURCES.name
    assert check["partitionStatuses"] == {
        "succeededPartitions": ["line_a_camera"],
        "failedPartitions": ["warehouse_scanner"],
    }


def test_assets_carry_kinds_the_ui_draws_as_icons(ui):
    kinds = {asset: set(node["kinds"]) for asset, node in _nodes(ui[0], CHECK_STATUS).items()}
    assert {asset for asset, found in kinds.items() if not found <= UI_ICONS} == set(), kinds
    assert {"sagemaker", "pytorch", "wandb"} <= kinds["trained_checkpoint"]
    assert {"sagemaker", "pytorch", "wandb"} <= kinds["map_report"]
    assert {"sagemaker", "huggingface", "arrow"} <= kinds["arrow_shards"]
    assert {"sagemaker", "parquet"} <= kinds["validated_images"]
    assert "parquet" in kinds["training_set"] and "parquet" in kinds["raw_image_index"]


def test_job_backed_assets_link_to_the_script_they_run(ui):
    scripts = {
        "raw_image_index": "training_code/index.py",
        "validated_images": "training_code/validate.py",
        "arrow_shards": "training_code/shard.py",
        "fsx_warm_state": "training_code/warm.py",
        "trained_checkpoint": "training_code/train.py",
        "map_report": "training_code/evaluate.py",
        "training_rehearsal": "training_code/train.py",
    }
    nodes = _nodes(ui[0], CODE_REFERENCES)
    for asset, script in scripts.items():
        references = [
            reference
            for entry in nodes[asset]["metadataEntries"]
            if entry["label"] == "dagster/code_references"
            for reference in entry["codeReferences"]
        ]
        paths = {Path(r["filePath"]) for r in references}
        assert REPO_ROOT / script in paths, f"{asset} links {paths}, not its job script {script}"
        assert all(p.is_file() for p in paths), paths
