"""The Dagster code location: wires assets, checks, resources, the sensor and the schedule, nothing more."""

from dagster import Definitions

from .assets import ALL_ASSETS
from .checks import ALL_CHECKS, limits_from_env
from .resources.backend import resources_from_env
from .sensors import new_raw_data_sensor, weekly_full_refresh, whole_graph_job

defs = Definitions(
    assets=ALL_ASSETS,
    asset_checks=ALL_CHECKS,
    jobs=[whole_graph_job],
    sensors=[new_raw_data_sensor],
    schedules=[weekly_full_refresh],
    resources={**resources_from_env(), "limits": limits_from_env()},
)
