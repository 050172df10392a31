"""Whole objects on S3 in one request each: conditional ``PutObject`` and batched ``DeleteObjects``.

Why: pyarrow's S3 filesystem writes an object under a temporary name and moves it (a multipart
upload, a server-side copy, a directory marker and a delete: 6 requests) and deletes one object
per request plus a directory-marker check. A single S3 ``PutObject`` is already atomic (a reader
sees the old object or the new one, never half of one), and ``If-None-Match: *`` makes it
create-if-absent, so a ledger event costs one request; ``DeleteObjects`` removes up to 1,000 keys
in one. pyarrow offers neither, so these go through boto3 (the ``s3`` extra), with a client built
from the same place the pyarrow filesystem came from: its endpoint, scheme, region and explicit
keys, else boto3's usual credential chain (the same environment variables pyarrow reads).

``s3_objects(fs)`` is ``None`` for every other store (GCS, Azure Blob, local disk), for an S3
filesystem this cannot mirror (an assumed role, a proxy), and where boto3 is not installed: the
caller then keeps the pyarrow path (``location.write_atomically``). Errors come out as pyarrow's
do, as ``OSError`` that ``retry.call_with_retry`` waits out or gives up on at once (``is_permanent``),
so the one retry rule still holds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import pyarrow.fs as pafs

from spotfallback.errors import ObjectConflictError

logger = logging.getLogger(__name__)

T = TypeVar("T")

# S3's limit of keys per DeleteObjects request.
DELETE_BATCH = 1000
_CLIENTS: dict[tuple[Any, ...], Any] = {}
_HONOURS: dict[tuple[int, str], bool] = {}  # (client, bucket): whether failed conditions are refused
_LOCK = threading.Lock()
_told_no_boto3 = False

# Error codes that no wait can fix, as S3 names them (pyarrow's ACCESS_DENIED, NO_SUCH_BUCKET...).
_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled", "AccountProblem",
           "InvalidToken", "ExpiredToken"}
_MISSING = {"NoSuchBucket", "NoSuchKey", "404", "NotFound"}
_TRANSIENT = {"SlowDown", "RequestTimeout", "Throttling", "ThrottlingException", "RequestTimeTooSkewed",
              "InternalError", "ServiceUnavailable", "OperationAborted"}


def _load_boto3() -> Any:
    try:
        import boto3
    except ImportError:
        return None
    return boto3


def _s3_options(fs: pafs.FileSystem) -> dict[str, Any] | None:
    """The options the S3 filesystem under ``fs`` was built with; ``None`` if it is not one."""
    from spotfallback.store.retry import RetryingHandler

    if isinstance(fs, pafs.PyFileSystem) and isinstance(fs.handler, RetryingHandler):
        fs = fs.handler.inner
    if not isinstance(fs, pafs.S3FileSystem):
        return None
    _, args = fs.__reduce__()  # (S3FileSystem._reconstruct, (options,)): pyarrow's own pickling
    options = args[0]
    return options if isinstance(options, dict) else None


@dataclass(frozen=True)
class S3Objects:
    """One boto3 client and what it takes to write, read and delete whole objects by pyarrow path ("BUCKET/KEY")."""

    client: Any
    # Whether this botocore sends ``If-Match`` on PutObject (late 2024 on; ``If-None-Match``: August 2024 on).
    can_replace: bool = True

    @staticmethod
    def _split(path: str) -> tuple[str, str]:
        bucket, _, key = path.lstrip("/").partition("/")
        if not bucket or not key:
            raise ValueError(f"{path!r} is not BUCKET/KEY")
        return bucket, key

    def create(self, path: str, payload: bytes) -> str:
        """Write ``path`` only if no object is there (``If-None-Match: *``), in one request; its ETag.

        An object already there with the same content is our own earlier write whose answer was
        lost (a retry): success. With other content, ``ObjectConflictError``: names are unique per
        writer, so another writer uses the same name, and neither may overwrite the other.
        """
        bucket, key = self._split(path)
        for _ in range(3):
            try:
                return self._put(bucket, key, path, payload, IfNoneMatch="*")
            except ObjectConflictError:
                found = self.get_versioned(path)
                if found is None:
                    continue  # deleted in between (a compactor moved it): create it again
                if found[0] == payload:
                    return found[1]
                raise ObjectConflictError(
                    f"{path}: already exists with other content; another writer uses the same name "
                    "(two writers with the same writer id?), so this one is not overwritten"
                ) from None
        raise OSError(f"{path}: created and deleted again three times while it was written")

    def replace(self, path: str, payload: bytes, etag: str) -> str:
        """Write ``path`` only while it is still the version ``etag`` (``If-Match``), in one request; its new ETag.

        The same content already there is our own write whose answer was lost: success. Another
        version, or no object: ``ObjectConflictError`` (another writer changed or deleted it since).
        """
        bucket, key = self._split(path)
        try:
            return self._put(bucket, key, path, payload, IfMatch=etag)
        except (ObjectConflictError, FileNotFoundError) as e:
            if isinstance(e, FileNotFoundError) and "NoSuchKey" not in str(e):
                raise  # no bucket: not a conflict
            found = self.get_versioned(path)
            if found is not None and found[0] == payload:
                return found[1]
            raise ObjectConflictError(f"{path}: changed or deleted by another writer since it was read") from None

    def honours_conditions(self, probe: str) -> bool:
        """Whether the store refuses conditional writes whose condition fails, checked once per bucket
        on the object ``probe`` (three requests).

        Why: a store that ignores ``If-None-Match`` / ``If-Match`` (some S3-compatible ones do)
        answers every conditional write with success, and a lease taken that way would let two
        drivers run at once. Where it does not honour them the lease keeps write-then-verify.
        """
        bucket, key = self._split(probe)
        where = (id(self.client), bucket)
        with _LOCK:
            known = _HONOURS.get(where)
        if known is not None:
            return known
        self.put(probe, b"{}")
        honours = True
        conditions = [{"IfNoneMatch": "*"}] + ([{"IfMatch": '"spotfallback-matches-no-object"'}] if self.can_replace else [])
        for condition in conditions:
            try:
                self._put(bucket, key, probe, b"{}", **condition)
                honours = False
            except ObjectConflictError:
                pass
        if not honours:
            logger.warning("the S3 store at %s ignores conditional writes (If-None-Match / If-Match): the driver lease "
                           "keeps write, wait, read back", bucket)
        with _LOCK:
            _HONOURS[where] = honours
        return honours

    def put(self, path: str, payload: bytes) -> str:
        """Write ``path`` whole, replacing what is there, in one request (a single PUT is atomic); its ETag."""
        bucket, key = self._split(path)
        return self._put(bucket, key, path, payload)

    def _put(self, bucket: str, key: str, path: str, payload: bytes, **condition: str) -> str:
        answer = _call(partial(self.client.put_object, Bucket=bucket, Key=key, Body=payload, **condition), path)
        return str(answer.get("ETag", ""))

    def get_versioned(self, path: str) -> tuple[bytes, str] | None:
        """The content of ``path`` and its ETag, or ``None`` if there is no such object."""
        bucket, key = self._split(path)

        def fetch() -> tuple[bytes, str]:
            answer = self.client.get_object(Bucket=bucket, Key=key)
            return bytes(answer["Body"].read()), str(answer.get("ETag", ""))

        try:
            return _call(fetch, path)
        except FileNotFoundError:
            return None

    def get(self, path: str) -> bytes | None:
        """The content of ``path``, or ``None`` if there is no such object."""
        found = self.get_versioned(path)
        return None if found is None else found[0]

    def delete(self, paths: Sequence[str]) -> None:
        """Delete ``paths``, up to 1,000 per request; one already gone is no error (S3 says so too)."""
        by_bucket: dict[str, list[str]] = {}
        for path in paths:
            bucket, key = self._split(path)
            by_bucket.setdefault(bucket, []).append(key)
        for bucket, keys in by_bucket.items():
            for i in range(0, len(keys), DELETE_BATCH):
                batch = keys[i : i + DELETE_BATCH]
                where = f"{bucket}/{batch[0]} and {len(batch) - 1} more"
                request = {"Bucket": bucket, "Delete": {"Objects": [{"Key": k} for k in batch], "Quiet": True}}
                answer = _call(partial(self.client.delete_objects, **request), where)
                errors = [e for e in answer.get("Errors", []) if e.get("Code") != "NoSuchKey"]
                if errors:
                    first = errors[0]
                    raise _os_error(str(first.get("Code", "")), 0, f"{bucket}/{first.get('Key')}: {first.get('Message', '')}"
                                    f" ({len(errors)} of {len(batch)} keys not deleted)")


def _os_error(code: str, status: int, text: str) -> OSError:
    """An S3 error as the ``OSError`` that ``retry.is_permanent`` classifies as pyarrow's would be."""
    message = f"S3 error {code or status}: {text}"
    if code in _DENIED or status == 403:
        return PermissionError(message)
    if code in _MISSING or status == 404:
        return FileNotFoundError(message)
    if code in _TRANSIENT or status >= 500 or status in (0, 408, 409, 429):
        return OSError(message)
    return PermissionError(message)  # another 4xx: the request itself is refused, and will be again


