"""The shell blocks of the README and of the docs pages (`docs/*.md`), run the way a user runs them: each
in a fresh `bash -lc`, exactly as printed, from the root of a copy of this repo whose `.venv` is this one.

A block is marked by the HTML comment on the line above its fence: `<!-- readme-test: NAME -->` (the
test named NAME runs it, whichever page it is on) or `<!-- not run locally: WHY -->`. A shell block with
neither is an error.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHELL_FENCE = re.compile(r"^```(bash|sh|shell|console)\s*$")
MARKER = re.compile(r"^<!--\s*(readme-test|not run locally):\s*(.*?)\s*-->$")
ASSETS = (
    "raw_image_index",
    "validated_images",
    "training_set",
    "arrow_shards",
    "fsx_warm_state",
    "trained_checkpoint",
    "map_report",
)
PER_SOURCE = ("raw_image_index", "validated_images")


def prose_pages() -> list[Path]:
    """The pages whose shell blocks are run or say why not: the README, then every docs page."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


@dataclass(frozen=True)
class ShellBlock:
    line: int  # of the opening fence, 1-based
    marker: str | None  # "readme-test", "not run locally" or None when unmarked
    name: str  # the test's name for it, or why it is not run
    text: str
    page: str = "README.md"  # where it is, relative to the repo root

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def shell_blocks(pages: Path | Iterable[Path] | None = None) -> list[ShellBlock]:
    """Every shell block of `pages` (one page or several; default: the README and every docs page), in
    page order, then line order."""
    if pages is None:
        pages = prose_pages()
    elif isinstance(pages, Path):
        pages = (pages,)
    return [shell_block for page in pages for shell_block in _page_blocks(page)]


def _page_blocks(page: Path) -> list[ShellBlock]:
    name = page.relative_to(REPO).as_posix() if page.is_relative_to(REPO) else str(page)
    lines = page.read_text().splitlines()
    blocks, index = [], 0
    while index < len(lines):
        if not SHELL_FENCE.match(lines[index]):
            index += 1
            continue
        end = next((i for i in range(index + 1, len(lines)) if lines[i].startswith("```")), None)
        if end is None:
            raise ValueError(f"{name} line {index + 1}: shell block is never closed")
        above = lines[index - 1].strip() if index > 0 else ""
        marker = MARKER.match(above)
        blocks.append(
            ShellBlock(
                index + 1,
                marker.group(1) if marker else None,
                marker.group(2) if marker else "",
                "\n".join(lines[index + 1 : end]) + "\n",
                name,
            )
        )
        index = end + 1
    return blocks


def block(name: str) -> ShellBlock:
    """The one block marked `<!-- readme-test: NAME -->`, on the README or any docs page."""
    found = [b for b in shell_blocks() if b.marker == "readme-test" and b.name == name]
    if len(found) != 1:
        where = ", ".join(b.where for b in found) or "none"
        raise LookupError(
            f"the README and docs pages have {len(found)} shell blocks marked `<!-- readme-test: {name} -->` "
            f"({where}); expected one"
        )
    return found[0]


def copy_repo(destination: Path) -> Path:
    """The repo's files (tracked and untracked, minus ignored ones) with mtimes kept, so make sees the
    venv as up to date, and `.venv` as a link to this repo's."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for relative in filter(None, listed):
        source = REPO / relative
        if source.is_file():
            (destination / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / relative)
    (destination / ".venv").symlink_to(REPO / ".venv")
    # The copy shares this venv: were its install inputs newer than the venv, `make` in the copy would
    # reinstall the package into this venv, pointing its scripts at the copy.
    installed = (REPO / ".venv" / ".installed").stat().st_mtime
    newer = [
        name for name in ("pyproject.toml", "requirements.lock") if (destination / name).stat().st_mtime > installed
    ]
    if newer:
        raise RuntimeError(
            f"{', '.join(newer)} changed after .venv was installed: run `make venv` before the README test"
        )
    return destination


def user_environment(**extra: str) -> dict[str, str]:
    """A user's shell before `source .venv/bin/activate`: no venv on PATH and no Dagster or zero_assets
    settings from the test run (make test exports DAGSTER_HOME)."""
    venv_bin = str(REPO / ".venv" / "bin")
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DAGSTER_", "ZERO_", "PYTEST_", "VIRTUAL_ENV"))
        and key not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")
    }
    environment["PATH"] = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != venv_bin)
    return {**environment, **extra}


def clone_environment(cwd: Path, **extra: str) -> dict[str, str]:
    """`user_environment` in the copy at `cwd`: the copy shares this repo's venv, whose editable install
    points here, so the copy's own package is put first, as a clone's own venv would import it (the
    `zero-assets` command then finds the copy's `.zero/`, not this repo's)."""
    return user_environment(PYTHONPATH=str(cwd), **extra)


def run_block(shell_block: ShellBlock, cwd: Path, timeout_s: float, **extra_env: str) -> subprocess.CompletedProcess:
    """The block in a fresh login shell that stops at the first failing command."""
    return subprocess.run(
        ["bash", "-elc", shell_block.text],
        cwd=cwd,
        env=clone_environment(cwd, **extra_env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _as_in_a_terminal() -> None:
    """In the child before exec: SIGINT and SIGQUIT back to their default, as a terminal starts a
    command. A test session started in the background (`make test &`, a CI runner's non-interactive
    shell) has them ignored, every child inherits that, and bash cannot reset a signal ignored on entry:
    Ctrl-C would then reach a `dagster dev` that ignores it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


class BackgroundBlock:
    """A block that serves until stopped (`dagster dev`), in its own process group."""

    def __init__(self, shell_block: ShellBlock, cwd: Path, log: Path, **extra_env: str):
        self.log = log
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                ["bash", "-elc", shell_block.text],
                cwd=cwd,
                env=clone_environment(cwd, **extra_env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_as_in_a_terminal,
            )

    def wait_for_http(self, url: str, timeout_s: float) -> float:
        """Seconds until `url` answered 200; fails early when the block exits."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the block exited with {self.process.returncode} before {url} answered:\n{self.tail()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    if response.status == 200:
                        return time.monotonic() - started
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"{url} did not answer within {timeout_s}s:\n{self.tail()}")

    def tail(self, characters: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-characters:]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


ASSET_QUERY = "{ assetNodes { assetKey { path } assetMaterializations(limit: 1) { runId } } }"


def graphql_assets(base_url: str) -> dict[str, str | None]:
    """Asset -> run id of its latest materialization (None when never materialized), from the UI's API."""
    request = urllib.request.Request(
        f"{base_url}/graphql",
        data=json.dumps({"query": ASSET_QUERY}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.loads(response.read())
    if "errors" in answer:
        raise RuntimeError(f"GraphQL errors: {answer['errors']}")
    return {
        "/".join(node["assetKey"]["path"]): (
            node["assetMaterializations"][0]["runId"] if node["assetMaterializations"] else None
        )
        for node in answer["data"]["assetNodes"]
    }
