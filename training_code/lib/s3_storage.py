"""The S3 half of `storage`: the same operations on `s3://bucket/prefix` URIs, each idempotent call retried
(`s3_call`); PUTs and completed multipart uploads are all-or-nothing, so every write is atomic."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .aws_clients import client, endpoint_of, retry_call
from .object_keys import ObjectInfo

LISTING_THREADS = 16  # concurrent LIST requests; S3 serves thousands per second per prefix


def split_s3(uri: str) -> tuple[str, str]:
    bucket, _, prefix = str(uri)[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"{uri!r} is not an s3://bucket/prefix URI")
    return bucket, prefix.strip("/")


def s3_client():
    """The process's shared S3 client (honours ZERO_S3_ENDPOINT_URL), with the policy of `aws_clients`."""
    return client("s3", endpoint_url=os.environ.get("ZERO_S3_ENDPOINT_URL") or None)


def s3_call(call, what: str):
    """An idempotent S3 call, retried up to the retry window; past it, an error naming the endpoint and `what`."""
    return retry_call(call, what=what, endpoint=endpoint_of(s3_client()))


def read_bytes(uri: str) -> bytes:
    """The whole object (GET and body read retried together); a missing one is a FileNotFoundError."""
    from botocore.exceptions import ClientError

    bucket, key = split_s3(uri)

    def get() -> bytes:
        try:
            return s3_client().get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as error:
            if is_missing(error):
                raise FileNotFoundError(f"s3://{bucket}/{key} does not exist") from error
            raise

    return s3_call(get, f"GET s3://{bucket}/{key}")


def list_objects(root: str, workers: int = LISTING_THREADS) -> list[ObjectInfo]:
    """List an S3 prefix: its folders (Delimiter='/'), then each folder's keys in a thread pool."""
    bucket, prefix = split_s3(root)
    base = f"{prefix}/" if prefix else ""
    paginator = s3_client().get_paginator("list_objects_v2")

    def listed_once(page_prefix: str, delimiter: str) -> tuple[list[ObjectInfo], list[str]]:
        objects, folders = [], []
        for page in paginator.paginate(Bucket=bucket, Prefix=page_prefix, Delimiter=delimiter):
            objects += [
                ObjectInfo(o["Key"][len(base) :], int(o["Size"]), o["ETag"].strip('"'))
                for o in page.get("Contents", [])
                if not (o["Key"].endswith("/") and int(o["Size"]) == 0)  # a folder marker ("raw/"), not an object
            ]
            folders += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        return objects, folders

    def listed(page_prefix: str, delimiter: str = "") -> tuple[list[ObjectInfo], list[str]]:
        # A failed page starts this folder's listing over: pages are not resumable after an error.
        return s3_call(lambda: listed_once(page_prefix, delimiter), f"LIST s3://{bucket}/{page_prefix}")

    objects, folders = listed(base, delimiter="/")
    with ThreadPoolExecutor(workers) as pool:
        for folder_objects, _ in pool.map(listed, folders):
            objects += folder_objects
    return sorted(objects, key=lambda o: o.key)


def exists(uri: str) -> bool:
    """Whether the object with exactly this key is there: a HEAD, never a LIST by prefix."""
    try:
        etag(uri)
    except FileNotFoundError:
        return False
    return True


def etag(uri: str) -> str:
    """The object's ETag (a HEAD); FileNotFoundError when there is none at exactly this key."""
    from botocore.exceptions import ClientError

    bucket, key = split_s3(uri)

    def head() -> str:
        try:
            return s3_client().head_object(Bucket=bucket, Key=key)["ETag"].strip('"')
        except ClientError as error:
            if is_missing(error):
                raise FileNotFoundError(uri) from None
            raise

    return s3_call(head, f"HEAD s3://{bucket}/{key}")


class ObjectChanged(Exception):
    """The object is not the version asked for: another ETag, or gone."""


def read_bytes_if_match(uri: str, etag: str) -> bytes:
    """The object's bytes while its ETag is `etag` (IfMatch), else `ObjectChanged`."""
    from botocore.exceptions import ClientError

    bucket, key = split_s3(uri)

    def get() -> bytes:
        try:
            response = s3_client().get_object(Bucket=bucket, Key=key, IfMatch=f'"{etag}"')
        except ClientError as error:
            if is_missing(error):
                raise ObjectChanged("gone (no object with this key)") from None
            if precondition_failed(error):
                raise ObjectChanged(f"its ETag is no longer {etag}") from None
            raise
        if response["ETag"].strip('"') != etag:  # a server that ignored the condition
            raise ObjectChanged(f"its ETag is {response['ETag'].strip(chr(34))}, not {etag}")
        return response["Body"].read()

    return s3_call(get, f"GET s3://{bucket}/{key} (IfMatch {etag})")


def is_missing(error) -> bool:
    return error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound")


def precondition_failed(error) -> bool:
    status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    return error.response.get("Error", {}).get("Code") == "PreconditionFailed" or status == 412


def delete_prefix(uri: str) -> None:
    """Every object under `prefix/` (not a sibling `prefix-x/`); refuses a bucket root."""
    bucket, prefix = split_s3(uri)
    if not prefix:
        raise ValueError(f"refusing to delete the whole bucket {uri!r}; name a prefix inside it")
    keys = [o["Key"] for o in _objects_under(bucket, prefix)]
    for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1,000 keys
        batch = [{"Key": key} for key in keys[start : start + 1000]]
        errors = s3_call(
            lambda batch=batch: s3_client().delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True}),
            f"DELETE {len(batch)} objects under s3://{bucket}/{prefix}/",
        ).get("Errors", [])
        if errors:
            first = errors[0]
            raise OSError(
                f"could not delete {len(errors)} objects under {uri}, first {first.get('Key')}: {first.get('Message')}"
            )


def newest_write(uri: str) -> float | None:
    bucket, prefix = split_s3(uri)
    return max((o["LastModified"].timestamp() for o in _objects_under(bucket, prefix)), default=None)


def _objects_under(bucket: str, prefix: str) -> list[dict]:
    """The raw ListObjectsV2 entries under `prefix/` (the whole bucket for an empty prefix)."""

    def listed() -> list[dict]:
        pages = (
            s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/" if prefix else "")
        )
        return [o for page in pages for o in page.get("Contents", [])]

    return s3_call(listed, f"LIST s3://{bucket}/{prefix}/")


def delete_file(uri: str) -> None:
    """A retried DELETE, which is idempotent: an object that is not there is no error."""
    bucket, key = split_s3(uri)
    s3_call(lambda: s3_client().delete_object(Bucket=bucket, Key=key), f"DELETE s3://{bucket}/{key}")


def write_bytes(uri: str, data: bytes) -> None:
    bucket, key = split_s3(uri)
    # S3 PUTs are all-or-nothing, so a retried PUT is safe.
    s3_call(lambda: s3_client().put_object(Bucket=bucket, Key=key, Body=data), f"PUT s3://{bucket}/{key}")


def upload_file(src: Path, uri: str) -> None:
    bucket, key = split_s3(uri)
    # Multipart uploads complete atomically; a failed one is aborted and started over whole.
    s3_call(lambda: s3_client().upload_file(str(src), bucket, key), f"upload {src} to s3://{bucket}/{key}")


def download_file(uri: str, dest: Path) -> None:
    """The object's bytes into the local file `dest` (not atomic: `storage.fetch_file` renames it)."""
    bucket, key = split_s3(uri)
    s3_call(lambda: s3_client().download_file(bucket, key, str(dest)), f"download s3://{bucket}/{key}")
