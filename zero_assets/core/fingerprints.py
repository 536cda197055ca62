"""Input fingerprints and the rehearsal key.

A fingerprint hashes the job script's code version (derived from the files), the config and the upstream
data versions; outputs are written under it, so equal inputs write to the same place. The rehearsal key is
what a passed rehearsal vouches for (never the data), so production training can ask whether one passed.
"""

from __future__ import annotations

import ast
import importlib.util
import threading
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from dagster import Failure

from training_code.lib.hashing import sha256_bytes, sha256_json

DATA_VERSION_TAG = "dagster/data_version"
CODE_PACKAGES = ("training_code", "zero_assets")
KEY_FORMAT = "zero-rehearsal-key/2"  # 2: numbers keyed by their type, not their value
# A rehearsal runs a few steps of the same training; these may differ between the two.
SCALE_KNOBS = ("max_steps", "checkpoint_every")
UNKEYED_TRACKING = ("wandb_group",)  # names the checkpoint (its fingerprint), not where the login goes


@cache
def code_version(*modules: str) -> str:
    """Hash of `modules` and every project module they import, transitively (cached)."""
    return current_code_version(*modules)


def current_code_version(*modules: str) -> str:
    """`code_version` from the files as they are now, never cached: what a launch fingerprints."""
    if not modules:
        raise ValueError("code_version needs at least one module name")
    packages = {*CODE_PACKAGES, *(module.split(".")[0] for module in modules)}
    closure: dict[str, bytes] = {}
    for module in modules:
        closure.update(_import_closure(module, packages))
    return sha256_bytes(b"".join(name.encode() + b"\0" + closure[name] for name in sorted(closure)))[:16]


def check_job_module(module: str, setting: str) -> None:
    """Raise `Failure` unless the module `setting` names can run as `python -m` (not imported)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as error:  # a parent package is missing or fails to import
        raise Failure(
            f"{setting}: module {module!r} cannot be found ({type(error).__name__}: {error}); "
            "install its package or put its folder on PYTHONPATH"
        ) from error
    if spec is None or spec.origin is None:
        raise Failure(
            f"{setting}: module {module!r} cannot be found; install its package or put its folder on PYTHONPATH"
        )
    if spec.submodule_search_locations is not None or not spec.origin.endswith(".py"):
        raise Failure(
            f"{setting}: {module!r} is {spec.origin}, not a Python module file; "
            "name the script's module (package.script)"
        )
    try:
        current_code_version(module)
    except (ImportError, SyntaxError) as error:
        raise Failure(
            f"{setting}: module {module!r} or a module it imports cannot be read ({type(error).__name__}: {error})"
        ) from error


def _source(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"module {module!r} not found while deriving a code version")
    return Path(spec.origin)


def _import_closure(module: str, packages: set[str]) -> dict[str, bytes]:
    """Every module of `packages` that `module` imports, transitively, and its source as read now."""
    sources: dict[str, bytes] = {}
    pending = [module]
    while pending:
        name = pending.pop()
        if name in sources:
            continue
        path = _source(name)
        sources[name] = path.read_bytes()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _import_statements(sources[name], str(path)):
            pending += [m for m in _imported_modules(node, package, packages) if m not in sources]
    return sources


@lru_cache(maxsize=4096)
def _import_statements(source: bytes, filename: str) -> tuple[ast.Import | ast.ImportFrom, ...]:
    """The import statements anywhere in a module's source, lazy ones included (cached by the source bytes)."""
    return tuple(node for node in ast.walk(_parse(source, filename)) if isinstance(node, (ast.Import, ast.ImportFrom)))


_PARSING = threading.Lock()


def _parse(source: bytes, filename: str) -> ast.Module:
    """`ast.parse`, one thread at a time: CPython 3.11's AST converter shares a depth counter across threads
    ("recursion depth mismatch"); a parse outside this lock can still collide, so that error is retried once."""
    with _PARSING:
        try:
            return ast.parse(source, filename=filename)
        except SystemError as error:
            if "recursion depth mismatch" not in str(error):
                raise
            return ast.parse(source, filename=filename)


def _imported_modules(node: ast.Import | ast.ImportFrom, package: str, packages: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.split(".")[0] in packages]
    base = node.module or ""
    if node.level:  # relative import: resolve against the importing package
        parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        base = f"{parent}.{base}" if base else parent
    # `from pkg import name` may name a submodule: count it when one exists
    if base.split(".")[0] not in packages:
        return []
    spec = importlib.util.find_spec(base)
    if spec is None or spec.submodule_search_locations is None:
        return [base]
    submodules = [f"{base}.{alias.name}" for alias in node.names]
    return [base, *(m for m in submodules if importlib.util.find_spec(m) is not None)]


@dataclass(frozen=True)
class FingerprintInputs:
    """What a materialization is built from; its hash is the input fingerprint."""

    code: str
    config: dict[str, Any]
    upstream: dict[str, str]  # asset -> data version

    @classmethod
    def of(cls, module: str, config: dict[str, Any], upstream: list[UpstreamOutput]) -> FingerprintInputs:
        return cls(current_code_version(module), config, {upstream_name(u, upstream): u.data_version for u in upstream})

    def as_metadata(self) -> dict[str, Any]:
        return {"code": self.code, "config": self.config, "upstream": self.upstream}

    @property
    def fingerprint(self) -> str:
        return sha256_json(self.as_metadata())


@dataclass(frozen=True)
class UpstreamOutput:
    asset: str
    uri: str
    data_version: str
    partition: str | None = None  # the source, for a per-source asset


def upstream_name(output: UpstreamOutput, upstream: list[UpstreamOutput]) -> str:
    """The asset's name, or `asset[source]` where `upstream` holds several sources of that asset."""
    shared = sum(u.asset == output.asset for u in upstream) > 1
    return f"{output.asset}[{output.partition}]" if shared and output.partition else output.asset


def rehearsal_key_inputs(
    module: str, hyperparameters: dict[str, Any], tracking: dict[str, Any], environment: dict[str, str]
) -> dict[str, Any]:
    """What the rehearsal key hashes: module and code version, hyperparameters less scale knobs, tracking, runner."""
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
