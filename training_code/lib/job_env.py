"""The SageMaker container contract as seen from inside a job script, plus the Pipes report channel.

Every path resolves under `ZERO_OPT_ML` (default `/opt/ml`), so scripts run unchanged under the local
runner. Processing scripts take folders as arguments; training scripts read `SM_CHANNEL_<NAME>` and `SM_MODEL_DIR`.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
import tempfile
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dagster_pipes import PipesContext as PipesContext  # re-exported: train.py tells a real context by it
from dagster_pipes import PipesEnvVarParamsLoader, PipesS3ContextLoader, PipesS3MessageWriter, open_dagster_pipes

log = logging.getLogger("zero.job")


def opt_ml() -> Path:
    return Path(os.environ.get("ZERO_OPT_ML", "/opt/ml"))


def channel_dir(name: str) -> Path:
    """A training channel's folder (`SM_CHANNEL_TRAIN` for channel `train`)."""
    value = os.environ.get(f"SM_CHANNEL_{name.upper()}")
    path = Path(value) if value else opt_ml() / "input" / "data" / name
    if not path.is_dir():
        raise FileNotFoundError(f"input channel {name!r} is missing: expected a folder at {path}")
    return path


def peak_rss_bytes() -> int | None:
    """This process's peak resident memory since it started its program (Linux's VmHWM; None elsewhere)."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    found = next((line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")), None)
    return int(found) * 1024 if found else None


def scratch_root() -> Path:
    """Scratch for a Processing job: on its volume under /opt/ml/processing; else the system's temp folder."""
    processing = opt_ml() / "processing"
    if not processing.is_dir():
        return Path(tempfile.gettempdir())
    path = processing / "scratch"
    path.mkdir(exist_ok=True)
    return path


def model_dir() -> Path:
    return Path(os.environ.get("SM_MODEL_DIR", opt_ml() / "model"))


def input_uri_variable(name: str) -> str:
    """The variable both backends set to where input `name` came from (an s3://, fsx:// or local URI)."""
    return f"ZERO_INPUT_URI_{name.upper()}"


def input_uri(name: str) -> str | None:
    """Where input `name`'s folder came from: its files' paths below it are the same below this URI."""
    return os.environ.get(input_uri_variable(name)) or None


def checkpoint_dir() -> Path:
    """Where SageMaker's CheckpointConfig syncs to S3 (`/opt/ml/checkpoints` by default)."""
    return Path(os.environ.get("ZERO_CHECKPOINT_DIR", opt_ml() / "checkpoints"))


def job_name() -> str:
    return os.environ.get("ZERO_JOB_NAME") or json.loads(os.environ.get("SM_TRAINING_ENV", "{}")).get(
        "job_name", "local"
    )


def is_rank_zero() -> bool:
    return int(os.environ.get("RANK", "0")) == 0 and ("RANK" in os.environ or is_first_host())


class _LogOnlyReporter:
    """Stand-in for a Pipes context when a script runs by hand or on a non-zero rank."""

    def __init__(self) -> None:
        self.log = log

    def report_asset_materialization(self, metadata: dict | None = None, data_version: str | None = None, **_) -> None:
        if is_rank_zero():
            plain = {
                k: v["raw_value"] if isinstance(v, dict) and "raw_value" in v else v
                for k, v in (metadata or {}).items()
            }
            print(json.dumps({"event": "materialization", "data_version": data_version, "metadata": plain}))


# A job keeps most of what it allocates until it writes its tables, so the default threshold (700) makes
# the cyclic collector walk the growing heap over and over; cycles are still collected.
GC_THRESHOLDS = (100_000, 50, 1000)


@contextmanager
def pipes_session() -> Iterator[Any]:
    """Dagster Pipes on rank 0 when launched by Dagster, else a reporter that only logs; on failure, write
    `/opt/ml/output/failure` (SageMaker's FailureReason) before re-raising."""
    _configure_logging()
    gc.set_threshold(*GC_THRESHOLDS)
    params = PipesEnvVarParamsLoader()
    try:
        if params.is_dagster_pipes_process() and is_rank_zero():
            with open_dagster_pipes(**_pipes_io(params)) as context:
                yield context
        else:
            yield _LogOnlyReporter()
    except BaseException as error:
        if not isinstance(error, SystemExit) or error.code not in (0, None):
            write_failure_reason(error)
        raise
    # Done: freeze the heap so the interpreter's shutdown collections do not walk it. Nothing waits on them.
    gc.freeze()


