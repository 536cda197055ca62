"""The rehearsal key: what a passed rehearsal vouches for, so production training can ask whether one passed.

A rehearsal (`defs/assets/training_rehearsal.py`) runs the production trainer on cheap instances for a
few steps. Its pass holds for the trainer module at its code version (hashed from the files, as the
cache fingerprints it), the training configuration less its scale knobs (`SCALE_KNOBS`: how many steps
and how often to checkpoint; instance type and count and processes per host are compute, never in the
hyperparameters; the data is not in the key at all, so a sample rehearses the full set), where the run
is tracked (W&B mode, project, entity and server: a login is one of the boundaries it proves; the group
names the checkpoint and is left out) and where it runs (`environment`: the runner and its images).
`trained_checkpoint` derives the key of what it is about to launch with the same function.
"""

from __future__ import annotations

from typing import Any

from training_code.lib.hashing import sha256_json
from zero_assets.core.fingerprints import current_code_version

KEY_FORMAT = "zero-rehearsal-key/1"
# Scale knobs: a rehearsal runs a few steps of the same training; these may differ between the two.
SCALE_KNOBS = ("max_steps", "checkpoint_every")
UNKEYED_TRACKING = ("wandb_group",)  # names the checkpoint (its fingerprint), not where the login goes


def rehearsal_key_inputs(
    module: str, hyperparameters: dict[str, Any], tracking: dict[str, Any], environment: dict[str, str]
) -> dict[str, Any]:
    """What the key is the hash of: the trainer `module` and its code version now, `hyperparameters`
    (what the script receives) less the scale knobs, `tracking` (its W&B arguments) less the group, and
    `environment` (the runner and what it runs the scripts in)."""
    return {
        "format": KEY_FORMAT,
        "module": module,
        "code": current_code_version(module),
        "config": {name: value for name, value in sorted(hyperparameters.items()) if name not in SCALE_KNOBS},
        "tracking": {name: value for name, value in sorted(tracking.items()) if name not in UNKEYED_TRACKING},
        "environment": dict(sorted(environment.items())),
    }


def rehearsal_key(inputs: dict[str, Any]) -> str:
    """The key of `rehearsal_key_inputs(...)`: 32 hex digits."""
    return sha256_json(inputs)[:32]


def key_differences(rehearsed: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """What differs between the key inputs a rehearsal recorded and those a training wants, in words."""
    changes = []
    for part in ("module", "code"):
        if rehearsed.get(part) != wanted.get(part):
            changes.append(f"{part} {rehearsed.get(part)!r} -> {wanted.get(part)!r}")
    for part in ("config", "tracking", "environment"):
        before, now = rehearsed.get(part) or {}, wanted.get(part) or {}
        changes += [
            f"{part} {name}: {before.get(name)!r} -> {now.get(name)!r}"
            for name in sorted(set(before) | set(now))
            if before.get(name) != now.get(name)
        ]
    return changes
