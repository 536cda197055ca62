"""The storage layer against a real S3-compatible server on loopback: the same calls as local paths."""

import pytest
from helpers.raw_index_reference import build_raw_index

from training_code.lib import storage
from zero_assets.ops.demo_data import make_demo_raw_root


def _upload_tree(client, bucket, root, prefix):
    for path in sorted(root.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(root).as_posix()}")


def test_write_list_read_publish_and_fetch_round_trip(s3_env, tmp_path):
    s3_env.client().create_bucket(Bucket="zero-lake")
    storage.write_bytes_atomic("s3://zero-lake/a/one.bin", b"one")
    (tmp_path / "out" / "sub").mkdir(parents=True)
    (tmp_path / "out" / "sub" / "two.bin").write_bytes(b"two")
    (tmp_path / "out" / "manifest.json").write_text("{}")
    written = storage.publish_folder(tmp_path / "out", "s3://zero-lake/a/set")
    assert written[-1] == "manifest.json", "the manifest is published last"
    keys = [(o.key, o.size) for o in storage.list_objects("s3://zero-lake/a")]
    assert keys == [("one.bin", 3), ("set/manifest.json", 2), ("set/sub/two.bin", 3)]
    assert storage.read_bytes("s3://zero-lake/a/set/sub/two.bin") == b"two"
    assert storage.exists("s3://zero-lake/a/set/manifest.json") and not storage.exists("s3://zero-lake/a/nope")
    storage.fetch_file("s3://zero-lake/a/one.bin", tmp_path / "fetched" / "one.bin")
    assert (tmp_path / "fetched" / "one.bin").read_bytes() == b"one"


def test_raw_index_from_s3_matches_the_local_index(s3_env, tmp_path):
    root = tmp_path / "raw"
    make_demo_raw_root(root, images=12, seed=3)
    client = s3_env.client()
    client.create_bucket(Bucket="zero-raw")
    _upload_tree(client, "zero-raw", root, "plant")
    local, remote = build_raw_index(str(root)), build_raw_index("s3://zero-raw/plant")
    columns = ["source", "key", "size", "group", "annotation_count"]
    assert remote.frame[columns].equals(local.frame[columns])
    assert remote.annotations_without_image == local.annotations_without_image
    assert remote.frame["etag"].str.fullmatch(r"[0-9a-f]{32}").all(), "S3 ETags, not local mtimes"


def test_unsafe_keys_are_rejected_before_any_write(s3_env):
    for key in ("../escape.bin", "/absolute.bin", "bad\x00name"):
        with pytest.raises(ValueError, match="unsafe object key"):
            storage.join("s3://zero-lake/prefix", key)


def test_exists_asks_for_the_exact_key_not_a_prefix(s3_env):
    """The previous-output lookup and the SageMaker model check ask for `.../manifest.json`: a
    leftover `.../manifest.json.tmp` (or `manifest.json.d/...`) must not answer for it."""
    s3_env.client().create_bucket(Bucket="zero-exact")
    storage.write_bytes_atomic("s3://zero-exact/out/manifest.json.tmp", b"{}")
    storage.write_bytes_atomic("s3://zero-exact/out/model.tar.gz.d/part", b"x")
    assert not storage.exists("s3://zero-exact/out/manifest.json")
    assert not storage.exists("s3://zero-exact/out/model.tar.gz")
    storage.write_bytes_atomic("s3://zero-exact/out/manifest.json", b"{}")
    assert storage.exists("s3://zero-exact/out/manifest.json")


def test_read_bytes_if_match_reads_only_the_version_asked_for(s3_env):
    client = s3_env.client()
    client.create_bucket(Bucket="zero-versions")
    etag = client.put_object(Bucket="zero-versions", Key="raw/a.jpg", Body=b"first")["ETag"].strip('"')
    assert storage.read_bytes_if_match("s3://zero-versions/raw/a.jpg", etag) == b"first"
    client.put_object(Bucket="zero-versions", Key="raw/a.jpg", Body=b"second")
    with pytest.raises(storage.ObjectChanged, match=f"its ETag is no longer {etag}"):
        storage.read_bytes_if_match("s3://zero-versions/raw/a.jpg", etag)
    client.delete_object(Bucket="zero-versions", Key="raw/a.jpg")
    with pytest.raises(storage.ObjectChanged, match="gone"):
        storage.read_bytes_if_match("s3://zero-versions/raw/a.jpg", etag)
