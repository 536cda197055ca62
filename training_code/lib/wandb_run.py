"""W&B tracking for the job scripts: one run per job, a checkpoint's training and evaluations in one group.
Modes `disabled`, `offline`, `online` (to `--wandb-base-url`, the key from `ZERO_WANDB_SECRET_ARN` in memory)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from training_code.lib import job_env, wandb_artifacts

MODES = ("disabled", "offline", "online")
AS_TRAINING = "as_training"  # evaluation: the mode the checkpoint's training run recorded
SECRET_ARN_VARIABLE = "ZERO_WANDB_SECRET_ARN"
# Keys a JSON secret may hold the API key under (a plain-text secret is the key itself).
SECRET_KEYS = ("WANDB_API_KEY", "api_key")
SUMMARY_FILE = "training_summary.json"  # where training records its W&B settings beside model.pt


def add_arguments(parser: argparse.ArgumentParser, *, follows_training: bool = False) -> None:
    """The `--wandb-*` flags; with `follows_training` unset ones follow the checkpoint's training run."""
    group = parser.add_argument_group("Weights & Biases")
    default_mode = AS_TRAINING if follows_training else "offline"
    group.add_argument(
        "--wandb-mode",
        default=default_mode,
        choices=(AS_TRAINING, *MODES) if follows_training else MODES,
        help="offline: the run is written under WANDB_DIR or the job's output data folder, for `wandb sync`",
    )
    group.add_argument("--wandb-project", default=None if follows_training else "zero")
    group.add_argument("--wandb-entity", default=None, help="team or user (default: the API key's default entity)")
    group.add_argument(
        "--wandb-group", default=None, help="runs of one checkpoint lineage: its training and its evaluations"
    )
    group.add_argument(
        "--wandb-base-url", default=None, help="W&B server for online mode (key: see ZERO_WANDB_SECRET_ARN)"
    )


def missing_server(args: argparse.Namespace) -> str | None:
    """Why the flags cannot run: online tracking must name its server, never a library default."""
    if args.wandb_mode == "online" and not args.wandb_base_url:
        return "--wandb-mode online needs --wandb-base-url (e.g. https://api.wandb.ai or your server)"
    return None


def without_tracking(arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments less the W&B ones: where a run was tracked must not change the weights' bytes."""
    return {key: value for key, value in arguments.items() if not key.startswith("wandb_")}


def follow_training(args: argparse.Namespace, model_dir: Path) -> None:
    """Fill the W&B flags left unset from the checkpoint's `training_summary.json`."""
    summary_path = Path(model_dir) / SUMMARY_FILE
    recorded = json.loads(summary_path.read_text()).get("wandb", {}) if summary_path.is_file() else {}
    if args.wandb_mode == AS_TRAINING:
        args.wandb_mode = None
    for name in ("mode", "project", "entity", "group", "base_url"):
        if getattr(args, f"wandb_{name}") is None:
            setattr(args, f"wandb_{name}", recorded.get(name))
    args.wandb_mode = args.wandb_mode or "disabled"  # a checkpoint that records no tracking is not tracked
    args.wandb_project = args.wandb_project or "zero"
    args.wandb_model_artifact = recorded.get("model_artifact")  # the model artifact training logged, if any


def api_key_from_secret(arn: str) -> str:
    """The W&B API key held by the Secrets Manager secret `arn` (plain text, or JSON with WANDB_API_KEY or api_key)."""
    from training_code.lib.aws_clients import client, endpoint_of, retry_call

    parts = arn.split(":")
    if len(parts) < 7 or parts[2] != "secretsmanager":
        raise ValueError(
            f"{SECRET_ARN_VARIABLE}={arn!r} is not a Secrets Manager secret ARN "
            "(arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME)"
        )
    secrets = client("secretsmanager", region=parts[3])
    answer = retry_call(
        lambda: secrets.get_secret_value(SecretId=arn),
        what=f"GetSecretValue {parts[-1]}",
        endpoint=endpoint_of(secrets),
    )
    text = (answer.get("SecretString") or "").strip()
    if text.startswith("{"):
        document = json.loads(text)
        text = next((str(document[key]).strip() for key in SECRET_KEYS if document.get(key)), "")
    if not text:
        raise ValueError(
            f"secret {arn} holds no W&B API key: store the key as plain text, or JSON with one of {SECRET_KEYS}"
        )
    return text


def start(args: argparse.Namespace, *, job_type: str, config: dict[str, Any]):
    """The job's W&B run, or None when tracking is disabled. Call on the reporting process only."""
    if args.wandb_mode == "disabled":
        return None
    import wandb  # imported only when tracking is asked for

    # WANDB_DIR (when set) is where the user keeps runs; else the output data folder SageMaker uploads.
    default_dir = os.environ.get("SM_OUTPUT_DATA_DIR", job_env.opt_ml() / "output" / "data")
    run_dir = Path(os.environ.get("WANDB_DIR") or default_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    options: dict[str, Any] = {"console": "off", "silent": True}  # stdout/stderr carry structured lines and Pipes
    if args.wandb_mode == "online":
        options["base_url"] = args.wandb_base_url
        arn = os.environ.get(SECRET_ARN_VARIABLE)
        if arn:
            options["api_key"] = api_key_from_secret(arn)  # in memory only: never an environment variable or a file
    # One run per input fingerprint: a restarted attempt continues it.
    stable_id = wandb_artifacts.run_id(job_env.job_name())
    return wandb.init(
        mode=args.wandb_mode,
        project=args.wandb_project,
        entity=args.wandb_entity or None,
        group=args.wandb_group or None,
        job_type=job_type,
        name=f"{stable_id or job_env.job_name()}-{job_type}",
        id=stable_id,
        resume="allow" if stable_id else None,
        dir=str(run_dir),
        config={**without_tracking(vars(args)), **config},
        settings=wandb.Settings(**options),
    )


def recorded(args: argparse.Namespace, run) -> dict[str, Any]:
    """The job's tracking settings and, with a run, its id and location (for training_summary.json)."""
    found = {
        "mode": args.wandb_mode,
        "project": args.wandb_project,
        "entity": args.wandb_entity,
        "group": args.wandb_group,
        "base_url": args.wandb_base_url,
    }
    if run is not None:
        found.update(run_id=run.id, location=location_of(run, args.wandb_mode))
    return found


def location_of(run, mode: str) -> str:
    """The run's URL online; the offline run's folder (what `wandb sync` takes) offline."""
    if mode == "online" and run.url:
        return run.url
    return str(Path(run.dir).parent)  # run.dir is `<offline-run-...>/files`


def report_metadata(tracking: dict[str, Any]) -> dict[str, Any]:
    """Pipes metadata from `recorded`: the run's location, mode, project, group, id and artifacts."""
    metadata: dict[str, Any] = {"wandb_mode": tracking["mode"]}
    if "location" in tracking:
        kind = "url" if tracking["mode"] == "online" else "path"
        metadata.update(
            {
                "wandb_run": {"type": kind, "raw_value": tracking["location"]},
                "wandb_project": tracking["project"],
                "wandb_group": tracking["group"] or "",
            }
        )
        if tracking["entity"]:
            metadata["wandb_entity"] = tracking["entity"]
        metadata["wandb_run_id"] = tracking["run_id"]
        for kind in ("shard_set", "model"):  # the artifacts the run used or logged
            if f"{kind}_artifact" in tracking:
                metadata[f"wandb_{kind}_artifact"] = tracking[f"{kind}_artifact"]
    return metadata
