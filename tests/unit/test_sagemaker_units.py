"""Pure helpers of the SageMaker backend: job names, environment limits, FSx paths, backend selection."""

from __future__ import annotations

import pytest

from zero_assets.backends.from_env import resources_from_env
from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.backends.sagemaker.attempts import attempt_of
from zero_assets.backends.sagemaker.job_params import check_environment
from zero_assets.backends.sagemaker.pipes_client import failure_description
from zero_assets.backends.sagemaker.runner import SageMakerJobRunner
from zero_assets.backends.sagemaker.training_set_channel import parse_fsx_uri, s3_behind_fsx, shards_on_fsx
from zero_assets.core.job_request import VALID_JOB_NAME as VALID_NAME
from zero_assets.core.job_request import job_name

FP = "a1b2c3d4e5f60718293a4b5c6d7e8f90" * 2


@pytest.mark.parametrize(
    "asset", ["map_report", "trained_checkpoint", "x" * 200, "weird name/with.dots_and_underscores"]
)
@pytest.mark.parametrize("attempt", [1, 7, 123])
def test_job_names_are_deterministic_and_valid(asset, attempt):
    name = job_name(asset, FP, attempt)
    assert name == job_name(asset, FP, attempt) and VALID_NAME.match(name) and len(name) <= 63
    assert name.endswith(f"-{FP[:16]}-a{attempt}")
    assert job_name(asset, FP, attempt + 1) != name
    assert attempt_of(name) == attempt


def test_both_backends_name_a_job_with_the_one_function():
    from zero_assets.core.job_request import JobRequest

    request = JobRequest(
        asset="validated_images", kind="processing", module="training_code.validate", fingerprint=FP, stage="map"
    )
    # The local backend's job is the first attempt of the SageMaker runner's names.
    assert request.job_name == job_name(request.label, FP, 1) == f"zero-validated-images-map-{FP[:16]}-a1"


def test_environment_limits_name_the_entry():
    check_environment({"K": "v" * 512}, "training")
    with pytest.raises(ValueError, match="'BIG'.*256"):
        check_environment({"BIG": "v" * 257}, "processing")
    with pytest.raises(ValueError, match="101 entries"):
        check_environment({f"K{i}": "v" for i in range(101)}, "training")


def test_fsx_locations_map_both_ways():
    lake = "s3://bucket/zero/lake"
    location = shards_on_fsx(f"{lake}/arrow_shards/abcd", lake, "fs-0123456789abcdef0", "mnt1")
    assert location.uri == "fs-0123456789abcdef0/mnt1/arrow_shards/abcd".join(["fsx://", ""])
    assert location.directory_path == "/mnt1/arrow_shards/abcd"
    assert parse_fsx_uri(location.uri) == location
    assert s3_behind_fsx(location.uri, lake) == f"{lake}/arrow_shards/abcd"
    with pytest.raises(ValueError, match="not under the linked prefix"):
        shards_on_fsx("s3://other/arrow_shards/abcd", lake, "fs-1", "m")


def test_stopped_on_max_runtime_is_explained():
    job = {"TrainingJobName": "zero-x", "TrainingJobStatus": "Stopped", "SecondaryStatus": "MaxRuntimeExceeded"}
    text = failure_description("training", job, ["[algo-1] step 10"])
    assert "zero-x Stopped" in text and "MaxRuntimeExceeded" in text and "[algo-1] step 10" in text


def test_backend_is_chosen_from_the_environment(monkeypatch):
    monkeypatch.delenv("ZERO_BACKEND", raising=False)
    assert isinstance(resources_from_env()["jobs"], LocalJobRunner)
    env = {
        "ZERO_BACKEND": "sagemaker",
        "ZERO_SM_REGION": "eu-west-1",
        "ZERO_SM_ROLE_ARN": "arn:aws:iam::123456789012:role/r",
        "ZERO_SM_BUCKET": "b",
        "ZERO_SM_TRAINING_IMAGE_URI": "t",
        "ZERO_SM_PROCESSING_IMAGE_URI": "p",
        "ZERO_PROFILE": "rehearsal",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("ZERO_LAKE_URI", raising=False)
    resources = resources_from_env()
    assert isinstance(resources["jobs"], SageMakerJobRunner)
    assert resources["settings"].lake_uri == "s3://b/zero/lake" and resources["settings"].sample_images
    assert resources["jobs"].aws.trained_checkpoint.instance_count == 2
    monkeypatch.delenv("ZERO_SM_BUCKET")
    with pytest.raises(ValueError, match="ZERO_SM_BUCKET"):
        resources_from_env()


def test_multi_instance_processing_without_a_read_list_to_split_is_refused():
    from zero_assets.backends.sagemaker.job_params import _processing_params
    from zero_assets.core.job_request import JobRequest

    class Compute:
        instance_count, instance_type, volume_size_gb, max_runtime_s = 2, "ml.m5.xlarge", 50, 3600

    class Settings:
        def compute(self, asset):
            return Compute()

    request = JobRequest(
        asset="validated_images", kind="processing", module="training_code.validate", fingerprint="f" * 64
    )
    # Unplanned (no read list to split by host), every instance would redo the whole job.
    with pytest.raises(ValueError, match="ZERO_SM_VALIDATED_IMAGES_INSTANCE_COUNT=2, but its job splits no work"):
        _processing_params(request, Settings(), "job", None, {}, "s3://bucket/lake")
