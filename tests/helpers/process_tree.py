"""Process-tree look-ups in /proc shared by the tests that find and kill a job's processes."""

from __future__ import annotations

import os
from pathlib import Path


def command_line(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except (FileNotFoundError, ProcessLookupError):  # the process ended while we looked
        return []


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for its parent to reap it counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None


def children_of(pid: int) -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit() and parent_of(int(entry)) == pid]


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, grandchildren, ...)."""
    parents = {int(e): parent_of(int(e)) for e in os.listdir("/proc") if e.isdigit()}
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


# `python -c PEAK_RSS <command...>` runs the command and prints `peak_rss_kb N`: the peak RSS of it and
# every process under it. As a child subreaper it reaps the orphans too (a decode pool's forkserver
# outlives its job by a moment), so their peaks, not only the command's, are in RUSAGE_CHILDREN.
PEAK_RSS = """
import ctypes, os, resource, subprocess, sys
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
code = subprocess.call(sys.argv[1:])
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
print("peak_rss_kb", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(code)
"""
