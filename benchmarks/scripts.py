"""A benchmark's side run as a process of its own, in the repo, failing loudly."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def run_script(command: list[str], what: str, **options: Any) -> str:
    """The stdout of `command` run in the repo (`options` go to subprocess.run: env, timeout); a
    RuntimeError naming `what`, with the end of its output, when it exits non-zero."""
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, **options)
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed ({result.returncode}):\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return result.stdout
