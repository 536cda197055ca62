"""Input fingerprints and upstream lookups: what a materialization was built from.

An asset's input fingerprint combines the code version of its job script (hashed from the source
files, never typed by hand), its config, and the data versions of its upstream assets. Outputs are
written under that fingerprint, so a rerun with the same inputs writes to the same place.
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


@cache
def code_version(*modules: str) -> str:
    """Hash of the source of `modules` (a job script, or the modules an in-process asset runs) and of
    every project module they import, transitively: what an asset declares as its code version.

    Derived from the files, never typed by hand: editing a module they do not import leaves the
    version (and the cached outputs) alone. Cached: the definitions read it once, at load.
    """
    return current_code_version(*modules)


def current_code_version(*modules: str) -> str:
    """`code_version` from the files as they are now, never cached: what a launch fingerprints, so a
    job module edited after the definitions loaded (a team's own trainer) is a new input.

    Imports are followed into this project's packages and into each module's own top-level package
    (`acme` for `acme.detector.train`), so a team's helpers count as its trainer's code."""
    if not modules:
        raise ValueError("code_version needs at least one module name")
    packages = {*CODE_PACKAGES, *(module.split(".")[0] for module in modules)}
    closure: dict[str, bytes] = {}
    for module in modules:
        closure.update(_import_closure(module, packages))
    return sha256_bytes(b"".join(name.encode() + b"\0" + closure[name] for name in sorted(closure)))[:16]


def check_job_module(module: str, setting: str) -> None:
    """Fail before anything launches when the job module that `setting` (an asset's config field) names
    cannot be run as `python -m`: not found, a package rather than a module file, or a file (or one it
    imports from its own package) that does not parse. Finding it imports its parent packages, not it."""
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
    """The import statements anywhere in a module's source (a function's lazy import counts too),
    parsed once per distinct source: a code version is derived at every launch, and parsing the
    closure was most of a small refresh's time in the asset (0.1-0.16 s a launch), while the files
    rarely change between two launches. Keyed by the bytes themselves, so an edit is always seen."""
    return tuple(node for node in ast.walk(_parse(source, filename)) if isinstance(node, (ast.Import, ast.ImportFrom)))


_PARSING = threading.Lock()


def _parse(source: bytes, filename: str) -> ast.Module:
    """`ast.parse` of the file, one thread at a time. On CPython 3.11.7 a parse can fail with "SystemError:
    AST constructor recursion depth mismatch" when another thread parses at the same time (seen once in
    CI, deriving a code version during a test run); the converter's depth counter is shared. A parse
    elsewhere, not under this lock, can still collide, so that error is tried once more."""
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
    """How a materialization names one of its upstream outputs: the asset, or `asset[source]` where it
    reads several sources of one asset (the training set)."""
    shared = sum(u.asset == output.asset for u in upstream) > 1
    return f"{output.asset}[{output.partition}]" if shared and output.partition else output.asset
