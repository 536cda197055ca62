"""When each asset runs by itself (Declarative Automation conditions).

Cheap stages follow their inputs eagerly; training runs only at a `ZERO_TRAIN_CRON` tick when its
data changed. The index has no condition: the change-detection sensor requests it.
"""

from __future__ import annotations

from collections.abc import Mapping

from dagster import AssetSelection, AutomationCondition

from zero_assets.core.settings import zero_env

DEFAULT_TRAIN_CRON = "0 3 * * *"

EAGER = AutomationCondition.eager()

# `eager()` without "no dependency missing": a missing or failing source must not hold the others back.
TRAINING_SET = (
    AutomationCondition.any_deps_updated().since_last_handled()
    & AutomationCondition.all_deps_blocking_checks_passed()
    # The quarantine check is per source: a dep passes when any source passed, so check failures here.
    & ~AutomationCondition.any_deps_match(
        AutomationCondition.any_checks_match(AutomationCondition.check_failed(), blocking_only=True)
    )
    & ~AutomationCondition.any_deps_in_progress()
    & ~AutomationCondition.in_progress()
).with_label("eager over the sources that have validated sets, once their blocking checks passed")

# A new warm state alone (training not run yet) is no reason to score again.
AFTER_CHECKPOINT = (
    AutomationCondition.any_deps_updated().ignore(AssetSelection.assets("fsx_warm_state")).since_last_handled()
    & ~AutomationCondition.any_deps_missing()
    & ~AutomationCondition.any_deps_in_progress()
    & ~AutomationCondition.in_progress()
).with_label("after a new checkpoint")


def train_cron(environ: Mapping[str, str] | None = None) -> str:
    """`ZERO_TRAIN_CRON`, or the default when it is unset."""
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
