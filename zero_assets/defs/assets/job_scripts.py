"""Code references from each asset to the job script it runs, beside its own definition, for the UI's links."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

from dagster import (
    AssetsDefinition,
    AssetSpec,
    BetaWarning,
    CodeReferencesMetadataValue,
    LocalFileCodeReference,
    with_source_code_references,
)

from zero_assets.core.settings import REPO_ROOT

CODE_REFERENCES = "dagster/code_references"  # the key Dagster's UI reads


def script_path(module: str) -> str:
    """The file of job script `module` (`training_code.train` -> `<repo>/training_code/train.py`)."""
    path = REPO_ROOT.joinpath(*module.split(".")).with_suffix(".py")
    if not path.is_file():
        raise FileNotFoundError(f"job script {module!r} has no file at {path}: a code reference must open")
    return str(path)


def with_job_scripts(assets: Sequence[AssetsDefinition], scripts: Mapping[str, Sequence[str]]) -> list:
    """`assets` with code references to their own definitions and to the job scripts `scripts` names."""
    named = {asset.key.to_user_string() for asset in assets}
    unknown = sorted(set(scripts) - named)
    if unknown:
        raise KeyError(f"job scripts listed for {unknown}, which are not among the assets {sorted(named)}")

    def add(spec: AssetSpec) -> AssetSpec:
        modules = scripts.get(spec.key.to_user_string(), ())
        return _with_references(spec, modules) if modules else spec

    # Dagster marks code references beta; they are metadata the UI reads as they are.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BetaWarning)
        return list(with_source_code_references([asset.map_asset_specs(add) for asset in assets]))


def _with_references(spec: AssetSpec, modules: Sequence[str]) -> AssetSpec:
    existing = spec.metadata.get(CODE_REFERENCES)
    references = [
        *(existing.code_references if isinstance(existing, CodeReferencesMetadataValue) else []),
        *(
            LocalFileCodeReference(file_path=script_path(module), line_number=1, label=f"job script {module}")
            for module in modules
        ),
    ]
    return spec.merge_attributes(metadata={CODE_REFERENCES: CodeReferencesMetadataValue(code_references=references)})
