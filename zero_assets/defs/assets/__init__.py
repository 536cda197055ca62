"""The lineage graph, raw images to a scored checkpoint: per-source assets (partitioned by source: index
and validation), then the unpartitioned tail: the training set (the selection), its shards, the warm
state, training and the report."""

from zero_assets.defs.assets.arrow_shards import arrow_shards
from zero_assets.defs.assets.fsx_warm_state import fsx_warm_state
from zero_assets.defs.assets.map_report import map_report
from zero_assets.defs.assets.raw_data import raw_data
from zero_assets.defs.assets.raw_image_index import raw_image_index
from zero_assets.defs.assets.trained_checkpoint import trained_checkpoint
from zero_assets.defs.assets.training_rehearsal import training_rehearsal
from zero_assets.defs.assets.training_set import training_set
from zero_assets.defs.assets.validated_images import validated_images

PER_SOURCE_ASSETS = [raw_image_index, validated_images]
TAIL_ASSETS = [training_set, arrow_shards, fsx_warm_state, trained_checkpoint, map_report]
REHEARSAL_ASSETS = [training_rehearsal]  # the campaign's rehearsal: beside the tail, never part of its job
ALL_ASSETS = [*PER_SOURCE_ASSETS, *TAIL_ASSETS, *REHEARSAL_ASSETS]  # materializable; raw_data is external
SOURCE_SPECS = [raw_data]
