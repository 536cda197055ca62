"""Cost metadata of job-backed materializations and the run's total, on the SageMaker fakes (moto S3 and
CloudWatch Logs, a fake SageMaker that really runs the job) and on the local backend."""

from __future__ import annotations

import json

import pytest
from dagster import (
    AssetKey,
    DagsterEventType,
    Definitions,
    MaterializeResult,
    asset,
    build_run_status_sensor_context,
    build_sensor_context,
    define_asset_job,
    materialize,
)
from helpers.graph_runs import materialize_source, sources_of
from helpers.sagemaker_fakes import fake_aws, fake_settings

from zero_assets.backends.job_cost import BUILT_IN_PRICES, PRICE_TABLE_ENV, job_cost, price_table
from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.backends.sagemaker.code_package import upload_code_package
from zero_assets.backends.sagemaker.job_params import build_job_params
from zero_assets.backends.sagemaker.pipes_client import PipesSageMakerClient
from zero_assets.backends.sagemaker.settings import JobCompute
from zero_assets.core.job_request import JobRequest, Reads, job_name
from zero_assets.defs.assets import raw_image_index, validated_images
from zero_assets.defs.run_cost import run_cost_sensors

BUCKET = "zero-cost"
FINGERPRINT = "fedcba9876543210" * 4
RUN_SECONDS = 600  # what the fake reports every ended job ran, per instance
M5_XLARGE = json.loads(BUILT_IN_PRICES.read_text())["usd_per_instance_hour"]["us-east-1"]["ml.m5.xlarge"]
JOB = '''
"""python -m zero_cost_jobs.job --mode ok|fail"""
import argparse
from training_code.lib import job_env

parser = argparse.ArgumentParser()
parser.add_argument("--mode", default="ok")
args, _ = parser.parse_known_args()  # --items and --out: the Processing job's input and output folders
with job_env.pipes_session() as pipes:
    if args.mode == "fail":
        raise RuntimeError("planted failure")
    pipes.report_asset_materialization(metadata={"rows": 1}, data_version="v1")
'''


@pytest.fixture
def aws(moto_endpoint, tmp_path, monkeypatch):
    monkeypatch.delenv(PRICE_TABLE_ENV, raising=False)
    setup = fake_aws(moto_endpoint, tmp_path, monkeypatch, BUCKET, "zero_cost_jobs", {"job": JOB})
    setup.fake.run_seconds = RUN_SECONDS
    return {
        "s3": setup.s3,
        "logs": setup.logs,
        "fake": setup.fake,
        "package": setup.package,
        "pipes_uri": setup.pipes_uri,
    }


def params_for(aws, kind: str, compute: JobCompute, *, mode: str = "ok", use_spot: bool = False) -> dict:
    """Create*Job parameters as the SageMaker runner builds them, with `compute` for the job."""
    asset_name = "trained_checkpoint" if kind == "training" else "map_report"
    settings = fake_settings(bucket=BUCKET, prefix="zero", use_spot=use_spot, **{asset_name: compute})
    upload_code_package(aws["package"], settings.s3_root(), aws["s3"])
    processing = {}
    if kind == "processing":  # several instances split their read list, as a fanned-out job's map stage does
        for key in ("items/a", "items/b"):
            aws["s3"].put_object(Bucket=BUCKET, Key=f"zero/{key}", Body=b"x")
        processing = {
            "inputs": {"items": f"s3://{BUCKET}/zero/items/"},
            "instance_count": compute.instance_count,
            "reads": Reads(f"s3://{BUCKET}/zero/items/", f"s3://{BUCKET}/zero/raw", 2, 2, 1),
            "outputs": {"out": f"s3://{BUCKET}/zero/lake/{asset_name}/{FINGERPRINT[:16]}"},
        }
    request = JobRequest(
        asset=asset_name,
        kind=kind,
        module="zero_cost_jobs.job",
        fingerprint=FINGERPRINT,
        arguments={"mode": mode},
        launcher="python",
        **processing,
    )
    return build_job_params(
        request, settings, job_name=job_name(asset_name, FINGERPRINT, 1), code=aws["package"], environment={}
    )[1]


