"""Preflight: each check that takes seconds fails naming what is wrong, and passes when nothing is. The job role's
permissions against a simulated role (botocore-validated IAM answers: moto has no SimulatePrincipalPolicy), the
checkpoint prefix on a moto S3 and on a local folder, the FSx association, the W&B key against a loopback W&B
login endpoint; and the whole preflight as the SageMaker runner's settings give it."""

from __future__ import annotations

import pytest
from helpers.sagemaker_fake_preflight import FakeFsx, FakeIam, wandb_server
from helpers.sagemaker_fakes import aws_env, fake_settings

from training_code.lib.aws_clients import client as aws_client
from zero_assets.backends.preflight import WandbLogin, failed, local_wandb_login, wandb_key_finding, writable_prefix
from zero_assets.backends.sagemaker import preflight as sagemaker_preflight
from zero_assets.backends.sagemaker.preflight import PreflightClients, association_finding, role_finding, role_needs
from zero_assets.backends.sagemaker.runner import SageMakerJobRunner
from zero_assets.core.settings import ZeroSettings

ROLE = "arn:aws:iam::123456789012:role/zero-jobs"
LAKE = "s3://zero-preflight/zero/lake"
RAW = "s3://zero-raw-images/cameras"
FS = "fs-0123456789abcdef0"
KEY = "good-wandb-key-0123456789abcdef0123456789abcdef"


@pytest.fixture
def s3(moto_endpoint, monkeypatch):
    for key, value in aws_env(moto_endpoint).items():
        monkeypatch.setenv(key, value)
    client = aws_client("s3", endpoint_url=moto_endpoint)
    if "zero-preflight" not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket="zero-preflight")
    return client


def test_a_denied_permission_is_named_with_its_resource_and_decision():
    aws = fake_settings(bucket="zero-preflight", wandb_secret_arn="arn:aws:secretsmanager:us-east-1:123:secret:wandb")
    needs = role_needs(aws, LAKE, RAW)
    assert needs["arn:aws:s3:::zero-preflight/zero/*"] == ("s3:GetObject", "s3:PutObject")
    assert "arn:aws:ecr:us-east-1:763104351884:repository/pytorch-training" in needs
    assert needs["arn:aws:s3:::zero-raw-images/cameras/*"] == ("s3:GetObject",), "raw data is read, never written"
    assert "arn:aws:s3:::zero-preflight/zero/lake/*" not in needs, "the lake is inside the bucket's prefix"
    iam = FakeIam(
        denied=[("arn:aws:s3:::zero-preflight/zero/*", "s3:PutObject")],
        allowed=[("*", "*")],
    )
    finding = role_finding(iam, ROLE, needs)
    assert not finding.ok
    assert "s3:PutObject on arn:aws:s3:::zero-preflight/zero/* (explicitDeny)" in finding.detail, finding.detail
    assert "s3:GetObject" not in finding.detail

    secrets_missing = FakeIam(
        allowed=[("arn:aws:s3:::*", "s3:*"), ("*", "logs:*"), ("*", "ecr:*"), ("*", "cloudwatch:*")]
    )
    finding = role_finding(secrets_missing, ROLE, needs)
    assert "secretsmanager:GetSecretValue on arn:aws:secretsmanager:us-east-1:123:secret:wandb (implicitDeny)" in (
        finding.detail
    )
    assert role_finding(FakeIam(), ROLE, needs).ok


def test_a_role_that_cannot_be_simulated_or_does_not_exist_is_named():
    needs = role_needs(fake_settings(bucket="zero-preflight"), LAKE, RAW)
    finding = role_finding(FakeIam(caller_may_simulate=False), ROLE, needs)
    assert not finding.ok and "needs iam:SimulatePrincipalPolicy on the job role" in finding.detail
    finding = role_finding(FakeIam(), "arn:aws:iam::123456789012:role/gone", needs)
    assert not finding.ok and "the job role arn:aws:iam::123456789012:role/gone does not exist" in finding.detail


def test_an_unwritable_checkpoint_prefix_is_named(s3, tmp_path):
    finding = writable_prefix("s3://zero-no-such-bucket/zero/checkpoints/trained_checkpoint", "checkpoints")
    assert not finding.ok
    assert "s3://zero-no-such-bucket/zero/checkpoints/trained_checkpoint is not writable" in finding.detail
    assert "NoSuchBucket" in finding.detail, finding.detail
    ok = writable_prefix("s3://zero-preflight/zero/checkpoints/trained_checkpoint", "checkpoints")
    assert ok.ok, ok.detail
    assert "Contents" not in s3.list_objects_v2(Bucket="zero-preflight", Prefix="zero/checkpoints/"), "probe deleted"

    blocked = tmp_path / "jobs"
    blocked.write_text("a file where the checkpoint folder should be")
    finding = writable_prefix(str(blocked / "trained_checkpoint"), "checkpoints")
    assert not finding.ok and f"{blocked / 'trained_checkpoint'} is not writable" in finding.detail


