"""`lineage --image` on an image whose bytes changed after a checkpoint trained on it: the fate lists that
checkpoint under `bytes_changed` with the sha256 it trained on, and says so in words."""

import shutil

import pytest
from conftest import make_resources
from helpers.graph_runs import materialize_graph, materialize_source

from zero_assets.ops.lineage import checkpoint_lineage, find_checkpoint, image_fate


@pytest.mark.slow
def test_an_image_edited_after_training_says_its_bytes_changed(instance, tiny_raw_root, tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(tiny_raw_root, raw)
    resources = make_resources(raw, tmp_path / "state")
    run_config = {"ops": {"trained_checkpoint": {"config": {"max_steps": 4, "checkpoint_every": 2, "batch_size": 4}}}}
    materialize_graph(raw, instance=instance, resources=resources, run_config=run_config)
    trained = checkpoint_lineage(instance, find_checkpoint(instance)).train_images.iloc[0]
    fate = image_fate(instance, trained.key)
    assert fate["trained"] and "bytes_changed" not in fate, fate

    image = raw / trained.key
    data = bytearray(image.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same key and size, other bytes
    image.write_bytes(bytes(data))
    lenient = {"ops": {"validated_images": {"config": {"max_quarantine_rate": 0.9}}}}  # the tiny source's limit
    materialize_source(trained.source, instance=instance, resources=resources, run_config=lenient)  # re-validated

    fate = image_fate(instance, trained.key)
    [changed] = fate["bytes_changed"]
    assert changed == {"checkpoint": fate["checkpoints"][0], "trained_sha256": trained.sha256}, fate
    assert fate.get("sha256") != trained.sha256
    assert "its bytes changed since 1 checkpoint(s) trained on it" in fate["bytes_changed_detail"], fate
