"""The job scripts as SageMaker receives them, packaged once per content hash under `<s3_root>/code/<hash>/`:
`sourcedir.tar.gz` for Training jobs, the same files under `files/` for Processing jobs.
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path

from training_code.lib.hashing import sha256_bytes
from zero_assets.core.settings import REPO_ROOT

PACKAGE_DIRS = ("training_code",)
# What the scripts import beyond the container's Python and torch; pinned from requirements.lock.
JOB_REQUIREMENTS = tuple(
    "dagster-pipes pyarrow duckdb pandas pandera pillow simplejpeg faster-coco-eval nvidia-ml-py boto3 datasets "
    "wandb".split()
)
TARBALL = "sourcedir.tar.gz"
MARKER = "PACKAGE_COMPLETE"


@dataclass(frozen=True)
class CodePackage:
    files: dict[str, bytes]  # archive name -> content
    digest: str

    def prefix(self, s3_root: str) -> str:
        return f"{s3_root}/code/{self.digest}"

    def tarball_uri(self, s3_root: str) -> str:
        return f"{self.prefix(s3_root)}/{TARBALL}"

    def files_uri(self, s3_root: str) -> str:
        return f"{self.prefix(s3_root)}/files"

    def tarball(self) -> bytes:
        """Byte-identical for identical files: sorted names, zero times and owners."""
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w") as archive:
            for name in sorted(self.files):
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(self.files[name]), 0o644, 0
                archive.addfile(info, io.BytesIO(self.files[name]))
        return gzip.compress(raw.getvalue(), mtime=0)


def build_code_package(
    root: Path = REPO_ROOT,
    package_dirs: tuple[str, ...] = PACKAGE_DIRS,
    modules: tuple[str, ...] = (),
    requirements: bool = True,
) -> CodePackage:
    """`package_dirs` and each of `modules`' top-level packages; `requirements`: add requirements.txt."""
    files: dict[str, bytes] = {}
    for package in package_dirs:
        for path in sorted((root / package).rglob("*.py")):
            files[path.relative_to(root).as_posix()] = path.read_bytes()
    if not files:
        raise FileNotFoundError(f"no Python files under {[str(root / p) for p in package_dirs]}: nothing to package")
    for module in modules:
        if module.split(".")[0] not in package_dirs:
            files.update(module_package_files(module))
    if requirements:
        files["requirements.txt"] = _pinned_requirements(root).encode()
    digest = sha256_bytes(b"".join(name.encode() + b"\0" + content for name, content in sorted(files.items())))[:16]
    return CodePackage(files, digest)


def module_package_files(module: str) -> dict[str, bytes]:
    """The Python files of `module`'s top-level package (or the module file), by archive name."""
    top = module.split(".")[0]
    spec = importlib.util.find_spec(top)
    if spec is None or spec.origin is None and not spec.submodule_search_locations:
        raise ValueError(
            f"job module {module!r}: its package {top!r} cannot be found to package it for SageMaker; "
            "install it or put its folder on PYTHONPATH where the Dagster process runs"
        )
    if spec.submodule_search_locations is None:
        return {f"{top}.py": Path(spec.origin).read_bytes()}
    folders = [Path(folder) for folder in spec.submodule_search_locations]
    if len(folders) != 1:
        raise ValueError(
            f"job module {module!r}: package {top!r} is spread over {[str(f) for f in folders]}; "
            "SageMaker's code package takes one folder per package: merge them or give the trainer its own package"
        )
    found = {
        f"{top}/{path.relative_to(folders[0]).as_posix()}": path.read_bytes()
        for path in sorted(folders[0].rglob("*.py"))
    }
    if not found:
        raise ValueError(f"job module {module!r}: no Python files under {folders[0]} to package")
    return found


def _pinned_requirements(root: Path) -> str:
    lock = root / "requirements.lock"
    pins = {}
    if lock.is_file():
        for line in lock.read_text().splitlines():
            name, sep, version = line.strip().partition("==")
            if sep:
                pins[name.lower()] = version
    return "".join(f"{name}=={pins[name]}\n" if name in pins else f"{name}\n" for name in JOB_REQUIREMENTS)


def upload_code_package(package: CodePackage, s3_root: str, s3_client) -> str:
    """Upload unless the marker of this hash exists; the marker goes last, so it means complete."""
    from training_code.lib.aws_clients import endpoint_of, retry_call
    from training_code.lib.storage import split_s3

    bucket, prefix = split_s3(package.prefix(s3_root))
    marker = f"{prefix}/{MARKER}"
    endpoint = endpoint_of(s3_client)
    found = retry_call(
        lambda: s3_client.list_objects_v2(Bucket=bucket, Prefix=marker, MaxKeys=1),
        what=f"LIST s3://{bucket}/{marker}",
        endpoint=endpoint,
    )
    if found.get("KeyCount", 0):
        return package.prefix(s3_root)

    def put(key: str, body: bytes) -> None:
        retry_call(
            lambda: s3_client.put_object(Bucket=bucket, Key=key, Body=body),
            what=f"PUT s3://{bucket}/{key}",
            endpoint=endpoint,
        )

    for name, content in sorted(package.files.items()):
        put(f"{prefix}/files/{name}", content)
    put(f"{prefix}/{TARBALL}", package.tarball())
    put(marker, package.digest.encode())
    return package.prefix(s3_root)