def test_the_fsx_association_must_cover_the_lake_shards_and_be_available():
    fsx = FakeFsx()
    assert "has no data repository association at /arrow_shards" in association_finding(fsx, FS, LAKE).detail
    fsx.add_association(FS, "/arrow_shards", "s3://other-bucket/shards/")
    finding = association_finding(fsx, FS, LAKE)
    assert not finding.ok and "linked to s3://other-bucket/shards/, which does not cover" in finding.detail
    fsx.associations.clear()
    fsx.add_association(FS, "/arrow_shards", f"{LAKE}/arrow_shards/", "MISCONFIGURED", "bucket policy denies FSx")
    finding = association_finding(fsx, FS, LAKE)
    assert not finding.ok and "is MISCONFIGURED: bucket policy denies FSx" in finding.detail
    fsx.associations.clear()
    fsx.add_association(FS, "/arrow_shards", f"{LAKE}/arrow_shards/")
    assert association_finding(fsx, FS, LAKE).ok


def test_a_bad_wandb_key_is_rejected_naming_where_it_came_from(monkeypatch, tmp_path):
    with wandb_server(KEY) as server:
        good = wandb_key_finding(WandbLogin(server.url, KEY, "WANDB_API_KEY"))
        assert good.ok and "as rehearsal-bot" in good.detail
        bad = wandb_key_finding(WandbLogin(server.url, "revoked-key", "WANDB_API_KEY"))
        assert not bad.ok
        assert f"{server.url} rejected the W&B API key from WANDB_API_KEY (HTTP 401)" in bad.detail
        assert "revoked-key" not in bad.detail, "a key is never shown"
        monkeypatch.delenv("WANDB_API_KEY", raising=False)
        monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
        (tmp_path / "netrc").write_text(f"machine 127.0.0.1\n  login user\n  password {KEY}\n")
        assert wandb_key_finding(local_wandb_login(server.url)).ok, "the key `wandb login` wrote counts"
    missing = wandb_key_finding(WandbLogin("https://api.wandb.ai", None, "ZERO_SM_WANDB_SECRET_ARN is not set"))
    assert not missing.ok and "none was found (ZERO_SM_WANDB_SECRET_ARN is not set)" in missing.detail


def test_the_sagemaker_preflight_checks_prefixes_role_fsx_and_key_together(s3, monkeypatch):
    iam, fsx = FakeIam(denied=[("*", "logs:PutLogEvents")]), FakeFsx()
    fsx.add_association("fs-0123456789abcdef0", "/arrow_shards", f"{LAKE}/arrow_shards/")
    monkeypatch.setattr(sagemaker_preflight, "make_preflight_clients", lambda region: PreflightClients(iam, fsx))
    aws = fake_settings(
        bucket="zero-preflight",
        fsx_file_system_id="fs-0123456789abcdef0",
        fsx_mount_name="abcdefgh",
        subnets=["subnet-1"],
        security_group_ids=["sg-1"],
    )
    settings = ZeroSettings(raw_uri="s3://zero-preflight/zero/raw", lake_uri=LAKE)
    jobs = SageMakerJobRunner(settings=settings, aws=aws)
    with wandb_server(KEY) as server:
        monkeypatch.setenv("WANDB_API_KEY", KEY)  # never what a SageMaker job gets: it reads the secret
        findings = jobs.preflight(settings, {"wandb_mode": "online", "wandb_base_url": server.url})
    by_check = {finding.check: finding for finding in findings}
    assert set(by_check) == {
        "trained_checkpoint checkpoints",
        "training_rehearsal checkpoints",
        "job role",
        "FSx association",
        "W&B key",
    }
    assert by_check["trained_checkpoint checkpoints"].ok and by_check["FSx association"].ok
    assert "logs:PutLogEvents on arn:aws:logs:us-east-1:123456789012:log-group:/aws/sagemaker/*" in (
        by_check["job role"].detail
    )
    assert "ec2:CreateNetworkInterface" in str(iam.calls), "a VPC's network interfaces are among the needs"
    assert "ZERO_SM_WANDB_SECRET_ARN is not set" in by_check["W&B key"].detail
    assert [f.check for f in failed(findings)] == ["job role", "W&B key"]
