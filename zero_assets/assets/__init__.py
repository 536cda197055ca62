"""The six assets of the lineage graph, raw images to a scored checkpoint."""

from .arrow_shards import arrow_shards
from .fsx_warm_state import fsx_warm_state
from .map_report import map_report
from .raw_image_index import raw_image_index
from .trained_checkpoint import trained_checkpoint
from .validated_images import validated_images

ALL_ASSETS = [raw_image_index, validated_images, arrow_shards, fsx_warm_state, trained_checkpoint, map_report]
