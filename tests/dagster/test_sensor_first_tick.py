"""Turning the raw-data sensor on after `make demo`: its first tick has no earlier digests, so every source
looks changed; it requests only the sources whose latest raw_image_index did not record the listing the
root has now (edited since, or never indexed), not every source again (each a cache hit, minutes of runs)."""

import shutil

from conftest import make_resources
from helpers.graph_runs import materialize_source
from helpers.sensor_ticks import SensorDaemon

from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets.raw_image_index import raw_image_index


def test_the_first_tick_requests_only_sources_changed_since_their_index(instance, tiny_raw_root, tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(tiny_raw_root, raw)
    resources = make_resources(raw, tmp_path / "state")
    indexed = ["line_a_camera", "line_b_camera"]  # warehouse_scanner: never indexed
    for source in indexed:
        materialize_source(source, instance=instance, resources=resources, assets=[raw_image_index])
    annotations = raw / "line_b_camera" / "annotations.json"
    annotations.write_text(annotations.read_text() + "\n")  # a label fix after its index

    daemon = SensorDaemon(instance, ZeroSettings(raw_uri=str(raw)))
    _, launched = daemon.tick()
    assert sorted(r.partition_key for r in launched) == ["line_b_camera", "warehouse_scanner"], (
        "line_a_camera's index already covers what the root holds"
    )
    assert daemon.sources() == ["line_a_camera", "line_b_camera", "warehouse_scanner"]
    assert daemon.raw_data_version("line_a_camera") is None, "nothing observed for a source not requested"

    image = sorted((raw / "line_a_camera").rglob("*.jpg"))[0]
    shutil.copy(image, image.with_name(f"zz_new{image.suffix}"))
    _, launched = daemon.tick()
    assert [r.partition_key for r in launched] == ["line_a_camera"], "from then on, every change is requested"
