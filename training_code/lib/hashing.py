"""The content hashes used for verdicts, manifests and data versions (sha256 everywhere)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path, chunk: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def sha256_json(value: Any) -> str:
    """Hash of a JSON-able value with sorted keys, so equal configs hash equal."""
    return sha256_bytes(json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode())