def _call(fn: Callable[[], T], path: str) -> T:
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        NoCredentialsError,
        PartialCredentialsError,
    )

    try:
        return fn()
    except ClientError as e:
        error = e.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code == "PreconditionFailed" or status == 412:
            raise ObjectConflictError(f"{path}: 412 PreconditionFailed") from None
        raise _os_error(code, status, f"{path}: {error.get('Message', e)}") from None
    except (NoCredentialsError, PartialCredentialsError) as e:
        raise PermissionError(f"S3 error InvalidAccessKeyId: {path}: {e}") from None
    except BotoCoreError as e:  # no connection, a timeout, a cut answer: worth waiting out
        raise OSError(f"S3 request failed: {path}: {e}") from None


def _client(boto3: Any, options: dict[str, Any]) -> Any:
    """One client per endpoint and credentials, built once (clients are thread-safe; building one is slow).

    ``None`` where this boto3 is too old to send conditional writes.
    """
    from botocore import UNSIGNED
    from botocore.config import Config

    scheme = options.get("scheme") or "https"
    endpoint = options.get("endpoint_override") or ""
    url = (endpoint if "://" in endpoint else f"{scheme}://{endpoint}") if endpoint else None
    keys = (options.get("access_key") or None, options.get("secret_key") or None, options.get("session_token") or None)
    timeouts = tuple(t if isinstance(t, int | float) and t > 0 else 60.0
                     for t in (options.get("connect_timeout"), options.get("request_timeout")))
    # pyarrow addresses a bucket by path on an endpoint it is pointed at (MinIO, moto), by host on AWS.
    style = "virtual" if options.get("force_virtual_addressing") else ("path" if url else "auto")
    anonymous = bool(options.get("anonymous"))
    verify = options.get("tls_ca_file_path") or None
    cache_key = (url, options.get("region") or None, keys, timeouts, style, anonymous, verify)
    with _LOCK:
        if cache_key not in _CLIENTS:
            config = Config(connect_timeout=timeouts[0], read_timeout=timeouts[1], s3={"addressing_style": style},
                            retries={"mode": "standard", "max_attempts": 3},
                            signature_version=UNSIGNED if anonymous else None)
            session = boto3.session.Session()  # its own: the default session is not thread-safe
            client = session.client("s3", endpoint_url=url, region_name=options.get("region") or None,
                                    aws_access_key_id=keys[0], aws_secret_access_key=keys[1], aws_session_token=keys[2],
                                    verify=verify, config=config)
            _CLIENTS[cache_key] = client if "IfNoneMatch" in _put_parameters(client) else None
        return _CLIENTS[cache_key]


