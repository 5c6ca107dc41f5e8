"""Outputs on S3 (moto on loopback).

A whole shot with the plate AND the output root on S3, through the same code path as local
runs (plan_shot + run_planned_shot on a LocalCluster of two worker processes, tiny UNTRAINED
models), then everything read back from the bucket:

- each EXR opens (bytes downloaded) with the expected parts; the Zarr store opens through
  zarr with the storage options and holds every frame; pose JSON, contact sheets and review
  clips are there;
- the catalog records s3:// URIs whose sha256 is the sha256 of the object's bytes;
- the bucket holds exactly the layout's keys: no temporary key is left in the output prefix;
- the same spec again does no model work.

The endpoint reaches the workers only through the jobs' storage options (their environment
has no SVFX_S3_ENDPOINT_URL); the AWS_* credentials through the environment they inherit.
A plate on S3 with outputs on local disk reads the plate with the plate's options.

Atomicity of the object-store writes (storage/atomic.py): a writer that fails inside the
write, or fails or is SIGKILLed part way through a real multipart upload (s3fs goes multipart
at 100 MiB), leaves no object under the final key (or the previous one) and no other key.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import OpenEXR
import pytest
import s3fs
import zarr
from distributed import Client, LocalCluster

from schemas.catalog import open_catalog, queries
from schemas.settings import Settings
from schemas.spec import parse_spec
from storage.atomic import atomic_open, atomic_upload_file, atomic_write_bytes
from storage.errors import StorageError
from storage.location import Location
from storage.zarr_store import close_store
from tests.shot_helpers import make_plate, spec_data

# the whole shot runs three times: 180 s ran out under make test's two workers on a loaded
# 2-core machine (the other worker's shot shares the cores)
pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[1]
FRAMES = 5
PASSES = ("normal", "pointmap", "albedo", "matte", "seg", "pose")
EXR_PARTS = ["N", "P", "albedo", "matte", "CryptoBodyPart", "seg"]


@pytest.fixture(scope="module")
def s3_cluster(s3_endpoint: str):
    """Worker processes spawn after `s3_endpoint` put the AWS_* credentials in os.environ, so
    they inherit them; the endpoint reaches them through the chunk jobs' storage options."""
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as local,
        Client(local) as client,
    ):
        yield client


_ENDPOINT = "SVFX_S3_ENDPOINT_URL"


