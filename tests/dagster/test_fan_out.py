"""Validation and packing spread over several instances: the read list planned first, the map on every host
(each reading its part of the list), the reduce on one; the same two stages on the local backend and SageMaker."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import botocore.session
import pandas as pd
import pyarrow as pa
import pytest
from botocore.validate import validate_parameters
from conftest import make_resources
from dagster import asset, instance_for_test, materialize
from helpers.graph_runs import materialize_source, materialize_tail, sources_of

from training_code.lib.read_list import read_list_of
from training_code.lib.shard_format import open_shard, read_manifest
from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.backends.sagemaker.code_package import build_code_package
from zero_assets.backends.sagemaker.job_params import build_job_params
from zero_assets.backends.sagemaker.settings import sagemaker_settings_from_env
from zero_assets.core.job_request import JobRequest, spread_over
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets import arrow_shards, training_set
from zero_assets.defs.assets.raw_image_index import raw_image_index
from zero_assets.defs.assets.validated_images import VALIDATION_SPREAD, validated_images

SOURCE = "line_a_camera"

FINGERPRINT = "0123456789abcdef" * 4
READS = "s3://lake/zero/reads/validated_images/0123456789abcdef"
KEYS = [f"src/{i:03d}.jpg" for i in range(10)]
SIZES = [100 * (i + 1) for i in range(10)]


def planned_list(inputs, arguments):
    """A stand-in plan: ten images of growing size under the raw root."""
    table = pa.table({"key": KEYS, "size": SIZES, "etag": [f"e{i}" for i in range(10)]})
    return read_list_of("s3://raw/root/src", table, 10_000)


def validation_request(**changes) -> JobRequest:
    fields = dict(
        asset="validated_images",
        kind="processing",
        module="training_code.validate",
        fingerprint=FINGERPRINT,
        inputs={"index": "s3://lake/zero/raw_image_index/a", "previous": "s3://lake/zero/validated_images/p"},
        outputs={"out": "s3://lake/zero/validated_images/0123456789abcdef"},
        arguments={"min_side": "8"},
    )
    return JobRequest(**{**fields, **changes})


def staged(instances: int):
    spread = type(VALIDATION_SPREAD)(plan=planned_list, collected_input="decoded")
    return spread_over(validation_request(), spread, lambda request, work: instances, READS, write=False)


def test_the_map_reads_its_part_of_the_read_list_and_the_reduce_collects_it():
    mapped, reduced = staged(3)
    assert (mapped.stage, mapped.instance_count, mapped.inputs) == ("map", 3, {"reads": READS})
    assert mapped.outputs == {"out": "s3://lake/zero/validated_images/0123456789abcdef-map"}
    assert mapped.arguments == {"min_side": "8", "phase": "map"}
    # Host 0 of 3 reads rows 0, 3, 6, 9: the busiest, and what each host's volume is sized for.
    assert (mapped.reads.objects, mapped.reads.bytes, mapped.reads.host_bytes) == (
        10,
        sum(SIZES),
        100 + 400 + 700 + 1000,
    )
    assert mapped.reads.raw_uri == "s3://raw/root/src" and mapped.reads_s3()
    assert (reduced.stage, reduced.instance_count, reduced.reads.host_bytes) == ("reduce", 1, 0)
    assert reduced.inputs == {**validation_request().inputs, "reads": READS, "decoded": mapped.outputs["out"]}
    assert reduced.outputs == validation_request().outputs and reduced.arguments["phase"] == "reduce"
    assert mapped.fingerprint == reduced.fingerprint == FINGERPRINT, "one materialization, one fingerprint"
    assert len({mapped.job_name, reduced.job_name, validation_request().job_name}) == 3
    single, alone = staged(1)
    assert single is None and alone.stage == "" and alone.reads.host_bytes == sum(SIZES)
    assert alone.inputs == {**validation_request().inputs, "reads": READS}


def test_the_parts_of_a_read_list_are_disjoint_and_together_complete():
    reads = planned_list({}, {})
    parts = [reads.part(host, 3) for host in range(3)]
    assert sorted(key for part in parts for key in part.keys()) == KEYS
    assert all(part.objects for part in parts) and sum(part.objects for part in parts) == len(KEYS)
    assert reads.largest_part_bytes(3) == max(sum(SIZES[host::3]) for host in range(3)) == parts[0].read_bytes


AWS_ENV = {
    "ZERO_SM_REGION": "us-east-1",
    "ZERO_SM_ROLE_ARN": "arn:aws:iam::123456789012:role/zero",
    "ZERO_SM_BUCKET": "lake",
    "ZERO_SM_PROCESSING_IMAGE_URI": "1.dkr.ecr.us-east-1.amazonaws.com/p:1",
    "ZERO_SM_TRAINING_IMAGE_URI": "1.dkr.ecr.us-east-1.amazonaws.com/t:1",
}


def test_sagemaker_requests_put_the_map_on_every_instance_and_the_reduce_on_one():
    aws = sagemaker_settings_from_env(AWS_ENV)
    service = botocore.session.get_session().get_service_model("sagemaker")
    params = {}
    for request in staged(4):
        _, params[request.stage] = build_job_params(
            request, aws, job_name=request.job_name, code=build_code_package(), environment={}
        )
        validate_parameters(params[request.stage], service.operation_model("CreateProcessingJob").input_shape)
    inputs = {i["InputName"]: i["S3Input"] for i in params["map"]["ProcessingInputs"]}
    assert set(inputs) == {"code", "reads"}, "the map is handed its read list, never the raw prefix"
    assert {i["S3DataDistributionType"] for i in inputs.values()} == {"FullyReplicated"}
    assert params["map"]["ProcessingResources"]["ClusterConfig"]["InstanceCount"] == 4
    assert params["reduce"]["ProcessingResources"]["ClusterConfig"]["InstanceCount"] == 1
    assert {i["InputName"] for i in params["reduce"]["ProcessingInputs"]} == {
        "code",
        "index",
        "previous",
        "reads",
        "decoded",
    }
    assert params["map"]["AppSpecification"]["ContainerArguments"][-2:] == ["--phase", "map"]
    # Without a read list to split, several instances would each redo the whole job: refused, naming the setting.
    many = sagemaker_settings_from_env({**AWS_ENV, "ZERO_SM_MAP_REPORT_INSTANCE_COUNT": "4"})
    with pytest.raises(ValueError, match="ZERO_SM_MAP_REPORT_INSTANCE_COUNT=4, but its job splits no work"):
        request = validation_request(asset="map_report", inputs={})
        build_job_params(request, many, job_name="n", code=build_code_package(), environment={})


def _validate_locally(raw: Path, state: Path, hosts: int) -> tuple[dict, Path]:
    resources = make_resources(raw, state)
    resources["jobs"] = LocalJobRunner(settings=resources["settings"], instances={"validated_images": hosts})
    (state / "dagster").mkdir()
    with instance_for_test(
        temp_dir=str(state / "dagster")
    ) as instance:  # its own history: no cache hit from the other run
        result = materialize_source(
            SOURCE, instance=instance, resources=resources, assets=[raw_image_index, validated_images]
        )
    assert result.success
    event = result.asset_materializations_for_node("validated_images")[0]
    metadata = {key: value.value for key, value in event.metadata.items()}
    return {**metadata, "data_version": event.tags["dagster/data_version"]}, Path(metadata["dagster/uri"])


def test_two_hosts_reach_the_same_manifest_as_one(tiny_raw_root, tmp_path):
    one, one_out = _validate_locally(tiny_raw_root, tmp_path / "one", hosts=1)
    two, two_out = _validate_locally(tiny_raw_root, tmp_path / "two", hosts=2)
    assert (two_out / "manifest.json").read_bytes() == (one_out / "manifest.json").read_bytes()
    assert two["data_version"] == one["data_version"]
    assert two["instance_count"] == 1 and two["map_instance_count"] == 2
    assert two["job_name"].startswith("zero-validated-images-reduce-") and two["map_job_name"].startswith(
        "zero-validated-images-map-"
    )
    # Each host decoded its own part: the parts are disjoint and cover every image of the index.
    parts = {path.name: pd.read_parquet(path) for path in sorted(Path(f"{two_out}-map").glob("verdicts-*.parquet"))}
    assert set(parts) == {"verdicts-algo-1.parquet", "verdicts-algo-2.parquet"}
    keys = [key for frame in parts.values() for key in frame["key"]]
    assert len(keys) == len(set(keys)) == one["images_in"] and all(len(frame) for frame in parts.values())
    tables = sorted(path.name for path in one_out.glob("*.parquet"))
    for name in tables:
        pd.testing.assert_frame_equal(pd.read_parquet(two_out / name), pd.read_parquet(one_out / name))
    assert sorted(p.name for p in Path(f"{two_out}-map").iterdir()) == sorted(parts), "the map writes verdicts only"
    assert json.loads((two_out / "manifest.json").read_text())["counts"]["images_in"] == one["images_in"]


HOST_JOB = '''
"""A job that fails on one host and sleeps on another, to drive the local runner's multi-host paths."""
import argparse, os, time
from training_code.lib import job_env