def s3_objects(fs: pafs.FileSystem) -> S3Objects | None:
    """One-request writes and batch deletes for ``fs``, or ``None`` where the caller keeps pyarrow's path.

    ``None``: not an S3 filesystem; an S3 one that assumes a role or goes through a proxy (boto3
    would reach the store another way than pyarrow does); boto3 not installed (said once, at INFO).
    """
    global _told_no_boto3
    options = _s3_options(fs)
    if options is None:
        return None
    proxy = options.get("proxy_options") or {}
    if options.get("role_arn") or (isinstance(proxy, dict) and proxy.get("host")):
        return None
    boto3 = _load_boto3()
    client = None if boto3 is None else _client(boto3, options)
    if client is None:
        if not _told_no_boto3:
            _told_no_boto3 = True
            logger.info("boto3 (1.35 or later) is not installed: S3 writes take pyarrow's path (about 6 requests per "
                        "ledger event instead of 1); pip install 'spotfallback[s3]' for one-request writes")
        return None
    return S3Objects(client, can_replace="IfMatch" in _put_parameters(client))


def _put_parameters(client: Any) -> Any:
    """The parameters this botocore's ``PutObject`` takes: an older one refuses those it does not know."""
    return client.meta.service_model.operation_model("PutObject").input_shape.members