def client(aws) -> PipesSageMakerClient:
    return PipesSageMakerClient(
        client=aws["fake"],
        logs_client=aws["logs"],
        s3_client=aws["s3"],
        pipes_uri=aws["pipes_uri"],
        poll_interval=0.2,
        message_poll_interval=0.2,
    )


def job_asset(name: str, pipes: PipesSageMakerClient, kind: str, params: dict):
    @asset(name=name)
    def job_backed(context):
        return pipes.run(context=context, kind=kind, params=params).get_materialize_result()

    return job_backed


def metadata_of(instance, name: str) -> dict:
    event = instance.get_latest_materialization_event(AssetKey(name))
    return {key: value.value for key, value in event.asset_materialization.metadata.items()}


def test_training_and_processing_with_the_same_instances_and_seconds_cost_the_same(aws, instance):
    compute = JobCompute(instance_type="ml.m5.xlarge", instance_count=2)
    pipes = client(aws)
    result = materialize(
        [
            job_asset("processed", pipes, "processing", params_for(aws, "processing", compute)),
            job_asset("trained", pipes, "training", params_for(aws, "training", compute)),
        ],
        instance=instance,
    )
    assert result.success
    processed, trained = metadata_of(instance, "processed"), metadata_of(instance, "trained")
    expected_usd = round(2 * RUN_SECONDS * M5_XLARGE / 3600, 4)
    for metadata in (processed, trained):
        assert metadata["instance_type"] == "ml.m5.xlarge" and metadata["instance_count"] == 2
        assert (
            metadata["instance_seconds"] == metadata["billable_instance_seconds"] == 2 * RUN_SECONDS
        )  # seconds x instances, both kinds
        assert metadata["estimated_cost_usd"] == pytest.approx(expected_usd)
        assert metadata["managed_spot"] is False and "spot_savings_usd" not in metadata
        assert (
            metadata["price_source"].startswith(
                "zero_assets/backends/sagemaker/prices.json (https://aws.amazon.com/sagemaker/pricing/"
            )
            and "as of" in metadata["price_source"]
        )
    assert (
        "billable_seconds" not in processed and "billable_seconds" not in trained
    )  # the old key with two meanings is gone


def test_managed_spot_records_savings_and_the_price_paid(aws, instance):
    fake = aws["fake"]
    compute = JobCompute(instance_type="ml.g4dn.xlarge", instance_count=2)
    params = params_for(aws, "training", compute, use_spot=True)
    assert params["EnableManagedSpotTraining"] is True
    assert materialize([job_asset("trained", client(aws), "training", params)], instance=instance).success
    metadata = metadata_of(instance, "trained")
    on_demand = json.loads(BUILT_IN_PRICES.read_text())["usd_per_instance_hour"]["us-east-1"]["ml.g4dn.xlarge"]
    billed = int(RUN_SECONDS * fake.spot_billed_share) * 2  # BillableTimeInSeconds x InstanceCount
    assert metadata["managed_spot"] is True
    assert metadata["instance_seconds"] == 2 * RUN_SECONDS and metadata["billable_instance_seconds"] == billed
    assert metadata["estimated_cost_usd"] == pytest.approx(round(billed * on_demand / 3600, 4))
    assert metadata["spot_savings_pct"] == pytest.approx(70.0)  # SageMaker's formula: 1 - Billable / TrainingTime
    assert metadata["spot_savings_usd"] == pytest.approx(round((2 * RUN_SECONDS - billed) * on_demand / 3600, 4))
    assert metadata["spot_usd_per_instance_hour"] == pytest.approx(round(on_demand * 0.3, 4))
    assert metadata["on_demand_usd_per_instance_hour"] == on_demand


