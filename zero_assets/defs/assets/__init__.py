"""The lineage graph, raw images to a scored checkpoint: per-source assets (index, validation), then the
unpartitioned tail (training set, shards, warm state, training, report) and the campaign assets; and code
references from each asset to the job script it runs, beside its own definition, for the UI's links."""

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
from zero_assets.defs.assets.arrow_shards import SHARD_MODULE, arrow_shards
from zero_assets.defs.assets.fsx_warm_state import fsx_warm_state
from zero_assets.defs.assets.map_report import EVALUATE_MODULE, map_report
from zero_assets.defs.assets.raw_image_index import INDEX_MODULE, raw_data, raw_image_index
from zero_assets.defs.assets.trained_checkpoint import TRAIN_MODULE, trained_checkpoint
from zero_assets.defs.assets.training_rehearsal import REHEARSAL_CODE, training_rehearsal
from zero_assets.defs.assets.training_set import SELECT_MODULE, training_set
from zero_assets.defs.assets.tuned_hyperparameters import tuned_hyperparameters
from zero_assets.defs.assets.validated_images import VALIDATE_MODULE, validated_images

PER_SOURCE_ASSETS = [raw_image_index, validated_images]
TAIL_ASSETS = [training_set, arrow_shards, fsx_warm_state, trained_checkpoint, map_report]
# The campaign's rehearsal and tuning: beside the tail, run by hand, never part of its job.
CAMPAIGN_ASSETS = [training_rehearsal, tuned_hyperparameters]
ALL_ASSETS = [*PER_SOURCE_ASSETS, *TAIL_ASSETS, *CAMPAIGN_ASSETS]  # materializable; raw_data is external
SOURCE_SPECS = [raw_data]

CODE_REFERENCES = "dagster/code_references"  # the key Dagster's UI reads
# The default job script of each asset, for the UI's code links.
JOB_SCRIPTS = {
    "raw_image_index": (INDEX_MODULE,),
    "validated_images": (VALIDATE_MODULE,),
    "training_set": (SELECT_MODULE,),
    "arrow_shards": (SHARD_MODULE,),
    "fsx_warm_state": ("training_code.warm",),
    "trained_checkpoint": (TRAIN_MODULE,),
    "map_report": (EVALUATE_MODULE,),
    "training_rehearsal": REHEARSAL_CODE,
    "tuned_hyperparameters": (TRAIN_MODULE,),
}


def script_path(module: str) -> str:
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
