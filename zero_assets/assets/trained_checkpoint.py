"""`trained_checkpoint`: the detector trained from scratch on the warm shards, run as a Training job."""

from dagster import AssetExecutionContext, Config, MaterializeResult, asset

from ..fingerprints import upstream_output
from ..job_launch import launch_job
from ..resources.job_runner import JobRunner
from ..resources.settings import ZeroSettings
from ..automation import TRAINING
from .fsx_warm_state import fsx_warm_state
from .job_retry import JOB_RETRY_POLICY

TRAINING_POOL = "training"  # how many train at once: the pool's limit in the instance config (dagster.yaml)


class TrainConfig(Config):
    arch: str = "fcos_tiny"  # or a torchvision builder: fcos_resnet50_fpn, fasterrcnn_resnet50_fpn_v2, ...
    width: int = 32
    min_size: int = 160
    max_size: int = 320
    max_steps: int = 200
    batch_size: int = 8  # per process
    lr: float = 2e-3
    seed: int = 0
    checkpoint_every: int = 50
    processes: int = 2  # torchrun --nproc_per_node (one per GPU; on CPU, one per core)


@asset(deps=[fsx_warm_state], automation_condition=TRAINING, pool=TRAINING_POOL, group_name="zero", kinds={"pytorch"}, retry_policy=JOB_RETRY_POLICY)
def trained_checkpoint(context: AssetExecutionContext, config: TrainConfig, settings: ZeroSettings, jobs: JobRunner) -> MaterializeResult:
    """`model.pt` (weights, model config, categories, step) trained under torchrun on the warm shards."""
    warm = upstream_output(context, "fsx_warm_state")
    hyperparameters = config.model_dump(exclude={"processes"})
    return launch_job(
        context,
        jobs=jobs,
        settings=settings,
        kind="training",
        module="training_code.train",
        config=hyperparameters,
        upstream=[warm],
        inputs={"train": warm.uri},
        processes_per_host=config.processes,
    )
