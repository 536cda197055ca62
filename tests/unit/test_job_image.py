"""The job image route: docker/Dockerfile installs exactly the job scripts' requirements at the lock's
pins on a base of the lock's torch and the project's Python, and with ZERO_SM_IMAGES_HOLD_REQUIREMENTS
the rendered requests name the image and the code package carries no requirements file."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from zero_assets.backends.sagemaker.code_package import JOB_REQUIREMENTS, build_code_package
from zero_assets.backends.sagemaker.settings import sagemaker_settings_from_env

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = (REPO / "docker" / "Dockerfile").read_text()


def lock() -> dict[str, str]:
    lines = (REPO / "requirements.lock").read_text().splitlines()
    return {name.lower(): version for name, sep, version in (line.partition("==") for line in lines) if sep}


def test_the_dockerfile_installs_the_job_requirements_at_the_lock_pins():
    [install] = re.findall(r"RUN python3 -m pip install (.+?)(?:\n\n|\Z)", DOCKERFILE, re.S)
    words = install.replace("\\\n", " ").split()
    assert words[:3] == ["--no-cache-dir", "-c", "/opt/zero/requirements.lock"]
    assert "COPY requirements.lock /opt/zero/requirements.lock" in DOCKERFILE
    packages = words[3:]
    assert packages and sorted(packages) == sorted(JOB_REQUIREMENTS)
    assert all(package.lower() in lock() for package in packages), "every one pinned by the lock"


def test_the_base_image_is_the_locks_torch_on_the_projects_python():
    [base] = re.findall(r"^ARG BASE_IMAGE=(\S+)$", DOCKERFILE, re.M)
    tag = re.fullmatch(r".+/pytorch-training:(\d+\.\d+\.\d+)-(gpu|cpu)-py(\d)(\d+)-.+", base)
    assert tag, base
    assert tag.group(1) == lock()["torch"]
    python = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert f">={tag.group(3)}.{tag.group(4)}" in python


def test_with_images_that_hold_them_the_package_has_no_requirements_file():
    environ = {
        "ZERO_SM_REGION": "us-east-1",
        "ZERO_SM_ROLE_ARN": "arn:aws:iam::123456789012:role/zero",
        "ZERO_SM_BUCKET": "zero-lake",
        "ZERO_SM_TRAINING_IMAGE_URI": "123456789012.dkr.ecr.us-east-1.amazonaws.com/zero-jobs:1",
        "ZERO_SM_PROCESSING_IMAGE_URI": "123456789012.dkr.ecr.us-east-1.amazonaws.com/zero-jobs:1",
    }
    assert not sagemaker_settings_from_env(environ).images_hold_requirements
    assert sagemaker_settings_from_env({**environ, "ZERO_SM_IMAGES_HOLD_REQUIREMENTS": "true"}).images_hold_requirements
    with_file, without = build_code_package(), build_code_package(requirements=False)
    assert "requirements.txt" in with_file.files and "requirements.txt" not in without.files
    assert set(with_file.files) - set(without.files) == {"requirements.txt"} and with_file.digest != without.digest
