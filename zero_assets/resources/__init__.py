"""Resources: where things live (`ZeroSettings`) and how jobs run (`JobRunner`: local or SageMaker)."""

from .job_runner import JobRunner
from .local_runner import LocalJobRunner
from .sagemaker_runner import SageMakerJobRunner
from .sagemaker_settings import SageMakerSettings, sagemaker_settings_from_env
from .settings import ZeroSettings, settings_from_env

__all__ = [
    "JobRunner",
    "LocalJobRunner",
    "SageMakerJobRunner",
    "SageMakerSettings",
    "ZeroSettings",
    "sagemaker_settings_from_env",
    "settings_from_env",
]
