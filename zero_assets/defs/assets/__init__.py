"""The lineage graph, raw images to a scored checkpoint: per-source assets (index, validation), then the
unpartitioned tail (training set, shards, warm state, training, report) and the campaign assets."""

from zero_assets.defs.assets.arrow_shards import SHARD_MODULE, arrow_shards
from zero_assets.defs.assets.fsx_warm_state import fsx_warm_state
from zero_assets.defs.assets.map_report import EVALUATE_MODULE, map_report
from zero_assets.defs.assets.raw_data import raw_data
from zero_assets.defs.assets.raw_image_index import INDEX_MODULE, raw_image_index
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
