"""The quarantine limit from the environment: `validated_images`' default, so the asset and its check agree."""

from zero_assets.core.settings import zero_env

MAX_QUARANTINE_RATE_VAR = "ZERO_MAX_QUARANTINE_RATE"
DEFAULT_MAX_QUARANTINE_RATE = 0.2  # share of a source's images that may be quarantined


def rate_from_env(var: str, default: float) -> float:
    """A share in [0, 1] from `var`, or `default` when unset or empty; anything else names the variable."""
    raw = zero_env(var)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{var}={raw!r} is not a number; set it to a share between 0 and 1, e.g. {default}") from None
    if not 0 <= value <= 1:
        raise ValueError(f"{var}={raw!r} is outside [0, 1]; set it to a share between 0 and 1, e.g. {default}")
    return value


def max_quarantine_rate() -> float:
    return rate_from_env(MAX_QUARANTINE_RATE_VAR, DEFAULT_MAX_QUARANTINE_RATE)
