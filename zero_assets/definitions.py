"""The Dagster code location: wires assets and resources, nothing more."""

from dagster import Definitions

from .assets import ALL_ASSETS
from .resources.backend import resources_from_env

defs = Definitions(assets=ALL_ASSETS, resources=resources_from_env())
