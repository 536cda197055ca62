"""Preflight checks that take seconds on any backend, each a `Finding` naming what is wrong and what to do:
a writable checkpoint prefix and a valid W&B key (SageMaker's own are in `sagemaker/preflight.py`).
"""

from __future__ import annotations

import base64
import json
import netrc
import os
import secrets
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from botocore.exceptions import BotoCoreError, ClientError

from training_code.lib.storage import delete_file, exists, join, write_bytes_atomic

TRAINING_ASSETS = ("trained_checkpoint", "training_rehearsal")  # whose checkpoint prefixes the probe writes under
WANDB_TIMEOUT_S = 15.0
# What `wandb login` asks the server: the user the key belongs to (W&B's GraphQL API, basic auth `api:<key>`).
VIEWER_QUERY = "query Viewer { viewer { id username entity } }"


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{self.check}: {self.detail}"


def writable_prefix(prefix: str, check: str) -> Finding:
    """Write a small probe object under `prefix` (an s3:// prefix or a folder) and delete it again."""
    probe = join(prefix, f"_preflight-{secrets.token_hex(8)}")
    try:
        write_bytes_atomic(probe, b"zero_assets preflight: safe to delete\n")
    except (OSError, ClientError, BotoCoreError) as error:
        return Finding(
            check,
            False,
            f"{prefix} is not writable by this process ({error_text(error)}): jobs write their checkpoints "
            "there; fix the bucket, prefix or folder and its permissions",
        )
    try:
        delete_file(probe)
        left = exists(probe)
    except (OSError, ClientError, BotoCoreError) as error:
        return Finding(check, False, f"wrote {probe} but could not delete it ({error_text(error)}); delete it by hand")
    if left:
        return Finding(check, False, f"wrote {probe}, but it is still there after its delete; delete it by hand")
    return Finding(check, True, f"{prefix}: a probe was written and deleted")


@dataclass(frozen=True)
class WandbLogin:
    """The W&B login a job will make: the server, the API key (never shown) and where the key comes from."""

    base_url: str
    key: str | None
    source: str  # where the job finds the key: "WANDB_API_KEY", "~/.netrc", "secret arn:..."


def local_wandb_login(base_url: str) -> WandbLogin:
    """The key a local job logs in with, found as W&B finds it: `WANDB_API_KEY`, else the netrc entry."""
    if os.environ.get("WANDB_API_KEY"):
        return WandbLogin(base_url, os.environ["WANDB_API_KEY"], "WANDB_API_KEY")
    host = urllib.parse.urlparse(base_url).hostname or base_url
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        entry = netrc.netrc(path).authenticators(host) if os.path.isfile(path) else None
    except (netrc.NetrcParseError, OSError) as error:
        return WandbLogin(base_url, None, f"{path} (unreadable: {error})")
    return WandbLogin(base_url, entry[2] if entry else None, f"{path} (machine {host})")


def wandb_key_finding(login: WandbLogin, timeout_s: float = WANDB_TIMEOUT_S) -> Finding:
    """Ask the W&B server who the key belongs to, as `wandb login` does, so a bad key fails before the job."""
    check = "W&B key"
    if not login.key:
        return Finding(
            check,
            False,
            f"online W&B needs an API key and none was found ({login.source}): set WANDB_API_KEY or run "
            "`wandb login` (locally), or store it in the secret ZERO_SM_WANDB_SECRET_ARN names (SageMaker)",
        )
    token = base64.b64encode(f"api:{login.key}".encode()).decode()
    request = urllib.request.Request(
        f"{login.base_url.rstrip('/')}/graphql",
        data=json.dumps({"query": VIEWER_QUERY}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Basic {token}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            viewer = (json.loads(answer.read() or b"{}").get("data") or {}).get("viewer")
    except urllib.error.HTTPError as error:
        if error.code in (401, 403):
            return Finding(
                check,
                False,
                f"{login.base_url} rejected the W&B API key from {login.source} (HTTP {error.code}): "
                "the key is wrong, revoked or for another server; create a new key and store it there",
            )
        return Finding(check, False, f"{login.base_url} answered HTTP {error.code} to a login; try again later")
    except (urllib.error.URLError, TimeoutError, OSError, ValueError) as error:
        return Finding(check, False, f"cannot reach W&B at {login.base_url} ({error}); check wandb_base_url")
    if not viewer:
        return Finding(
            check, False, f"{login.base_url} knows no user for the W&B API key from {login.source}: it is invalid"
        )
    who = viewer.get("username") or viewer.get("entity") or viewer.get("id")
    return Finding(check, True, f"the key from {login.source} logs in to {login.base_url} as {who}")


def error_text(error: BaseException) -> str:
    if isinstance(error, ClientError):
        problem = error.response.get("Error", {})
        return f"{problem.get('Code', 'error')}: {problem.get('Message', '')}".rstrip(": ")
    return f"{type(error).__name__}: {error}"


def failed(findings: list[Finding]) -> list[Finding]:
    return [finding for finding in findings if not finding.ok]