def _settings(home: Path, monkeypatch: pytest.MonkeyPatch, endpoint: str, bucket: str) -> Settings:
    """The endpoint in the settings only: nothing falls back on the environment's."""
    monkeypatch.delenv(_ENDPOINT, raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("SVFX_CHECKPOINT_ROOT", raising=False)
    return Settings(home=home, allowed_roots=[str(home), bucket], s3_endpoint_url=endpoint)


def _upload_plate(directory: Path, bucket: str, fs: s3fs.S3FileSystem, frames: int = FRAMES) -> str:
    pattern = make_plate(directory, frames=frames)
    for path in sorted(directory.glob("*.exr")):
        fs.put_file(str(path), f"{bucket[5:]}/plates/{path.name}")
    return f"{bucket}/plates/{Path(pattern).name}"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.slow
def test_a_shot_with_plate_and_outputs_on_s3(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    s3_endpoint: str,
    s3_bucket: tuple[str, dict[str, Any]],
    s3_cluster: Client,
) -> None:
    from flows.planning import plan_shot
    from flows.shot_runner import run_planned_shot

    bucket, options = s3_bucket
    fs = s3fs.S3FileSystem(**options)
    plate = _upload_plate(tmp_path / "plates", bucket, fs)
    output_root = f"{bucket}/out"
    settings = _settings(tmp_path, monkeypatch, s3_endpoint, bucket)
    data = spec_data(plate, tmp_path, review_clips=True, chunk_frames=3)
    data["output_root"] = output_root
    spec = parse_spec(data)
    catalog = open_catalog(settings.catalog)
    env = s3_cluster.run(lambda: [os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", _ENDPOINT)])
    assert all(value == ["testing", None] for value in env.values())

    result = run_planned_shot(plan_shot(spec, settings), catalog, s3_cluster)

    frames = list(range(1001, 1001 + FRAMES))
    assert result.status == "complete", result.failed
    assert sorted(result.done) == frames
    assert result.output_root.startswith(f"{output_root}/")
    assert "error" not in result.extras, result.extras
    root = result.output_root
    name = "sh010_sapiens2_v001"

    # every EXR opens from its downloaded bytes, with every part
    fs.invalidate_cache()
    mattes = []
    for frame in frames:
        data_bytes = fs.cat_file(f"{root}/{name}.{frame}.exr")
        with OpenEXR.File(io.BytesIO(data_bytes)) as exr:
            assert [p.name() for p in exr.parts] == EXR_PARTS
            mattes.append(exr.parts[EXR_PARTS.index("matte")].channels["matte.A"].pixels)

    # the Zarr store through plain zarr and the storage options: every frame, as in the EXRs
    store = zarr.open_group(result.zarr, mode="r", storage_options=options)
    assert list(store["frame"][:]) == frames
    assert not np.isnan(store["normal"][:].astype(np.float32)).any()
    np.testing.assert_array_equal(store["matte"][:], np.stack(mattes))
    assert store["pose"].shape[0] == FRAMES
    close_store(store.store)  # plain zarr leaves its S3 session open

    # shot-level files
    pose = json.loads(fs.cat_file(result.extras["pose_json"]))
    assert sorted(int(f) for f in pose["frames"]) == frames
    for pass_name in PASSES:
        assert result.extras[f"contact_sheet_{pass_name}"].startswith("s3://")
        assert result.extras[f"review_clip_{pass_name}"].startswith("s3://")

    # catalog: s3:// URIs whose checksums are the objects' bytes
    rows = queries.outputs_page(catalog.engine, "demo", "sq010", "sh010", limit=1000)[0]
    by_uri: dict[str, set[str]] = {}
    for row in rows:
        if row["kind"] != "zarr":
            by_uri.setdefault(row["uri"], set()).add(row["sha256"])
    assert result.extras["nuke_script"] == f"{root}/{name}.nk"
    scored = queries.flicker_scores(catalog.engine, "demo", "sq010", "sh010")  # plate on S3 too
    assert {s["frame"] for s in scored} == set(frames)
    kinds = {row["kind"] for row in rows}
    assert {"exr", "zarr", "preview", "pose_json"} <= kinds
    assert all(row["uri"].startswith(f"{root}/") for row in rows)
    assert len([u for u in by_uri if u.endswith(".exr")]) == FRAMES
    for uri, shas in by_uri.items():
        assert shas == {_sha(fs.cat_file(uri))}, uri

    # exactly the layout's keys: nothing temporary left in the output prefix
    keys = sorted(fs.find(output_root, refresh=True))
    prefix = root[5:] + "/"
    layout = {key.removeprefix(prefix) for key in keys}
    expected = {f"{name}.{f}.exr" for f in frames}
    expected |= {f".pose_frames/pose.{f}.json" for f in frames}
    expected |= {f"{name}_pose.json", f"{name}.nk"}
    for pass_name in PASSES:
        expected |= {f"previews/{pass_name}/{name}_{pass_name}.{f}.jpg" for f in frames}
        expected |= {f"previews/{name}_{pass_name}_contact.jpg", f"review/{name}_{pass_name}.mp4"}
    expected |= {f"{name}.zarr/zarr.json", f"{name}.zarr/frame/zarr.json", f"{name}.zarr/frame/c/0"}
    expected |= {f".frame_records/{name}.{f}.json" for f in frames}
    expected |= {f"{name}.zarr/frame_key/zarr.json"}
    expected |= {f"{name}.zarr/frame_key/c/{shard}/0" for shard in (0, 1)}
    for pass_name in PASSES:  # 5 frames in shards of 3: two shard objects per pass
        trailing = "/0" * (store[pass_name].ndim - 1)
        expected |= {f"{name}.zarr/{pass_name}/zarr.json"}
        expected |= {f"{name}.zarr/{pass_name}/c/{shard}{trailing}" for shard in (0, 1)}
    assert all(key.startswith(prefix) for key in keys)
    assert layout == expected

    # the same spec again does no model work
    again = run_planned_shot(plan_shot(spec, settings), catalog, s3_cluster)
    assert again.status == "complete"
    assert again.done == [] and sorted(again.skipped) == frames
    assert again.chunks == 0 and again.model_s == 0
    assert sorted(fs.find(output_root, refresh=True)) == keys

    # the endpoint loses the store's objects: the resubmit finds it and redoes every frame
    fs.rm(f"{root}/{name}.zarr", recursive=True)
    lost = run_planned_shot(plan_shot(spec, settings), catalog, s3_cluster)
    assert lost.status == "complete" and sorted(lost.done) == frames
    store = zarr.open_group(result.zarr, mode="r", storage_options=options)
    assert not np.isnan(store["normal"][:].astype(np.float32)).any()
    close_store(store.store)


def test_a_plate_on_s3_with_outputs_on_local_disk(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    s3_endpoint: str,
    s3_bucket: tuple[str, dict[str, Any]],
    s3_cluster: Client,
) -> None:
    """The workers read the plate with the plate's storage options, not the outputs' ({})."""
    from flows.planning import plan_shot
    from flows.shot_runner import run_planned_shot

    bucket, options = s3_bucket
    plate = _upload_plate(tmp_path / "plates", bucket, s3fs.S3FileSystem(**options), frames=2)
    settings = _settings(tmp_path, monkeypatch, s3_endpoint, bucket)
    spec = parse_spec(spec_data(plate, tmp_path / "out", passes="matte"))
    result = run_planned_shot(plan_shot(spec, settings), open_catalog(settings.catalog), s3_cluster)
    assert result.status == "complete", result.failed
    assert sorted(p.name for p in Path(result.output_root).glob("*.exr")) == [
        f"sh010_sapiens2_v001.{f}.exr" for f in (1001, 1002)
    ]


# -- atomicity of object-store writes -------------------------------------------------------

MULTIPART = 101 * 2**20  # s3fs uploads in 50 MiB parts from 100 MiB on (pipe_file, put_file)

# Writes SOURCE to URI through storage.atomic (MODE: write_bytes, open or upload_file) with
# s3fs's real thresholds, announcing when the first part of the multipart upload is stored
# and then hanging there, so the test can SIGKILL it mid-upload.
HANGING_WRITER = textwrap.dedent(
    """
    import asyncio, json, sys
    import s3fs
    from storage.atomic import atomic_open, atomic_upload_file, atomic_write_bytes
    from storage.location import Location
    mode, uri, options, source = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
    where = Location(uri, options)
    call_s3 = s3fs.S3FileSystem._call_s3

    async def hang_after_first_part(self, method, *args, **kwargs):
        out = await call_s3(self, method, *args, **kwargs)
        if method == "upload_part":
            print("part-uploaded", flush=True)
            await asyncio.sleep(600)
        return out

    s3fs.S3FileSystem._call_s3 = hang_after_first_part
    if mode == "write_bytes":
        atomic_write_bytes(where, open(source, "rb").read())
    elif mode == "open":
        with atomic_open(where) as handle, open(source, "rb") as data:
            handle.write(data.read())
    else:
        atomic_upload_file(source, where)
    print("finished", flush=True)
    """
)


@pytest.fixture(scope="module")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("big") / "big.exr"
    path.write_bytes(bytes(range(256)) * (MULTIPART // 256))
    return path


def _uploads(fs: s3fs.S3FileSystem, bucket: str) -> list[dict[str, Any]]:
    return fs.call_s3("list_multipart_uploads", Bucket=bucket[5:]).get("Uploads", [])


@pytest.mark.parametrize(
    ("mode", "previous"),
    [("write_bytes", False), ("open", False), ("upload_file", False), ("write_bytes", True)],
)
def test_a_writer_killed_mid_multipart_upload_leaves_no_object(
    tmp_path: Path,
    s3_bucket: tuple[str, dict[str, Any]],
    big_file: Path,
    mode: str,
    previous: bool,
) -> None:
    bucket, options = s3_bucket
    fs = s3fs.S3FileSystem(**options)
    uri = f"{bucket}/out/shot/sh010.1001.exr"
    old = b"the previous complete version"
    if previous:
        atomic_write_bytes(Location(uri, options), old)
    process = subprocess.Popen(
        [sys.executable, "-c", HANGING_WRITER, mode, uri, json.dumps(options), str(big_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(tmp_path)),
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        assert line == "part-uploaded", process.stderr.read() if process.stderr else line
        # mid-upload: a part is stored, the final key is untouched
        assert [u["Key"] for u in _uploads(fs, bucket)] == ["out/shot/sh010.1001.exr"]
        fs.invalidate_cache()
        assert fs.cat_file(uri) == old if previous else not fs.exists(uri)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL
    fs.invalidate_cache()
    assert fs.find(bucket, refresh=True) == ([uri[5:]] if previous else [])
    if previous:
        assert fs.cat_file(uri) == old
    # atomic_open spools to local disk: only there can a killed writer leave a file behind
    spooled = [p.name.startswith("svfx-upload-") for p in tmp_path.iterdir()]
    assert spooled == ([True] if mode == "open" else [])
    for upload in _uploads(fs, bucket):  # what a lifecycle rule does to abandoned uploads
        fs.call_s3("abort_multipart_upload", Bucket=bucket[5:], **_upload_id(upload))


def _upload_id(upload: dict[str, Any]) -> dict[str, str]:
    return {"Key": upload["Key"], "UploadId": upload["UploadId"]}


class _Injected(OSError):
    pass


@pytest.mark.parametrize("mode", ["write_bytes", "open", "upload_file", "raise_in_block"])
def test_a_write_failing_part_way_leaves_no_object(
    s3_bucket: tuple[str, dict[str, Any]],
    big_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    """An exception in the block, or from the second part's upload once the other parts
    are stored: nothing under the key, and s3fs aborted the multipart upload (no parts left
    behind either)."""
    bucket, options = s3_bucket
    uri = f"{bucket}/out/shot/sh010.1001.exr"
    call_s3 = s3fs.S3FileSystem._call_s3
    stored: list[int] = []

    async def fail_second_part(self: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "upload_part" and kwargs["PartNumber"] == 2:
            while len(stored) < 2:  # s3fs sends the parts concurrently: fail last
                await asyncio.sleep(0.01)
            raise _Injected("connection reset while uploading part 2")
        out = await call_s3(self, method, *args, **kwargs)
        if method == "upload_part":
            stored.append(kwargs["PartNumber"])
        return out

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", fail_second_part)
    with pytest.raises((StorageError, _Injected)):
        if mode == "write_bytes":
            atomic_write_bytes(Location(uri, options), big_file.read_bytes())
        elif mode == "upload_file":
            atomic_upload_file(big_file, Location(uri, options))
        else:
            with atomic_open(Location(uri, options)) as handle:
                handle.write(big_file.read_bytes())
                if mode == "raise_in_block":
                    raise _Injected("the encoder failed")
    assert sorted(stored) == ([] if mode == "raise_in_block" else [1, 3])
    monkeypatch.undo()
    fs = s3fs.S3FileSystem(**options)
    assert fs.find(bucket, refresh=True) == []
    assert _uploads(fs, bucket) == []
