"""The Dagster code location: wires assets, checks, resources, jobs, the sensor and the schedule, nothing more."""

from dagster import Definitions

from zero_assets.backends.from_env import resources_from_env
from zero_assets.defs.assets import ALL_ASSETS, JOB_SCRIPTS, SOURCE_SPECS, with_job_scripts
from zero_assets.defs.campaign_ready import campaign_readiness_job, campaign_readiness_sensor, campaign_ready
from zero_assets.defs.checks import ALL_CHECKS, freshness_sensor, limits_from_env
from zero_assets.defs.executor import run_worker_executor
from zero_assets.defs.jobs import ALL_JOBS, weekly_full_refresh
from zero_assets.defs.orphaned_jobs import orphaned_jobs_sensor
from zero_assets.defs.run_cost import run_cost_sensors
from zero_assets.defs.sensors import new_raw_data_sensor
from zero_assets.defs.training_plan_start import training_plan_start_sensor

defs = Definitions(
    assets=[*SOURCE_SPECS, *with_job_scripts(ALL_ASSETS, JOB_SCRIPTS)],  # code links to the job scripts too
    asset_checks=[*ALL_CHECKS, campaign_ready],
    jobs=[*ALL_JOBS, campaign_readiness_job],
    sensors=[
        new_raw_data_sensor,
        freshness_sensor,
        *run_cost_sensors,
        training_plan_start_sensor,
        campaign_readiness_sensor,
        orphaned_jobs_sensor,
    ],
    schedules=[weekly_full_refresh],
    resources={**resources_from_env(), "limits": limits_from_env()},
    executor=run_worker_executor,
)