def test_an_instance_type_without_a_price_gets_no_figure_until_the_named_price_table_has_one(
    aws, instance, tmp_path, monkeypatch
):
    params = params_for(aws, "processing", JobCompute(instance_type="ml.m5.24xlarge", instance_count=3))
    assert materialize([job_asset("processed", client(aws), "processing", params)], instance=instance).success
    metadata = metadata_of(instance, "processed")
    assert metadata["instance_seconds"] == 3 * RUN_SECONDS  # counted, not priced
    assert "estimated_cost_usd" not in metadata and "on_demand_usd_per_instance_hour" not in metadata
    assert (
        "no price for ml.m5.24xlarge in us-east-1" in metadata["cost_note"] and PRICE_TABLE_ENV in metadata["cost_note"]
    )

    override = tmp_path / "our-prices.json"
    override.write_text(
        json.dumps(
            {
                "source": "our negotiated rates",
                "as_of": "2026-11",
                "usd_per_instance_hour": {"us-east-1": {"ml.m5.24xlarge": 3.6, "ml.m5.xlarge": 0.36}},
            }
        )
    )
    monkeypatch.setenv(PRICE_TABLE_ENV, str(override))
    table = price_table()
    assert table.price("us-east-1", "ml.m5.xlarge").usd_per_instance_hour == 0.36  # overridden
    assert table.price("us-east-1", "ml.c5.4xlarge") is not None  # the built-in entries it does not name stay
    described = aws["fake"].describe_processing_job(ProcessingJobName=params["ProcessingJobName"])
    priced = job_cost("processing", described, "us-east-1", table)  # the same job, priced by the named table
    assert priced["estimated_cost_usd"] == pytest.approx(3 * RUN_SECONDS * 3.6 / 3600) and "cost_note" not in priced
    assert (
        f"{PRICE_TABLE_ENV}={override}" in priced["price_source"] and "our negotiated rates" in priced["price_source"]
    )
    assert job_cost("processing", described, "eu-west-1", table)["cost_note"].startswith(
        "no price for ml.m5.24xlarge in eu-west-1"
    )


@pytest.mark.parametrize(
    "content, complaint",
    [
        ("{not json", "cannot read it as JSON"),
        (json.dumps({"usd_per_instance_hour": {}}), "missing ['source', 'as_of']"),
        (
            json.dumps(
                {"source": "s", "as_of": "d", "usd_per_instance_hour": {"us-east-1": {"ml.m5.xlarge": "cheap"}}}
            ),
            "us-east-1.ml.m5.xlarge is 'cheap'",
        ),
    ],
)
def test_a_bad_price_table_fails_before_any_job_launches(aws, tmp_path, monkeypatch, content, complaint):
    bad = tmp_path / "prices.json"
    bad.write_text(content)
    monkeypatch.setenv(PRICE_TABLE_ENV, str(bad))
    with pytest.raises(ValueError, match=PRICE_TABLE_ENV) as raised:
        client(aws)
    assert complaint in str(raised.value) and not aws["fake"].calls


def test_the_run_total_adds_up_its_jobs_failed_ones_included_cache_hits_excluded(aws, instance):
    pipes = client(aws)
    compute = JobCompute(instance_type="ml.m5.xlarge", instance_count=2)

    @asset(name="reused")
    def reused():  # what a cache hit reports: the metadata of the run that paid for the job
        return MaterializeResult(metadata={"cache": "hit", "instance_seconds": 99999.0, "estimated_cost_usd": 999.0})

    result = materialize(
        [
            job_asset("processed", pipes, "processing", params_for(aws, "processing", compute)),
            job_asset(
                "trained",
                pipes,
                "training",
                params_for(aws, "training", JobCompute(instance_type="ml.m5.xlarge"), mode="fail"),
            ),
            reused,
        ],
        instance=instance,
        raise_on_error=False,
    )
    assert not result.success
    failures = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
    assert (
        len(failures) == 1
        and failures[0].step_failure_data.user_failure_data.metadata["instance_seconds"].value == RUN_SECONDS
    )
    [on_failure] = [s for s in run_cost_sensors if s.name == "run_cost_on_failure"]
    on_failure(
        build_run_status_sensor_context(
            sensor_name=on_failure.name,
            dagster_instance=instance,
            dagster_run=result.dagster_run,
            dagster_event=result.get_run_failure_event(),
        )
    )
    tags = instance.get_run_by_id(result.run_id).tags
    # 2 instances x 600 s of the processing job and 1 x 600 s of the failed training job, both ml.m5.xlarge
    assert tags["zero/jobs"] == "2" and tags["zero/instance_seconds"] == str(3 * RUN_SECONDS)
    assert tags["zero/estimated_cost_usd"] == f"{3 * RUN_SECONDS * M5_XLARGE / 3600:.2f}"
    assert "zero/cost_note" not in tags and "zero/spot_savings_usd" not in tags


