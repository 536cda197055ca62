"""Deterministic SageMaker job names: the same asset, fingerprint and attempt always give the same name.

That is what lets a restarted Dagster run find the job its predecessor launched instead of
launching a second one. Names follow SageMaker's rule `[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}`.
"""

from __future__ import annotations

import re

MAX_NAME = 63
_UNSAFE = re.compile(r"[^a-zA-Z0-9]+")
VALID_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")


def job_name(asset: str, fingerprint: str, attempt: int) -> str:
    """`zero-<asset>-<fingerprint16>-a<attempt>`, the asset part shortened when the whole is too long."""
    if attempt < 1:
        raise ValueError(f"attempt numbers start at 1, got {attempt}")
    if not re.fullmatch(r"[0-9a-f]{16,}", fingerprint):
        raise ValueError(f"fingerprint must be at least 16 hex digits, got {fingerprint!r}")
    tail = f"-{fingerprint[:16]}-a{attempt}"
    stem = _UNSAFE.sub("-", f"zero-{asset}").strip("-")[: MAX_NAME - len(tail)].rstrip("-")
    name = stem + tail
    if not VALID_NAME.match(name):
        raise ValueError(f"job name {name!r} built from asset {asset!r} breaks SageMaker's naming rule")
    return name


def attempt_of(name: str) -> int:
    """The attempt number a name from `job_name` ends with."""
    found = re.search(r"-a(\d+)$", name)
    if not found:
        raise ValueError(f"{name!r} is not a job name from job_name(): it does not end in -a<attempt>")
    return int(found.group(1))
