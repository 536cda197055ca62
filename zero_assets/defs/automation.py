"""When each asset runs by itself (Declarative Automation, evaluated by the daemon's automation sensor).

The cost of a stage decides how eagerly it follows its inputs:
- a source's index is requested by the change-detection sensor for that source only (no condition
  here, so a change is never indexed twice); its validation follows eagerly, per source;
- the training set is the selection, a few tables: it follows any new validated set once the
  blocking checks of its inputs passed; its shards follow it (packing only what the selection
  added), and the warm state follows the shards;
- training is the expensive stage: it runs at a cron tick (`ZERO_TRAIN_CRON`, default 03:00 daily)
  only when the data version of what it reads changed since it last ran or was requested, when the
  blocking checks of its inputs passed and nothing upstream is in progress; the `training` pool
  bounds how many train at once;
- the mAP report follows a new checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping

from dagster import AssetSelection, AutomationCondition

from zero_assets.core.settings import zero_env

DEFAULT_TRAIN_CRON = "0 3 * * *"

# Follow the parent once it is updated: validated_images its own source's partition of the index,
# arrow_shards the training set, fsx_warm_state the shards.
EAGER = AutomationCondition.eager()

# training_set reads whichever sources have validated sets: a source that is missing or failing must not
# hold the others back, so this is `eager()` without its "no dependency missing" clause.
TRAINING_SET = (
    AutomationCondition.any_deps_updated().since_last_handled()
    & AutomationCondition.all_deps_blocking_checks_passed()
    # The quarantine check is per source: a dep passes when any source passed, so a failed one holds here.
    & ~AutomationCondition.any_deps_match(
        AutomationCondition.any_checks_match(AutomationCondition.check_failed(), blocking_only=True)
    )
    & ~AutomationCondition.any_deps_in_progress()
    & ~AutomationCondition.in_progress()
).with_label("eager over the sources that have validated sets, once their blocking checks passed")

# map_report scores a new checkpoint; a new warm state alone (training not run yet) is not a reason.
AFTER_CHECKPOINT = (
    AutomationCondition.any_deps_updated().ignore(AssetSelection.assets("fsx_warm_state")).since_last_handled()
    & ~AutomationCondition.any_deps_missing()
    & ~AutomationCondition.any_deps_in_progress()
    & ~AutomationCondition.in_progress()
).with_label("after a new checkpoint")


def train_cron(environ: Mapping[str, str] | None = None) -> str:
    """`ZERO_TRAIN_CRON` (of `environ`, else the process environment), or the default when it is unset."""
    return zero_env("ZERO_TRAIN_CRON", environ) or DEFAULT_TRAIN_CRON


def training_condition(cron: str) -> AutomationCondition:
    """At a tick of `cron`, when the training data's version changed since training last ran or was requested."""
    data_changed = AutomationCondition.any_deps_match(AutomationCondition.data_version_changed()).since_last_handled()
    return (
        AutomationCondition.cron_tick_passed(cron)
        & data_changed
        & AutomationCondition.all_deps_blocking_checks_passed()
        & ~AutomationCondition.any_deps_in_progress()
        & ~AutomationCondition.in_progress()
    ).with_label(f"on cron {cron!r} when the training set changed and blocking checks passed")


TRAINING = training_condition(train_cron())