parser = argparse.ArgumentParser()
parser.add_argument("--out")
parser.add_argument("--failing-host", default="")
parser.add_argument("--sleeping-host", default="")
args = parser.parse_args()
with job_env.pipes_session() as pipes:
    host = job_env.current_host()
    (job_env.opt_ml() / "output" / "pid").write_text(str(os.getpid()))
    if host == args.sleeping_host:
        time.sleep(120)
    if host == args.failing_host:
        raise RuntimeError(f"planted failure on {host}")
    pipes.report_asset_materialization(metadata={"host": host}, data_version="v1")
'''


def _run_on_hosts(tmp_path, monkeypatch, hosts: int, **arguments: str):
    package = tmp_path / "code" / "zero_host_jobs"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "host_job.py").write_text(HOST_JOB)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "code"))
    settings = ZeroSettings(raw_uri=str(tmp_path), lake_uri=str(tmp_path / "lake"), fsx_mount=str(tmp_path / "fsx"))
    runner = LocalJobRunner(settings=settings)
    request = JobRequest(
        asset="probe",
        kind="processing",
        module="zero_host_jobs.host_job",
        fingerprint=FINGERPRINT,
        outputs={"out": str(tmp_path / "lake" / "probe")},
        arguments=arguments,
        instance_count=hosts,
    )

    @asset
    def probe(context):  # no annotation: this module uses postponed annotations, which Dagster cannot read
        invocation, _ = runner.run(context, request)
        return invocation.get_materialize_result()

    started = time.monotonic()
    result = materialize([probe], raise_on_error=False)
    failures = result.get_step_failure_events()
    return (
        result,
        (failures[0].step_failure_data.error.message if failures else ""),
        time.monotonic() - started,
        runner.run_folder(request, result.run_id),
    )


def test_a_failing_host_other_than_the_first_fails_the_job_naming_it(tmp_path, monkeypatch):
    result, message, _, _ = _run_on_hosts(tmp_path, monkeypatch, 3, failing_host="algo-2")
    assert not result.success
    assert "failed on algo-2" in message and "planted failure on algo-2" in message


def test_when_the_first_host_fails_no_other_host_outlives_the_job(tmp_path, monkeypatch):
    result, message, elapsed, run_dir = _run_on_hosts(
        tmp_path, monkeypatch, 2, failing_host="algo-1", sleeping_host="algo-2"
    )
    assert not result.success and "planted failure on algo-1" in message
    assert elapsed < 60, "the sleeping host was killed, not waited for"
    sleeper = int((run_dir / "hosts" / "algo-2" / "opt" / "ml" / "output" / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(sleeper, 0)


def _pack_locally(raw: Path, state: Path, hosts: int) -> tuple[dict, Path]:
    """The tiny root's sources validated and selected, then packed on `hosts` local hosts."""
    resources = make_resources(raw, state)
    resources["jobs"] = LocalJobRunner(settings=resources["settings"], instances={"arrow_shards": hosts})
    (state / "dagster").mkdir()
    config = {"ops": {"arrow_shards": {"config": {"target_shard_bytes": 20_000}}}}
    with instance_for_test(temp_dir=str(state / "dagster")) as instance:
        for source in sources_of(raw):
            assert materialize_source(source, instance=instance, resources=resources).success
        result = materialize_tail(
            instance=instance, resources=resources, assets=[training_set, arrow_shards], run_config=config
        )
    assert result.success
    event = result.asset_materializations_for_node("arrow_shards")[0]
    metadata = {key: value.value for key, value in event.metadata.items()}
    return metadata, Path(metadata["dagster/uri"])


def test_a_pack_on_two_hosts_holds_the_rows_one_host_packs(tiny_raw_root, tmp_path):
    one, one_out = _pack_locally(tiny_raw_root, tmp_path / "one", hosts=1)
    two, two_out = _pack_locally(tiny_raw_root, tmp_path / "two", hosts=2)
    assert (two["instance_count"], two["map_instance_count"]) == (1, 2)
    assert two["job_name"].startswith("zero-arrow-shards-reduce-") and two["map_job_name"].startswith(
        "zero-arrow-shards-map-"
    )
    manifests = [read_manifest(out) for out in (one_out, two_out)]
    # The map hosts wrote their shards into the set's own folder; the reduce listed them, manifest last.
    assert all(
        entry["path"].startswith("shards/") and (two_out / entry["path"]).is_file() for entry in manifests[1]["shards"]
    )
    assert sorted(p.name for p in Path(f"{two_out}-map").iterdir()) == ["part-algo-1.json", "part-algo-2.json"]
    rows = [
        sorted((key, e["split"]) for e in m["shards"] for key in open_shard(out / e["path"]).column("key").to_pylist())
        for m, out in zip(manifests, (one_out, two_out))
    ]
    assert rows[0] == rows[1] and manifests[0]["rows"] == manifests[1]["rows"], "the same rows, in the same splits"
    assert manifests[0]["categories"] == manifests[1]["categories"]
