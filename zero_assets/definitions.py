"""The Dagster code location: wires assets and resources, nothing more."""

from dagster import Definitions

from .assets import ALL_ASSETS
from .resources import LocalJobRunner, settings_from_env

settings = settings_from_env()

defs = Definitions(
    assets=ALL_ASSETS,
    resources={"settings": settings, "jobs": LocalJobRunner(settings=settings)},
)
