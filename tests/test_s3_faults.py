"""An S3 endpoint killed mid-shot and back with none of its data, with a real moto server
process (`moto_server` on a loopback port) killed with SIGKILL.

The shot goes on without crashing: the frames that could not be written fail by name. The
resubmit, once the bucket exists again, finds that every output is gone (EXRs, the Zarr
store, previews) whatever the catalog says, redoes every frame, and ends `complete` with every
frame in the store.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import s3fs
from distributed import Client, LocalCluster

from bench.common import free_port
from flows.planning import plan_shot
from flows.shot_runner import run_planned_shot
from schemas.catalog import open_catalog
from schemas.settings import Settings
from schemas.spec import parse_spec
from storage.location import Location
from storage.zarr_store import close_store, open_shot_store
from tests.shot_helpers import make_plate, spec_data

pytestmark = pytest.mark.timeout(400)
FRAMES = list(range(1001, 1007))


class MotoProcess:
    """moto's server as a process of its own, so it can be killed like a real endpoint."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        moto = Path(sys.executable).with_name("moto_server")
        self.process = subprocess.Popen(
            [str(moto), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        fs = self.fs()
        deadline = time.monotonic() + 60
        while True:
            try:
                fs.ls("")
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def options(self) -> dict:
        return {"client_kwargs": {"endpoint_url": self.endpoint}, "key": "testing",
                "secret": "testing", "skip_instance_cache": True}  # fmt: skip

    def fs(self) -> s3fs.S3FileSystem:
        return s3fs.S3FileSystem(**self.options())


@pytest.fixture
def moto(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    server = MotoProcess()
    server.start()
    yield server
    if server.process and server.process.poll() is None:
        server.kill()


def test_an_endpoint_killed_mid_shot_loses_nothing_the_catalog_claims(tmp_path, moto):
    for name in ("SVFX_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL", "SVFX_CHECKPOINT_ROOT"):
        os.environ.pop(name, None)
    moto.fs().mkdir("passes")
    settings = Settings(
        home=tmp_path, allowed_roots=[str(tmp_path), "s3://passes"], s3_endpoint_url=moto.endpoint
    )
    pattern = make_plate(tmp_path / "plates", frames=len(FRAMES))
    data = spec_data(pattern, tmp_path, passes="normal,matte", chunk_frames=2)
    spec = parse_spec({**data, "output_root": "s3://passes/out"})
    catalog = open_catalog(settings.catalog)
    killed = []

    def kill_and_restart_empty(_summary) -> None:
        if not killed:
            killed.append(True)
            moto.kill()
            moto.start()  # the endpoint is back, with none of its data
            moto.fs().mkdir("passes")

    with (
        LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None) as local,
        Client(local) as client,
    ):
        first = run_planned_shot(
            plan_shot(spec, settings), catalog, client, window=1, on_chunk=kill_and_restart_empty
        )
        assert killed and first.status == "partial"
        assert sorted(first.done)[:2] == FRAMES[:2]
        assert all("s3://passes/out" in why for why in first.failed.values()), first.failed

        again = run_planned_shot(plan_shot(spec, settings), catalog, client)
    assert again.status == "complete", again.failed
    assert sorted(again.done) == FRAMES, "every frame was lost with the endpoint's data"
    store = open_shot_store(Location(again.zarr, moto.options()), "r")
    try:
        assert not np.isnan(store["normal"][:].astype(np.float32)).any()
    finally:
        close_store(store.store)
    exrs = moto.fs().glob("passes/out/demo/sq010/sh010/sapiens2_v001/*.exr")
    assert len(exrs) == len(FRAMES)
