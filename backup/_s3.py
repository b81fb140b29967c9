"""A backup store in S3-compatible object storage, through boto3."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from agent_blackbox.backup._store import ObjectMissing, StoreError, StoreUnreachable, check_key

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

_MISSING = {"NoSuchKey", "404", "NotFound"}
_NO_BUCKET = {"NoSuchBucket"}
# What a store says when it is there but cannot serve now (overloaded, starting, failing).
_UNAVAILABLE = {"500", "502", "503", "504", "InternalError", "ServiceUnavailable", "SlowDown"}
_REFUSED = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "403",
}


class S3Store:
    """Objects in ``bucket`` under ``prefix``, on AWS S3 or any S3-compatible store.

    Credentials come from boto3's usual places (``AWS_ACCESS_KEY_ID`` and
    ``AWS_SECRET_ACCESS_KEY``, a profile, an instance role), never from the URL.
    With an ``endpoint`` (MinIO, S3Proxy, ...) requests use path-style addressing and
    only the checksums a request requires: such stores often lack S3's newer checksum
    headers, and each object's SHA-256 is checked by the backup's own manifest anyway.

    Args:
        bucket: The bucket; it must exist.
        prefix: Prepended to every key (``""`` or ending with ``/``).
        endpoint: The store's URL, for a store other than AWS S3.
        region: The region to sign for.
        client: A ready boto3 S3 client (tests, or settings of your own).
    """

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "",
        endpoint: str | None = None,
        region: str | None = None,
        client: S3Client | None = None,
    ) -> None:
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        check_key(prefix, prefix=True)
        self._bucket = bucket
        self._prefix = prefix
        self._endpoint = endpoint
        self._client = client or _client(endpoint=endpoint, region=region)

    def describe(self) -> str:
        """``s3://bucket/prefix``, and the endpoint when there is one."""
        where = f"s3://{self._bucket}/{self._prefix}"
        return f"{where} at {self._endpoint}" if self._endpoint else where

    def put(self, key: str, data: bytes) -> None:
        """Upload ``data`` under ``key`` in one request."""
        name = self._name(key)
        self._call(
            "write", key, lambda: self._client.put_object(Bucket=self._bucket, Key=name, Body=data)
        )

    def get(self, key: str) -> bytes:
        """Download the object under ``key``."""
        name = self._name(key)
        response = self._call(
            "read", key, lambda: self._client.get_object(Bucket=self._bucket, Key=name)
        )
        return self._call("read", key, lambda: response["Body"].read())  # type: ignore[no-any-return]

    def keys(self, prefix: str = "") -> Iterator[str]:
        """The keys under ``prefix``, in ascending order (S3 lists in UTF-8 binary order,
        which for the keys this store allows is ascending order)."""
        check_key(prefix, prefix=True)
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self._bucket, Prefix=self._prefix + prefix
        )
        skip = len(self._prefix)
        try:
            for page in pages:
                for entry in page.get("Contents", []):
                    name = entry["Key"]
                    if not name.endswith("/"):  # a folder marker some stores list
                        yield name[skip:]
        except (ClientError, BotoCoreError) as exc:
            raise self._translate(exc, "list", prefix or "(all)") from exc

    def delete(self, key: str) -> None:
        """Remove the object under ``key`` (S3 answers alike when there is none)."""
        name = self._name(key)
        self._call("delete", key, lambda: self._client.delete_object(Bucket=self._bucket, Key=name))

    def _name(self, key: str) -> str:
        return self._prefix + check_key(key)

    def _call(self, verb: str, key: str, request: Any) -> Any:
        try:
            return request()
        except (ClientError, BotoCoreError) as exc:
            raise self._translate(exc, verb, key) from exc

    def _translate(self, exc: Exception, verb: str, key: str) -> StoreError:
        where = self.describe()
        if isinstance(exc, EndpointConnectionError):
            return StoreUnreachable(
                f"could not reach {where} to {verb} {key!r}: is the object store running, "
                "and is the endpoint in BLACKBOX_BACKUP_URL right?"
            )
        if isinstance(exc, (BotoConnectionError, HTTPClientError)):
            return StoreUnreachable(f"lost the connection to {where} to {verb} {key!r}: {exc}")
        code = (
            str(exc.response.get("Error", {}).get("Code", ""))
            if isinstance(exc, ClientError)
            else ""
        )
        if code in _UNAVAILABLE:
            return StoreUnreachable(
                f"{where} cannot serve now ({code}) to {verb} {key!r}: it is overloaded or "
                "failing; retry later"
            )
        if code in _MISSING:
            return ObjectMissing(key, where)
        if code in _NO_BUCKET:
            return StoreError(
                f"bucket {self._bucket!r} does not exist at {where}: create it, or point "
                "BLACKBOX_BACKUP_URL at one that does"
            )
        if code in _REFUSED:
            return StoreError(
                f"{where} refused the credentials to {verb} {key!r} ({code}): check "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or the profile in use) and "
                "the bucket's permissions"
            )
        return StoreError(f"could not {verb} {key!r} in {where}: {exc}")


def _client(*, endpoint: str | None, region: str | None) -> S3Client:
    compatible: dict[str, Any] = {}
    if endpoint is not None:
        compatible = {
            "s3": {"addressing_style": "path"},
            "request_checksum_calculation": "when_required",
            "response_checksum_validation": "when_required",
        }
    config = Config(
        connect_timeout=5,
        read_timeout=60,
        retries={"mode": "standard", "max_attempts": 5},
        **compatible,
    )
    # A session of its own: boto3's default session keeps the credentials it found first
    # for the life of the process.
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint, region_name=region or "us-east-1", config=config
    )
