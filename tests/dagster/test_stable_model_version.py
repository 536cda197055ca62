"""A retrain that ends with the same weights keeps the checkpoint's data version, so `map_report` stays fresh.

The graph on the tiny demo with a short training; then `trained_checkpoint`'s output and its
checkpoints are removed (lost, or collected), so the same configuration trains again from scratch,
on CPU, to bitwise-equal weights. The data version is what was trained (weights, model config,
categories, steps: `training_code/lib/model.py`), and `model.pt` is written without the
temporary name torch.save would record, so the file's bytes are equal too. Staleness is read as the
UI's asset graph reads it (see tests/dagster/test_code_versions.py).
"""

from __future__ import annotations

import shutil

import pytest
from dagster import AssetKey
from dagster._core.definitions.data_version import CachingStaleStatusResolver
from dagster._core.loader import LoadingContextForTest
from helpers.graph_runs import materialize_graph, materialize_tail

from zero_assets.core.fingerprints import DATA_VERSION_TAG
from zero_assets.definitions import defs
from zero_assets.defs.assets import trained_checkpoint

MAX_STEPS = 6
TINY_TRAINING = {
    "ops": {
        "trained_checkpoint": {
            "config": {
                "max_steps": MAX_STEPS,
                "checkpoint_every": 3,
                "batch_size": 2,
                "width": 16,
                "min_size": 64,
                "max_size": 96,
            }
        }
    }
}


def staleness(instance, asset: str) -> tuple[str, list[list[str]]]:
    """(status, causes) of `asset` as Dagster's stale-status resolver answers the UI."""
    resolver = CachingStaleStatusResolver(instance, defs.resolve_asset_graph(), LoadingContextForTest(instance))
    causes = resolver.get_stale_causes(AssetKey(asset))
    return resolver.get_status(AssetKey(asset)).value, [
        [c.asset_key.to_user_string(), c.category.value, c.reason] for c in causes
    ]


def checkpoint_of(result) -> tuple[dict, str]:
    """trained_checkpoint's metadata and data version in `result`."""
    event = result.asset_materializations_for_node("trained_checkpoint")[0]
    return {k: v.value for k, v in event.metadata.items()}, event.tags[DATA_VERSION_TAG]


@pytest.mark.slow  # the graph on the tiny demo, then a second training: about 3 minutes on 2 shared cores
def test_a_retrain_to_equal_weights_keeps_the_data_version_and_map_report_fresh(instance, resources, tiny_raw_root):
    _, tail = materialize_graph(tiny_raw_root, instance=instance, resources=resources, run_config=TINY_TRAINING)
    assert tail.success
    first, first_version = checkpoint_of(tail)
    assert staleness(instance, "map_report") == ("FRESH", [])

    # The output and its checkpoints are gone: the same inputs train again, from step 0.
    shutil.rmtree(first["dagster/uri"])
    shutil.rmtree(first["checkpoint_dir"])
    again = materialize_tail(
        instance=instance, resources=resources, assets=[trained_checkpoint], run_config=TINY_TRAINING
    )
    second, second_version = checkpoint_of(again)
    assert second["cache"] == "miss" and "missing or incomplete" in second["cache_reason"], second["cache_reason"]
    assert (second["resumed_from_step"], second["steps"]) == (0, MAX_STEPS), "trained from scratch"
    assert second["fingerprint"] == first["fingerprint"]

    assert second_version == first_version, "equal weights, equal data version"
    assert second["model_sha256"] == first["model_sha256"], "and model.pt's bytes are equal too"
    assert staleness(instance, "map_report") == ("FRESH", []), "nothing downstream turns stale"
