"""Resources: where things live (`ZeroSettings`) and how jobs run (`JobRunner`: local or SageMaker).

`SageMakerJobRunner` is imported on first use: it pulls in boto3 and dagster-aws's Pipes (about a
second), which a process on the local backend never needs.
"""

from .job_runner import JobRunner
from .local_runner import LocalJobRunner
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


def __getattr__(name: str):
    if name == "SageMakerJobRunner":
        from .sagemaker_runner import SageMakerJobRunner

        return SageMakerJobRunner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
