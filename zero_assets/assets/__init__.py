"""The lineage graph, raw images to a scored checkpoint: per-source assets (partitioned by source),
then the training set and the unpartitioned training tail."""

from .arrow_shards import arrow_shards
from .fsx_warm_state import fsx_warm_state
from .map_report import map_report
from .raw_data import raw_data
from .raw_image_index import raw_image_index
from .trained_checkpoint import trained_checkpoint
from .training_set import training_set
from .validated_images import validated_images

PER_SOURCE_ASSETS = [raw_image_index, validated_images, arrow_shards]
TAIL_ASSETS = [training_set, fsx_warm_state, trained_checkpoint, map_report]
ALL_ASSETS = [*PER_SOURCE_ASSETS, *TAIL_ASSETS]  # materializable; raw_data is external (SOURCE_SPECS)
SOURCE_SPECS = [raw_data]