def _pipes_io(params: PipesEnvVarParamsLoader) -> dict[str, Any]:
    """S3 context loader / message writer when Dagster put the context or messages on S3 (SageMaker caps
    environment values at 256-512 characters); the defaults otherwise."""
    from .storage import s3_client

    io: dict[str, Any] = {}
    if "bucket" in params.load_context_params():
        io["context_loader"] = PipesS3ContextLoader(s3_client())
    if "bucket" in params.load_messages_params():
        io["message_writer"] = PipesS3MessageWriter(
            s3_client(), interval=float(os.environ.get("ZERO_PIPES_FLUSH_S", "10"))
        )
    return io


def _resource_config() -> dict[str, Any]:
    """Processing containers' `/opt/ml/config/resourceconfig.json` (current_host, hosts); {} outside a job."""
    config = opt_ml() / "config" / "resourceconfig.json"
    return json.loads(config.read_text()) if config.is_file() else {}


def current_host() -> str:
    return _resource_config().get("current_host") or os.environ.get("SM_CURRENT_HOST", "algo-1")


def host_slot() -> tuple[int, int]:
    """(this host's place among the sorted hosts, how many) from the resource config; (0, 1) outside one."""
    config = _resource_config()
    hosts, current = sorted(config.get("hosts") or []), config.get("current_host")
    if not hosts or current is None:
        return 0, 1
    if current not in hosts:
        raise ValueError(f"resourceconfig.json: current_host {current!r} is not among its hosts {hosts}")
    return hosts.index(current), len(hosts)


def is_first_host() -> bool:
    """Multi-instance Processing jobs run the script on every host; only the first one reports."""
    config = _resource_config()
    return not config or config.get("current_host") == sorted(config.get("hosts", [config.get("current_host")]))[0]


def _configure_logging() -> None:
    """Log to stderr only, one JSON object a line: SageMaker ships it to CloudWatch and the local runner
    copies it to `output/job.log`; a file of our own would hold every line twice."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines())
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)


class JsonLines(logging.Formatter):
    """A record as one JSON object (time UTC, level, logger, message, job, asset, rank, host), so
    CloudWatch Logs Insights and `jq` can query by field."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "job": job_name(),
            "asset": os.environ.get("ZERO_ASSET", ""),
            "rank": int(os.environ.get("RANK", "0")),
            "host": current_host(),
        }
        for name, value in getattr(record, "fields", {}).items():  # an event's own fields (checkpoints.log_event)
            line.setdefault(name, value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def write_failure_reason(error: BaseException) -> None:
    """Training jobs report `output/failure` as FailureReason, Processing jobs `output/message` as ExitMessage."""
    failure = opt_ml() / "output" / "failure"
    try:
        failure.parent.mkdir(parents=True, exist_ok=True)
        text = f"{type(error).__name__}: {error}\n" + "".join(traceback.format_exception(error)[-6:])
        failure.write_text(text[:1024])  # SageMaker keeps the first 1024 characters
        (failure.parent / "message").write_text(text[:1024])
    except OSError as write_error:
        log.error("could not write failure reason to %s: %s", failure, write_error)


# Dagster table column types, by the Python type of the values in the column.
_COLUMN_TYPES = ((bool, "bool"), (int, "int"), (float, "float"))


def table(
    rows: list[dict[str, Any]], columns: dict[str, str] | None = None, types: dict[str, str] | None = None
) -> dict[str, Any]:
    """Pipes metadata value for a typed table: `columns` maps each column to a description (default: the first
    row's keys); types are `types[name]` where given (an empty table keeps them), else inferred; None: empty."""
    names = list(columns or (rows[0] if rows else {}))

    def column_type(name: str) -> str:
        if types and name in types:
            return types[name]
        values = [row.get(name) for row in rows if row.get(name) is not None]
        for python_type, dagster_type in _COLUMN_TYPES:
            if values and all(
                isinstance(v, python_type) and (python_type is bool or not isinstance(v, bool)) for v in values
            ):
                return dagster_type
        return "string"

    schema = [
        {
            "name": name,
            "type": column_type(name),
            **({"description": columns[name]} if columns and columns[name] else {}),
        }
        for name in names
    ]
    return {
        "type": "table",
        "raw_value": {"schema": schema, "records": [{name: row.get(name) for name in names} for row in rows]},
    }
