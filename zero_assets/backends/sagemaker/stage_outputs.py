"""What a finished map-stage job uploaded, recorded so a later run can tell whether to reuse it.

A map stage writes no manifest or marker, so a later run reuses it only while every recorded file
is still there with its size.
"""

from __future__ import annotations

import json

from training_code.lib.storage import list_objects, read_bytes, write_bytes_atomic


def record_uri(s3_root: str, job_name: str) -> str:
    return f"{s3_root}/attempts/{job_name}.json"


def record_outputs(s3_root: str, job_name: str, outputs: dict[str, str]) -> None:
    files = {name: {o.key: o.size for o in list_objects(uri)} for name, uri in outputs.items()}
    empty = [name for name, listed in files.items() if not listed]
    if empty:
        raise RuntimeError(
            f"SageMaker job {job_name} Completed but uploaded nothing to {[outputs[n] for n in empty]}; check its logs"
        )
    write_bytes_atomic(
        record_uri(s3_root, job_name),
        json.dumps({"job_name": job_name, "outputs": outputs, "files": files}, indent=1).encode(),
    )


def outputs_as_recorded(s3_root: str, job_name: str, outputs: dict[str, str]) -> bool:
    """True when the job's record exists, names these outputs, and every file it lists is still there."""
    try:
        record = json.loads(read_bytes(record_uri(s3_root, job_name)))
    except (FileNotFoundError, ValueError):
        return False
    if record.get("outputs") != outputs:
        return False
    for name, uri in outputs.items():
        present = {o.key: o.size for o in list_objects(uri)}
        if any(present.get(key) != size for key, size in record["files"][name].items()):
            return False
    return True
