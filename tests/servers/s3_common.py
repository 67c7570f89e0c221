"""What the tests of the emulated store's S3 face share (test_store_s3.py, test_store_s3_transfers.py and their
fixtures in conftest.py): the bucket of generated shards (from roots.py), a boto3 client for a store and a failed call's error."""

from __future__ import annotations

from typing import Any

import boto3
import botocore.exceptions
from botocore.config import Config

from tests.servers.roots import DATA, SHARD

__all__ = ["DATA", "SHARD", "s3_client", "error_code"]



def s3_client(endpoint: str, *, verify: str | None = None, attempts: int = 3) -> Any:
    """A boto3 S3 client for the store: path style, dummy keys, ``attempts`` tries per call."""
    config = Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": attempts, "mode": "standard"})
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="x", aws_secret_access_key="x",
                        region_name="us-east-1", verify=verify, config=config)


def error_code(exc: botocore.exceptions.ClientError) -> tuple[str, int]:
    """(S3 error code, HTTP status) of a failed call."""
    return exc.response["Error"]["Code"], exc.response["ResponseMetadata"]["HTTPStatusCode"]