def test_local_jobs_count_their_time_and_have_no_price(resources, instance, tiny_raw_root):
    source = sources_of(tiny_raw_root)[0]
    # Validation spread over two local hosts: a map job on both, then a reduce job on one (see job_request.spread_over).
    jobs = LocalJobRunner(settings=resources["settings"], instances={"validated_images": 2})
    result = materialize_source(
        source, instance=instance, resources={**resources, "jobs": jobs}, assets=[raw_image_index, validated_images]
    )
    records = instance.fetch_materializations(AssetKey("validated_images"), limit=1).records
    metadata = {key: value.value for key, value in records[0].asset_materialization.metadata.items()}
    assert metadata["backend"] == "local" and metadata["map_instance_count"] == 2 and metadata["instance_count"] == 1
    for stage in ("map_", ""):
        assert metadata[f"{stage}instance_seconds"] == pytest.approx(
            metadata[f"{stage}job_wall_s"] * metadata[f"{stage}instance_count"], abs=0.02
        )
        assert "not priced" in metadata[f"{stage}cost_note"] and f"{stage}estimated_cost_usd" not in metadata
    [on_success] = [s for s in run_cost_sensors if s.name == "run_cost_on_success"]
    on_success(
        build_run_status_sensor_context(
            sensor_name=on_success.name,
            dagster_instance=instance,
            dagster_run=result.dagster_run,
            dagster_event=result.get_run_success_event(),
        )
    )
    tags = instance.get_run_by_id(result.run_id).tags
    assert (
        tags["zero/jobs"] == "2" and "zero/estimated_cost_usd" not in tags
    )  # the map and the reduce job; the index ran in process
    assert float(tags["zero/instance_seconds"]) == pytest.approx(
        metadata["map_instance_seconds"] + metadata["instance_seconds"], abs=1
    )
    assert "2 of 2 jobs not priced" in tags["zero/cost_note"] and "local backend" in tags["zero/cost_note"]


def test_the_sensor_as_the_daemon_ticks_it_tags_a_run_of_the_code_location(instance):
    @asset(name="priced")
    def priced():
        return MaterializeResult(
            metadata={"instance_seconds": 120.0, "estimated_cost_usd": 0.5, "spot_savings_usd": 0.25}
        )

    defs = Definitions(assets=[priced], jobs=[define_asset_job("priced_job", [priced])], sensors=run_cost_sensors)
    [sensor], repository = [s for s in run_cost_sensors if s.name == "run_cost_on_success"], defs.get_repository_def()
    first = sensor.evaluate_tick(
        build_sensor_context(instance=instance, repository_def=repository)
    )  # starts its cursor here
    run = defs.resolve_job_def("priced_job").execute_in_process(instance=instance)
    sensor.evaluate_tick(build_sensor_context(instance=instance, repository_def=repository, cursor=first.cursor))
    tags = instance.get_run_by_id(run.run_id).tags
    assert (
        tags["zero/jobs"],
        tags["zero/instance_seconds"],
        tags["zero/estimated_cost_usd"],
        tags["zero/spot_savings_usd"],
    ) == ("1", "120", "0.50", "0.25")
