"""The rehearsal as a gate, on the local backend with real jobs: `rehearsal_passed` blocks a training whose code
version and configuration have no passed rehearsal (the asset fails naming it and the command that runs it)
and passes once `training_rehearsal` has run the same training (its forced stop, resume on two processes and
evaluation proven); the scale knobs may differ, anything else may not; where the gate is not enforced the
check warns and blocks nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import make_resources
from dagster import AssetCheckSeverity, AssetKey, DagsterEventType, instance_for_test, materialize
from helpers.graph_runs import materialize_source, materialize_tail, sources_of

from zero_assets.defs.assets import ALL_ASSETS, SOURCE_SPECS, TAIL_ASSETS, fsx_warm_state
from zero_assets.defs.assets.tuning_record import TUNING_COMMAND
from zero_assets.defs.rehearsal_gate import GATE_VARIABLE, REHEARSAL_COMMAND

ALL = [*SOURCE_SPECS, *ALL_ASSETS]
UP_TO_WARM = TAIL_ASSETS[: TAIL_ASSETS.index(fsx_warm_state) + 1]
TINY = {"batch_size": 2, "width": 16, "min_size": 64, "max_size": 96, "processes": 1}
PRODUCTION = {**TINY, "max_steps": 3, "checkpoint_every": 3}


@pytest.fixture(scope="module")
def warm_graph(tiny_raw_root, tmp_path_factory):
    """One instance with the demo's sources indexed, validated and packed, and the shards warm."""
    state = tmp_path_factory.mktemp("rehearsal-gate")
    (state / "dagster").mkdir()
    with instance_for_test(temp_dir=str(state / "dagster")) as instance:
        resources = make_resources(tiny_raw_root, state)
        for source in sources_of(tiny_raw_root):
            assert materialize_source(source, instance=instance, resources=resources).success
        assert materialize_tail(instance=instance, resources=resources, assets=UP_TO_WARM).success
        yield instance, resources


def run(asset: str, config: dict, warm_graph):
    instance, resources = warm_graph
    return materialize(
        ALL,
        selection=[asset],
        instance=instance,
        resources=resources,
        run_config={"ops": {asset: {"config": config}}},
        raise_on_error=False,
    )


def gate_check(result):
    (evaluation,) = [e for e in result.get_asset_check_evaluations() if e.check_name == "rehearsal_passed"]
    return evaluation


def failure_message(result) -> str:
    return "\n".join(e.event_specific_data.error.message for e in result.all_events if e.is_step_failure)


def metadata(result, asset: str) -> dict:
    return {k: v.value for k, v in result.asset_materializations_for_node(asset)[0].metadata.items()}


@pytest.mark.slow
def test_rehearsal_passed_blocks_a_training_without_a_rehearsal_and_passes_after_one(warm_graph, monkeypatch):
    monkeypatch.setenv(GATE_VARIABLE, "on")
    instance, resources = warm_graph
    jobs_root = Path(resources["settings"].jobs_root())

    refused = run("trained_checkpoint", PRODUCTION, warm_graph)
    assert not refused.success
    check = gate_check(refused)
    assert not check.passed and check.severity == AssetCheckSeverity.ERROR
    message = failure_message(refused)
    assert "trained_checkpoint not launched: no passed rehearsal of training_code.train" in message, message
    assert REHEARSAL_COMMAND in message and REHEARSAL_COMMAND in check.description
    assert not (jobs_root / "trained_checkpoint").exists(), "nothing was launched"
    assert instance.get_latest_materialization_event(AssetKey("trained_checkpoint")) is None

    rehearsal = run("training_rehearsal", {"training": PRODUCTION, "steps": 4, "stop_after_steps": 2}, warm_graph)
    assert rehearsal.success, failure_message(rehearsal)
    proved = metadata(rehearsal, "training_rehearsal")
    assert proved["rehearsal"] == "passed"
    assert (proved["forced_stop_step"], proved["resumed_from_step"], proved["steps"]) == (2, 2, 4)
    assert proved["world_size"] == 2, "the rehearsal's own processes (2), not the training's (1)"
    assert proved["rehearsal_key"] == check.metadata["rehearsal_key"].value
    record = json.loads((Path(str(proved["dagster/uri"])) / "rehearsal.json").read_text())
    assert record["proved"]["forced_stop"]["reason"].startswith("forced stop at step 2 of 4"), record
    assert record["proved"]["evaluation"]["module"] == "training_code.evaluate"
    assert (Path(str(proved["dagster/uri"])) / "report" / "metrics.json").is_file(), "the evaluator ran on its model"

    trained = run("trained_checkpoint", PRODUCTION, warm_graph)
    assert trained.success, failure_message(trained)
    check = gate_check(trained)
    assert check.passed and check.metadata["rehearsal_run_id"].value == rehearsal.run_id
    assert metadata(trained, "trained_checkpoint")["steps"] == 3

    scaled = run("trained_checkpoint", {**PRODUCTION, "max_steps": 4, "checkpoint_every": 2}, warm_graph)
    assert scaled.success and gate_check(scaled).passed, "steps and checkpoint_every are scale knobs"

    changed = run("trained_checkpoint", {**PRODUCTION, "arch": "fcos_resnet50_fpn"}, warm_graph)
    assert not changed.success and not gate_check(changed).passed
    message = failure_message(changed)
    assert "differs: config arch: 'fcos_tiny' -> 'fcos_resnet50_fpn'" in message, message

    swept = run("trained_checkpoint", {**PRODUCTION, "lr": 1e-3}, warm_graph)
    assert swept.success and gate_check(swept).passed, "numbers are keyed by type: one rehearsal covers a sweep"


