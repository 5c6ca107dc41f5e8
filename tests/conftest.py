"""Shared fixtures: a moto S3 server on loopback (s3fs cannot use in-process mocks)."""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from bench.common import free_port

# botocore must never probe the instance-metadata endpoint on a closed network, and every
# test (and every environment a test restores) has the dummy credentials moto accepts.
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
# The bf16 accuracy gate's figures are a fact of the machine: measured once for the whole
# session (and its worker processes), not once per test's SVFX_HOME.
os.environ.setdefault(
    "SVFX_PRECISION_GATE_CACHE",
    os.path.join(tempfile.gettempdir(), f"svfx-tests-{os.getuid()}", "precision-gate.json"),
)


def _restored_environment() -> Iterator[None]:
    """The CLI run in-process sets process-wide defaults in os.environ (SVFX_HOME for the
    checkpoint caches, quieter Prefect and Dask logging), as a real `svfx` process should;
    a test, or a module's fixtures, must not hand them on to the next one (or to the
    subprocesses it starts)."""
    saved = dict(os.environ)
    yield
    for key in set(os.environ) - set(saved):
        del os.environ[key]
    os.environ.update(saved)


_environment_restored_after_each_test = pytest.fixture(autouse=True)(_restored_environment)
_environment_restored_after_each_module = pytest.fixture(autouse=True, scope="module")(
    _restored_environment
)


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On pytest-xdist's workers (`make test`: ``--dist loadfile --no-loadscope-reorder`` hands
    each worker whole modules, in collection order): the modules with a test marked ``slow``
    (a server, a cluster, real processes for minutes) are collected first, so that none is
    started last while the other workers sit idle. Every worker sorts alike, as xdist needs;
    the order within a module, and outside xdist, is left as it was."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    slow = {_module(item) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: _module(item) not in slow)


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 for the whole session, with dummy credentials."""
    from moto.server import ThreadedMotoServer

    os.environ["AWS_ACCESS_KEY_ID"] = "testing"
    os.environ["AWS_SECRET_ACCESS_KEY"] = "testing"
    os.environ["AWS_DEFAULT_REGION"] = "us-east-1"
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        yield endpoint
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """A fresh, empty bucket; yields (`s3://bucket`, storage_options for fsspec)."""
    import s3fs

    options: dict[str, Any] = {
        "client_kwargs": {"endpoint_url": s3_endpoint},
        "key": "testing",
        "secret": "testing",
        "skip_instance_cache": True,
    }
    fs = s3fs.S3FileSystem(**options)
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    try:
        yield f"s3://{bucket}", options
    finally:
        with contextlib.suppress(FileNotFoundError):
            fs.rm(bucket, recursive=True)


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[None]:
    """One temporary Prefect API for the session (it takes 6-11 s to start)."""
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    from prefect.testing.utilities import prefect_test_harness

    # Importing the flow sets up Prefect's logging, whose console handler keeps the
    # sys.stderr of that moment: do it here, not inside a CliRunner call (whose stderr is
    # closed after each invoke; a later flow's logs would then fail).
    import flows.process_shot  # noqa: F401

    with prefect_test_harness(server_startup_timeout=60):
        yield
