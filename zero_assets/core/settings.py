"""Where things live (`ZeroSettings`), and the one reader of the project's `ZERO_*` variables: set ones
bind through `EnvVar`, unset fields keep their defaults under `.zero/`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from dagster import ConfigurableResource, EnvVar

from training_code.lib.storage import is_s3, join

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_STATE = REPO_ROOT / ".zero"
JOBS_FOLDER = "_jobs"  # a local lake's job folders: `<lake>/_jobs`
BACKENDS = ("local", "sagemaker")

# Field -> the variable it is read from (the SageMaker backend's lists, tags and compute: its settings.py).
SETTINGS_VARIABLES = {
    "raw_uri": "ZERO_RAW_URI",
    "lake_uri": "ZERO_LAKE_URI",
    "fsx_mount": "ZERO_FSX_MOUNT",
    "raw_events_queue_url": "ZERO_RAW_EVENTS_QUEUE_URL",
    "raw_inventory_manifest_uri": "ZERO_RAW_INVENTORY_MANIFEST_URI",
}
SAGEMAKER_VARIABLES = {
    "region": "ZERO_SM_REGION",
    "role_arn": "ZERO_SM_ROLE_ARN",
    "bucket": "ZERO_SM_BUCKET",
    "prefix": "ZERO_SM_PREFIX",
    "training_image_uri": "ZERO_SM_TRAINING_IMAGE_URI",
    "processing_image_uri": "ZERO_SM_PROCESSING_IMAGE_URI",
    "kms_key_id": "ZERO_SM_KMS_KEY_ID",
    "fsx_file_system_id": "ZERO_SM_FSX_FILE_SYSTEM_ID",
    "fsx_mount_name": "ZERO_SM_FSX_MOUNT_NAME",
    "messages": "ZERO_SM_MESSAGES",
    "wandb_secret_arn": "ZERO_SM_WANDB_SECRET_ARN",
}


def zero_env(name: str, environ: Mapping[str, str] | None = None) -> str:
    """The value of the `ZERO_*` variable `name` (in `environ`, default the process's), stripped; "" when unset."""
    if not name.startswith("ZERO_"):
        raise ValueError(f"{name!r} is not a zero_assets setting (they are named ZERO_*)")
    return (os.environ if environ is None else environ).get(name, "").strip()


def env_bindings(variables: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """`field -> EnvVar(variable)` for each set variable; with `environ`, the values instead."""
    if environ is None:
        return {field: EnvVar(var) for field, var in variables.items() if zero_env(var)}
    return {field: zero_env(var, environ) for field, var in variables.items() if zero_env(var, environ)}


def backend_from_env(environ: Mapping[str, str] | None = None) -> str:
    """Where jobs run (`ZERO_BACKEND`, default local); anything else fails naming the variable."""
    backend = zero_env("ZERO_BACKEND", environ) or "local"
    if backend not in BACKENDS:
        raise ValueError(f"ZERO_BACKEND={backend!r} is not a backend this version runs; use one of {BACKENDS}")
    return backend


class ZeroSettings(ConfigurableResource):
    """Locations shared by every asset."""

    raw_uri: str = str(DEFAULT_STATE / "raw")
    lake_uri: str = str(DEFAULT_STATE / "lake")
    fsx_mount: Optional[str] = None  # None: `.zero/fsx`, created on demand; set: must exist and be writable
    sample_images: Optional[int] = None  # rehearsal profile: index only this many images (None: all)
    # Change detection uses the SQS event queue if set, else the S3 Inventory report, else a listing.
    raw_events_queue_url: Optional[str] = None
    raw_inventory_manifest_uri: Optional[str] = None

    def asset_uri(self, asset: str, key: str, partition: str | None = None) -> str:
        """Output prefix of one materialization, `<lake>/<asset>[/<source>]/<key>` (keyed by content)."""
        base = self.lake_uri.rstrip("/")
        parts = [asset, *([partition] if partition else []), key]
        return "/".join([base, *parts]) if is_s3(base) else str(Path(base, *parts))

    def jobs_root(self) -> Path:
        """Local run folders for jobs (the `/opt/ml` layouts); always on this machine."""
        return DEFAULT_STATE / "jobs" if is_s3(self.lake_uri) else Path(self.lake_uri) / JOBS_FOLDER

    def warm_mount(self) -> Path:
        """The folder the trainer reads shards from; fails with the path when it is unusable."""
        if self.fsx_mount is None:
            mount = DEFAULT_STATE / "fsx"
            mount.mkdir(parents=True, exist_ok=True)
            return mount
        mount = Path(self.fsx_mount)
        if not mount.is_dir():
            raise FileNotFoundError(
                f"ZERO_FSX_MOUNT={mount} does not exist or is not a folder. Mount the file system there, "
                "or unset ZERO_FSX_MOUNT to use the local default (.zero/fsx)."
            )
        if not os.access(mount, os.W_OK | os.X_OK):
            raise PermissionError(f"ZERO_FSX_MOUNT={mount} is not writable by this process; fix its permissions.")
        return mount


def source_uri(settings: ZeroSettings, source: str) -> str:
    """One source's folder of the raw root."""
    return join(settings.raw_uri, source)


def settings_from_env(**overrides) -> ZeroSettings:
    """Settings bound to the environment variables that are set; defaults (or `overrides`) for the rest."""
    return ZeroSettings(**{**overrides, **env_bindings(SETTINGS_VARIABLES)})
