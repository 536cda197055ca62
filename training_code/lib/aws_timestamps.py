"""The timestamp parser of every boto3 client of `aws_clients`: botocore's dateutil parsing dominates an S3
LIST's CPU, so S3's one ISO 8601 form (`2026-12-02T05:11:04.000Z`) is parsed with `datetime.fromisoformat`
to the same instant, in `tzutc`; anything else goes to botocore's parser.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from botocore.utils import parse_timestamp
from dateutil.tz import tzutc

# The form S3's XML uses: UTC, 'Z', seconds with an optional fraction.
_ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,6})?Z")
_UTC = tzutc()


def parse_aws_timestamp(value: Any) -> datetime:
    """What `botocore.utils.parse_timestamp` returns for `value`, fast for S3's ISO 8601 form."""
    if isinstance(value, str) and _ISO_UTC.fullmatch(value):
        try:
            return datetime.fromisoformat(value[:-1]).replace(tzinfo=_UTC)
        except ValueError:  # the right shape, not a real time (month 13, second 60): botocore says what
            pass
    return parse_timestamp(value)
