"""Fixtures several cluster test modules share."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def s3():
    """A loopback S3 server (moto) with a bucket, per module: each xdist worker has its own."""
    from tests.support.s3server import S3Server

    with S3Server() as server:
        yield server
