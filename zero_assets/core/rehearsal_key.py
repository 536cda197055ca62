"""The rehearsal key: what a passed rehearsal vouches for, so production training can ask whether one passed.

The key hashes the trainer module and its code version, the hyperparameters less `SCALE_KNOBS` (numbers
by type only), the W&B tracking less its group, and the environment; never the data.
"""

from __future__ import annotations

from typing import Any

from training_code.lib.hashing import sha256_json
from zero_assets.core.fingerprints import current_code_version

KEY_FORMAT = "zero-rehearsal-key/2"  # 2: numbers keyed by their type, not their value
# A rehearsal runs a few steps of the same training; these may differ between the two.
SCALE_KNOBS = ("max_steps", "checkpoint_every")
UNKEYED_TRACKING = ("wandb_group",)  # names the checkpoint (its fingerprint), not where the login goes


def rehearsal_key_inputs(
    module: str, hyperparameters: dict[str, Any], tracking: dict[str, Any], environment: dict[str, str]
) -> dict[str, Any]:
    """What the key hashes: `module` and its current code version, `hyperparameters` less the scale knobs
    (numbers by type), `tracking` less the group, and `environment` (the runner and its images)."""
    return {
        "format": KEY_FORMAT,
        "module": module,
        "code": current_code_version(module),
        "config": {name: _keyed(value) for name, value in sorted(hyperparameters.items()) if name not in SCALE_KNOBS},
        "tracking": {name: value for name, value in sorted(tracking.items()) if name not in UNKEYED_TRACKING},
        "environment": dict(sorted(environment.items())),
    }


def _keyed(value: Any) -> Any:
    """A number by its type name (so a sweep keeps the key), anything else by its value."""
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return type(value).__name__ if numeric else value


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
