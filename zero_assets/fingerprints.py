"""Input fingerprints and upstream lookups: what a materialization was built from.

An asset's input fingerprint combines the code version of its job script (hashed from the source
files, never typed by hand), its config, and the data versions of its upstream assets. Outputs are
written under that fingerprint, so a rerun with the same inputs writes to the same place.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from dagster import AssetExecutionContext, AssetKey, Failure

from training_code.lib.hashing import sha256_bytes, sha256_json

DATA_VERSION_TAG = "dagster/data_version"


@lru_cache(maxsize=None)
def code_version(module: str) -> str:
    """Hash of the job script and the shared library it runs with (`training_code/lib`)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"job script module {module!r} not found")
    script = Path(spec.origin)
    library = sorted((script.parent / "lib").glob("*.py"))
    return sha256_bytes(b"".join(path.read_bytes() for path in [script, *library]))[:16]


def input_fingerprint(code: str, config: dict[str, Any], upstream: dict[str, str]) -> str:
    return sha256_json({"code": code, "config": config, "upstream": upstream})


@dataclass(frozen=True)
class UpstreamOutput:
    asset: str
    uri: str
    data_version: str


def upstream_output(context: AssetExecutionContext, asset: str) -> UpstreamOutput:
    """The latest materialization of an upstream asset: where its output is and its data version."""
    event = context.instance.get_latest_materialization_event(AssetKey(asset))
    if event is None or event.asset_materialization is None:
        raise Failure(
            f"upstream asset {asset} has no materialization in this Dagster instance. Materialize it first "
            f"(for example --select '{asset}+'), and make sure DAGSTER_HOME points at the instance that holds "
            "earlier runs: without it the Dagster CLI uses a throwaway instance."
        )
    materialization = event.asset_materialization
    uri = materialization.metadata.get("uri")
    version = materialization.tags.get(DATA_VERSION_TAG) if materialization.tags else None
    if uri is None or version is None:
        raise Failure(f"the latest materialization of {asset} records no uri or data version; re-materialize {asset}")
    return UpstreamOutput(asset, str(uri.value), version)
