"""Resources: where things live (`ZeroSettings`) and how jobs run (`LocalJobRunner`)."""

from .local_runner import LocalJobRunner
from .settings import ZeroSettings, settings_from_env

__all__ = ["LocalJobRunner", "ZeroSettings", "settings_from_env"]
