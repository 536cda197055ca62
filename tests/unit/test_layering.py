"""The folders of `zero_assets/` are its layers, and each layer imports only the layers below it.

    definitions.py -> defs/ -> launch/ -> backends/ -> core/ -> training_code.lib
    ops/ sits on top (the CLI and what only it uses) and may import anything.

Read from the source (every import statement, lazy ones inside functions included), so a violation is
named with its file and line. Two rules beside the order: backends never import an asset or its
`Config` (they know `JobRequest`), and `training_code/` imports nothing from `zero_assets`.
"""

from __future__ import annotations

import ast
import gc
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Lowest first: a module may import its own layer and any layer before it in this list.
LAYERS = ("core", "backends", "launch", "defs", "definitions", "ops")
# Within backends/, local/ and sagemaker/ are siblings: neither imports the other.
SIBLING_BACKENDS = ("zero_assets.backends.local", "zero_assets.backends.sagemaker")
MAX_LINES = 350


def layer_of(module: str) -> str | None:
    """`zero_assets.<layer>...` -> its layer; None for a module outside the layers (the package itself)."""
    parts = module.split(".")
    if parts[0] != "zero_assets" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in LAYERS else None


def module_name(path: Path, root: Path = REPO) -> str:
    relative = path.relative_to(root).with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return ".".join(parts)


def parsed(path: Path) -> ast.Module:
    """`ast.parse` with the garbage collector off: a finalizer that runs Python code while CPython 3.11.7
    builds the tree makes it raise "AST constructor recursion depth mismatch"."""
    gc.disable()
    try:
        return ast.parse(path.read_text(), filename=str(path))
    finally:
        gc.enable()


def imports_of(path: Path, root: Path = REPO) -> list[tuple[int, str]]:
    """(line, imported module) for every import in the file; `from a import b` also yields `a.b`
    (b may be a submodule), resolved against the file's package for relative imports."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def violations(root: Path = REPO) -> list[str]:
    """Every import that runs back up a layer, crosses between the two backends, reaches an asset from
    a backend, or reaches zero_assets from training_code; as `file:line: what`."""
    found = []
    for path in sorted((root / "zero_assets").rglob("*.py")):
        here = module_name(path, root)
        own = layer_of(here)
        if own is None:
            continue
        for line, target in imports_of(path, root):
            theirs = layer_of(target)
            where = f"{path.relative_to(root)}:{line}"
            if theirs is not None and own != "ops" and LAYERS.index(theirs) > LAYERS.index(own):
                found.append(f"{where}: {here} ({own}/) imports {target} ({theirs}/), a layer above it")
            if own == "backends" and target.startswith("zero_assets.defs.assets"):
                found.append(f"{where}: backend module {here} imports the asset module {target}")
            for backend in SIBLING_BACKENDS:
                other = next(b for b in SIBLING_BACKENDS if b != backend)
                if here.startswith(backend) and target.startswith(other):
                    found.append(f"{where}: {here} imports {target}: the two backends share only backends/ itself")
    for path in sorted((root / "training_code").rglob("*.py")):
        for line, target in imports_of(path, root):
            if target.split(".")[0] == "zero_assets":
                found.append(
                    f"{path.relative_to(root)}:{line}: job code imports {target}; job scripts never import zero_assets"
                )
    return sorted(set(found))


def test_every_import_runs_down_the_layers():
    assert violations() == []


def test_no_module_outside_a_layer():
    loose = [
        str(p.relative_to(REPO))
        for p in (REPO / "zero_assets").glob("*.py")
        if p.name not in ("__init__.py", "definitions.py")
    ]
    assert loose == [], f"modules at the package root belong in a layer folder (README 'Layout'): {loose}"


@pytest.mark.parametrize("package", ["zero_assets", "training_code"])
def test_no_module_over_the_line_limit(package):
    long = {
        str(p.relative_to(REPO)): n
        for p in sorted((REPO / package).rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"split these by concern (at most {MAX_LINES} lines a module): {long}"


def test_an_upward_import_is_named(tmp_path):
    """The check itself: a copy of the tree with one upward import added fails naming that line."""
    for folder in ("zero_assets", "training_code"):
        for path in (REPO / folder).rglob("*.py"):
            target = tmp_path / path.relative_to(REPO)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(path.read_text())
    assert violations(tmp_path) == violations()
    job_request = tmp_path / "zero_assets" / "core" / "job_request.py"
    job_request.write_text(job_request.read_text() + "\nfrom zero_assets.launch.cache import miss_metadata\n")
    runner = tmp_path / "zero_assets" / "backends" / "local" / "runner.py"
    runner.write_text(runner.read_text() + "\nfrom zero_assets.defs.assets.map_report import EvalConfig\n")
    added = set(violations(tmp_path)) - set(violations())
    assert any(
        v.startswith("zero_assets/core/job_request.py:") and "imports zero_assets.launch.cache (launch/)" in v
        for v in added
    ), added
    assert any("backend module zero_assets.backends.local.runner imports the asset module" in v for v in added), added
