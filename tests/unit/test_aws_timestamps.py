"""The project's clients parse S3's timestamps without dateutil, to the values botocore would give."""

from __future__ import annotations

from datetime import datetime

import boto3
import dateutil.parser
import pytest
from botocore.utils import parse_timestamp
from dateutil.tz import tzutc
from helpers.loopback_http import QuietHandler, loopback_server

from training_code.lib import aws_clients, aws_timestamps
from training_code.lib.aws_timestamps import parse_aws_timestamp

LISTING = b"""<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
<Name>lake</Name><Prefix></Prefix><KeyCount>2</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>
<Contents><Key>cam/a.jpg</Key><LastModified>2026-12-02T05:11:04.123Z</LastModified><ETag>"e1"</ETag>
<Size>3</Size><StorageClass>STANDARD</StorageClass></Contents>
<Contents><Key>cam/b.jpg</Key><LastModified>2026-02-28T23:59:59Z</LastModified><ETag>"e2"</ETag>
<Size>4</Size><StorageClass>STANDARD</StorageClass></Contents>
</ListBucketResult>"""


@pytest.mark.parametrize(
    "value",
    [
        "2026-12-02T05:11:04.000Z",  # S3's LIST form
        "2026-12-02T05:11:04.123Z",
        "2026-12-02T05:11:04.1Z",
        "2026-12-02T05:11:04.123456Z",
        "2026-12-02T05:11:04Z",
        "2024-02-29T00:00:00Z",
        "Wed, 02 Dec 2026 05:11:04 GMT",  # HTTP date headers go to botocore's parser
        "2026-12-02T05:11:04+01:00",
        "2026-12-02T05:11:04.1234567Z",
        1796188263,  # JSON services give epoch seconds
        1796188263.5,
        "1796188263",
    ],
)
def test_the_same_value_as_botocores_parser(value):
    ours, botocores = parse_aws_timestamp(value), parse_timestamp(value)
    assert ours == botocores
    assert ours.utcoffset() == botocores.utcoffset()  # its tzinfo is tzlocal() where the machine's zone is UTC
    assert ours.isoformat() == botocores.isoformat()


@pytest.mark.parametrize("value", ["2026-13-02T05:11:04Z", "2026-02-30T05:11:04Z", "not a time"])
def test_what_is_no_time_fails_as_botocore_fails(value):
    with pytest.raises(ValueError):
        parse_timestamp(value)
    with pytest.raises(ValueError):
        parse_aws_timestamp(value)


def test_s3s_form_does_not_reach_the_general_parser(monkeypatch):
    def general(value):
        raise AssertionError(f"{value!r} went to the general parser")

    monkeypatch.setattr(aws_timestamps, "parse_timestamp", general)
    assert parse_aws_timestamp("2026-12-02T05:11:04.123Z") == datetime(2026, 12, 2, 5, 11, 4, 123000, tzinfo=tzutc())


class _Listing(QuietHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.reply(200, LISTING, "application/xml")


def test_a_listing_through_the_projects_client_needs_no_dateutil(monkeypatch):
    """A plain boto3 client parses LastModified with dateutil; the project's does not, to the same values."""
    credentials = {"aws_access_key_id": "k", "aws_secret_access_key": "s", "region_name": "us-east-1"}
    with loopback_server(_Listing) as endpoint:
        plain = boto3.session.Session().client("s3", endpoint_url=endpoint, **credentials)
        expected = [o["LastModified"] for o in plain.list_objects_v2(Bucket="lake")["Contents"]]
        assert expected[0] == datetime(2026, 12, 2, 5, 11, 4, 123000, tzinfo=tzutc())

        def no_dateutil(*args, **kwargs):
            raise AssertionError("dateutil parsed a timestamp")

        monkeypatch.setattr(dateutil.parser, "parse", no_dateutil)
        with pytest.raises(AssertionError, match="dateutil"):
            plain.list_objects_v2(Bucket="lake")
        ours = aws_clients.client("s3", endpoint_url=endpoint, region="us-east-1", access_key="k", secret_key="s")
        got = [o["LastModified"] for o in ours.list_objects_v2(Bucket="lake")["Contents"]]
        assert got == expected and all(t.tzinfo == tzutc() for t in got)
