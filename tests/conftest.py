"""Fixtures every test folder shares."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A local S3-compatible server (moto, a registry package) on this machine: the object-store tier's tests
    and the pods of the local cluster reach it at the returned URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()
