"""The errors a new user meets first, each saying what is wrong and the next step: a partition that is no
source of the raw root, a raw root that does not exist (a typo in ZERO_RAW_URI), a materialization whose
upstream is missing (every missing ancestor, and one command that builds them), and `lineage --image`
on a key no index lists. Real Dagster instances and runs, the real CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_resources
from dagster import DagsterInstance
from helpers.graph_runs import materialize_source
from helpers.sensor_ticks import SensorDaemon

from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets.raw_image_index import raw_image_index
from zero_assets.defs.partitions import RAW_SOURCES
from zero_assets.ops.cli import main

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A DAGSTER_HOME with this repo's dagster.yaml, as `make demo` sets one up; the CLI reads it."""
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


def failure_text(result) -> str:
    """What the failed step said (the Failure's description and its chain), as the UI shows it."""
    failures = [event for event in result.all_events if event.is_step_failure]
    assert failures, "the run failed in a step"
    return "\n".join(event.step_failure_data.error.to_string() for event in failures)


def step_attempts(result) -> int:
    return sum(1 for event in result.all_events if event.event_type_value == "STEP_START")


def test_a_stray_partition_fails_at_once_saying_how_to_remove_it(home, tiny_raw_root, tmp_path, capsys):
    resources = make_resources(tiny_raw_root, tmp_path / "state")
    with DagsterInstance.get() as instance:
        result = materialize_source(
            "line_c_typo", instance=instance, resources=resources, assets=[raw_image_index], raise_on_error=False
        )
        assert not result.success and step_attempts(result) == 1, "no retry: it cannot succeed"
        text = failure_text(result)
        assert "partition 'line_c_typo' of raw_sources is not a source of the raw root" in text, text
        assert f"{tiny_raw_root}/line_c_typo/ is not there" in text, text
        assert "zero-assets sources --remove line_c_typo" in text, text
    assert main(["sources", "--remove", "line_c_typo"]) == 0
    assert capsys.readouterr().out == "line_c_typo\tremoved\n"
    with DagsterInstance.get() as instance:
        assert not instance.has_dynamic_partition(RAW_SOURCES.name, "line_c_typo")
    assert main(["sources", "--remove", "line_c_typo"]) == 2, "removing it twice says it is not a partition"
    assert "'line_c_typo' is not a partition of raw_sources" in capsys.readouterr().err


def test_a_missing_raw_root_says_so_wherever_it_is_met(home, tmp_path, monkeypatch, capsys):
    typo = tmp_path / "raw-typo"
    monkeypatch.setenv("ZERO_RAW_URI", str(typo))
    said = f"raw root {typo} does not exist"
    assert main(["sources"]) == 2 and said in capsys.readouterr().err
    assert main(["sources", "--register"]) == 2 and said in capsys.readouterr().err
    resources = make_resources(typo, tmp_path / "state")
    with DagsterInstance.get() as instance:
        result = materialize_source(
            "line_a_camera", instance=instance, resources=resources, assets=[raw_image_index], raise_on_error=False
        )
    text = failure_text(result)
    assert said in text and "check ZERO_RAW_URI" in text and "symlink" not in text, text
    with DagsterInstance.get() as instance:  # the raw-data sensor's tick
        daemon = SensorDaemon(instance, ZeroSettings(raw_uri=str(typo)))
        with pytest.raises(Exception) as raised:
            daemon.tick()
        assert said in str(raised.value) or said in repr(raised.value.__cause__), raised.value
        typo.mkdir()
        result, launched = daemon.tick()
        assert not launched and f"raw root {typo} holds no files" in result.skip_message, result.skip_message


def test_lineage_image_on_a_key_no_index_lists_exits_non_zero(home, tiny_raw_root, tmp_path, monkeypatch):
    resources = make_resources(tiny_raw_root, tmp_path / "state")
    with DagsterInstance.get() as instance:
        materialize_source("line_a_camera", instance=instance, resources=resources, assets=[raw_image_index])
    known = sorted(p for p in (tiny_raw_root / "line_a_camera").rglob("*.jpg") if p.is_file())[0]
    for key, says in (
        ("line_a_camera/nope.jpg", "the latest index of source line_a_camera"),
        ("no_such_source/x.jpg", "source 'no_such_source' (the key's top-level folder) has no raw_image_index"),
    ):
        result = subprocess.run(
            [str(BIN / "zero-assets"), "lineage", "--image", key], capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 2 and result.stdout == "", (result.returncode, result.stdout, result.stderr)
        assert f"zero-assets lineage: {key} is not in the index of any source" in result.stderr, result.stderr
        assert says in result.stderr, result.stderr
    key = known.relative_to(tiny_raw_root).as_posix()
    result = subprocess.run(
        [str(BIN / "zero-assets"), "lineage", "--image", key], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and '"status": "not yet processed"' in result.stdout, result.stderr


@pytest.mark.slow
def test_a_missing_upstream_names_every_missing_ancestor_and_one_command_builds_them(
    home, tiny_raw_root, tmp_path, monkeypatch
):
    """One source validated, the others registered only, nothing of the tail: fsx_warm_state names them
    all, and its command (run as printed, in bash, from the repo root) builds them and then it."""
    state = tmp_path / "state"
    resources = make_resources(tiny_raw_root, state)
    settings = resources["settings"]
    for name, value in (
        ("ZERO_RAW_URI", settings.raw_uri),
        ("ZERO_LAKE_URI", settings.lake_uri),
        ("ZERO_FSX_MOUNT", settings.fsx_mount),
    ):
        monkeypatch.setenv(name, value)
    sources = sorted(p.name for p in tiny_raw_root.iterdir() if p.is_dir())
    with DagsterInstance.get() as instance:
        instance.add_dynamic_partitions(RAW_SOURCES.name, sources)
        materialize_source(sources[0], instance=instance, resources=resources)
    path = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    failed = subprocess.run(  # as a user would meet it: the code location's run, its whole graph
        [str(BIN / "dagster"), "asset", "materialize", "-m", "zero_assets.definitions", "--select", "fsx_warm_state"],
        cwd=REPO,
        env=path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert failed.returncode != 0
    lines = (failed.stdout + failed.stderr).splitlines()
    said = next((line for line in lines if "needs upstream outputs" in line), "\n".join(lines[-60:]))
    others = ", ".join(sources[1:])
    for missing in (f"raw_image_index (sources {others})", f"validated_images (sources {others})"):
        assert missing in said, said
    assert "training_set; arrow_shards. One command" in said and "trained_checkpoint" not in said, said
    [command] = {line.strip() for line in lines if line.strip().startswith("(set -e;")}
    loop = f"for s in {' '.join(sources[1:])}; do dagster asset materialize -m zero_assets.definitions"
    assert loop in command and "--select 'training_set,arrow_shards,fsx_warm_state')" in command, command
    built = subprocess.run(
        ["bash", "-c", command],
        cwd=REPO,
        env=path,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    with DagsterInstance.get() as instance:
        for source in sources:
            for asset in ("raw_image_index", "validated_images"):
                found = instance.fetch_materializations(_filter(asset, source), limit=1).records
                assert found, f"{asset} of {source} built by the command"
        for asset in ("training_set", "arrow_shards", "fsx_warm_state"):
            assert instance.fetch_materializations(_filter(asset), limit=1).records, f"{asset} built by the command"


def _filter(asset: str, partition: str | None = None):
    from dagster import AssetKey, AssetRecordsFilter

    return AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[partition] if partition else None)