@pytest.mark.slow
def test_a_local_tuning_runs_its_trials_and_hands_the_best_to_training_under_one_rehearsal(warm_graph, monkeypatch):
    monkeypatch.setenv(GATE_VARIABLE, "on")
    untuned = run("trained_checkpoint", {**PRODUCTION, "use_tuning": True}, warm_graph)
    assert not untuned.success and TUNING_COMMAND in failure_message(untuned), failure_message(untuned)
    rehearsal = run("training_rehearsal", {"training": PRODUCTION, "steps": 4, "stop_after_steps": 2}, warm_graph)
    assert rehearsal.success, failure_message(rehearsal)

    sweep = {"low": 1e-4, "high": 3e-2, "scaling": "Logarithmic"}
    search = {"training": PRODUCTION, "ranges": [{"name": "lr", **sweep}], "max_trials": 3, "seed": 1}
    tuned = run("tuned_hyperparameters", search, warm_graph)
    assert tuned.success, failure_message(tuned)
    found = metadata(tuned, "tuned_hyperparameters")
    record = json.loads((Path(str(found["dagster/uri"])) / "manifest.json").read_text())
    trials = record["trials"]
    assert len(trials) == 3 and found["trials"] == 3 and found["trials_failed"] == 0
    assert len({t["hyperparameters"]["lr"] for t in trials}) == 3
    assert all(sweep["low"] <= t["hyperparameters"]["lr"] <= sweep["high"] for t in trials)
    assert all(t["status"] == "Completed" and t["objective"] > 0 for t in trials), trials
    best = min(trials, key=lambda t: t["objective"])
    assert found["best_objective"] == best["objective"]
    assert found["best_hyperparameters"] == {"lr": best["hyperparameters"]["lr"]}

    trained = run("trained_checkpoint", {**PRODUCTION, "use_tuning": True}, warm_graph)
    assert trained.success and gate_check(trained).passed, failure_message(trained)
    checkpoint = metadata(trained, "trained_checkpoint")
    assert checkpoint["tuned_by_run"] == tuned.run_id and checkpoint["tuning_job"] == record["job"]
    assert checkpoint["fingerprint_inputs"]["config"]["lr"] == best["hyperparameters"]["lr"]
    assert "tuned_hyperparameters" in checkpoint["fingerprint_inputs"]["upstream"], "lineage names the tuning"

    # A wider search of the same data and trainer starts from the first: its first three draws are not rerun.
    wider = run("tuned_hyperparameters", {**search, "max_trials": 4}, warm_graph)
    assert wider.success, failure_message(wider)
    again = json.loads(Path(str(metadata(wider, "tuned_hyperparameters")["dagster/uri"]), "manifest.json").read_text())
    assert sum(t["status"].startswith("reused from") for t in again["trials"]) == 3 and len(again["trials"]) == 4


@pytest.mark.slow
def test_where_the_gate_is_not_enforced_the_check_warns_and_training_runs(warm_graph, monkeypatch):
    monkeypatch.delenv(GATE_VARIABLE, raising=False)  # auto: the local backend does not enforce it
    result = run("trained_checkpoint", {**PRODUCTION, "wandb_mode": "disabled"}, warm_graph)  # not rehearsed
    assert result.success, failure_message(result)
    check = gate_check(result)
    assert not check.passed and check.severity == AssetCheckSeverity.WARN
    assert "not enforced here: the local backend" in check.description
    assert any(e.event_type == DagsterEventType.ASSET_MATERIALIZATION for e in result.all_events)
