"""The per-shot Zarr v3 store: layout, round trips (local and moto S3), shard-aligned writers."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from sapiens.seg_classes import SEG_CLASSES, V1_SEG_CLASSES
from schemas.passes import zarr_arrays
from storage.errors import FrameError, StorageError
from storage.location import Location
from storage.zarr_store import (
    KEYPOINTS,
    SEG_FILL,
    close_store,
    create_shot_store,
    frames_by_shard,
    open_shot_store,
    read_stored_frame,
    shard_of,
)
from storage.zarr_writer import ShotStoreWriter, write_frame

FRAMES = [1001, 1002, 1003, 1004, 1006, 1007, 1008]  # 1005 is a hole in the plate
HEIGHT, WIDTH, PEOPLE = 6, 9, 3
ALL_PASSES = ["normal", "pointmap", "albedo", "matte", "seg", "pose"]
PROVENANCE = {"sapiens2/model": "sapiens2_0.4b", "sapiens2/weights": "untrained"}


def _create(uri: str, passes: list[str] = ALL_PASSES, options: Any = None, **kw: Any) -> None:
    create_shot_store(
        Location(uri, options),
        FRAMES,
        HEIGHT,
        WIDTH,
        zarr_arrays(passes),
        PEOPLE,
        PROVENANCE,
        frames_per_shard=3,
        **kw,
    )


def _frame_arrays(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 29, size=(HEIGHT, WIDTH)).astype(np.uint8)
    person = {
        "box": [1, 2, 5, 6],
        "keypoints": rng.random((KEYPOINTS, 2)).astype(np.float32) * 9,
        "scores": rng.random(KEYPOINTS).astype(np.float32),
    }
    return {
        "normal": rng.normal(size=(HEIGHT, WIDTH, 3)).astype(np.float32),
        "pointmap": rng.normal(size=(HEIGHT, WIDTH, 3)).astype(np.float32),
        "albedo": rng.random((HEIGHT, WIDTH, 3)).astype(np.float32),
        "matte": rng.random((HEIGHT, WIDTH)).astype(np.float32),
        "seg": labels,  # the class labels the device made
        "pose": [person],
    }


def _check_frame(read: dict[str, np.ndarray], sent: dict[str, Any]) -> None:
    np.testing.assert_array_equal(read["normal"], sent["normal"].astype(np.float16))
    np.testing.assert_array_equal(read["pointmap"], sent["pointmap"])
    np.testing.assert_array_equal(read["albedo"], sent["albedo"].astype(np.float16))
    np.testing.assert_array_equal(read["matte"], sent["matte"].astype(np.float16))
    np.testing.assert_array_equal(read["seg"], sent["seg"])
    person = sent["pose"][0]
    np.testing.assert_array_equal(read["pose"][0, :, :2], person["keypoints"])
    np.testing.assert_array_equal(read["pose"][0, :, 2], person["scores"])
    assert np.isnan(read["pose"][1:]).all()


def test_layout_metadata(tmp_path: Path) -> None:
    uri = str(tmp_path / "sh010.zarr")
    _create(uri)
    group = zarr.open_group(uri, mode="r")
    assert group.attrs["provenance"] == PROVENANCE
    assert group.attrs["frames_per_shard"] == 3
    assert group.attrs["passes"] == ALL_PASSES
    np.testing.assert_array_equal(group["frame"][:], FRAMES)
    assert group["frame"].metadata.dimension_names == ("frame",)
    expected = {
        "normal": ((7, 6, 9, 3), "float16", ("frame", "y", "x", "c")),
        "pointmap": ((7, 6, 9, 3), "float32", ("frame", "y", "x", "c")),
        "albedo": ((7, 6, 9, 3), "float16", ("frame", "y", "x", "c")),
        "matte": ((7, 6, 9), "float16", ("frame", "y", "x")),
        "seg": ((7, 6, 9), "uint8", ("frame", "y", "x")),
        "pose": ((7, PEOPLE, KEYPOINTS, 3), "float32", ("frame", "person", "keypoint", "xys")),
    }
    for name, (shape, dtype, dims) in expected.items():
        array = group[name]
        assert array.shape == shape
        assert str(array.dtype) == dtype
        assert array.metadata.dimension_names == dims
        assert array.chunks == (1, *shape[1:])
        assert array.shards == (3, *shape[1:])
        codec = array.compressors[0]
        assert (codec.cname.value, codec.shuffle.value) == ("lz4", "shuffle")
    assert np.isnan(group["normal"].fill_value)
    assert group["seg"].fill_value == SEG_FILL


def test_only_requested_passes(tmp_path: Path) -> None:
    uri = str(tmp_path / "some.zarr")
    _create(uri, passes=["matte", "seg"])
    group = zarr.open_group(uri, mode="r")
    assert sorted(group.array_keys()) == ["frame", "frame_key", "matte", "seg"]


def test_local_round_trip_and_unwritten_frames(tmp_path: Path) -> None:
    uri = str(tmp_path / "sh010.zarr")
    _create(uri)
    sent = {index: _frame_arrays(index) for index in (0, 4)}
    for index, arrays in sent.items():
        assert sorted(write_frame(uri, index, arrays)) == sorted(ALL_PASSES)
    for index, arrays in sent.items():
        _check_frame(read_stored_frame(uri, index), arrays)
    untouched = read_stored_frame(uri, 1)
    assert np.isnan(untouched["normal"]).all() and np.isnan(untouched["pose"]).all()
    assert (untouched["seg"] == SEG_FILL).all()


def test_plain_zarr_reads_store_without_our_code(tmp_path: Path) -> None:
    uri = str(tmp_path / "plain.zarr")
    _create(uri, passes=["seg", "pose"])
    labels = np.arange(HEIGHT * WIDTH, dtype=np.int64).reshape(HEIGHT, WIDTH) % 29
    write_frame(uri, 2, {"seg": labels, "pose": []})
    group = zarr.open_group(uri, mode="r")
    index = list(group["frame"][:]).index(1003)
    np.testing.assert_array_equal(group["seg"][index], labels)
    assert np.isnan(group["pose"][index]).all()


def test_s3_round_trip(s3_bucket: tuple[str, dict[str, Any]]) -> None:
    root, options = s3_bucket
    uri = f"{root}/show/sq/sh010/v001/sh010.zarr"
    _create(uri, options=options)
    arrays = _frame_arrays(3)
    write_frame(Location(uri, options), 3, arrays)
    _check_frame(read_stored_frame(Location(uri, options), 3), arrays)
    group = zarr.open_group(uri, mode="r", storage_options=options)
    assert group.attrs["provenance"] == PROVENANCE
    np.testing.assert_array_equal(group["frame"][:], FRAMES)
    close_store(group.store)  # plain zarr leaves its S3 session open


def test_shard_groups_never_overlap_between_writers(tmp_path: Path) -> None:
    groups = frames_by_shard(FRAMES, 3)
    assert groups == {0: [1001, 1002, 1003], 1: [1004, 1006, 1007], 2: [1008]}
    assert [shard_of(i, 3) for i in range(len(FRAMES))] == [0, 0, 0, 1, 1, 1, 2]
    claimed = [frame for frames in groups.values() for frame in frames]
    assert sorted(claimed) == sorted(FRAMES) and len(set(claimed)) == len(claimed)

    uri = str(tmp_path / "par.zarr")
    _create(uri)

    def write_shard(frames: list[int]) -> list[int]:
        writer = ShotStoreWriter(uri)
        frames_per_shard_on_disk = {writer.group[name].shards[0] for name in ALL_PASSES}
        assert frames_per_shard_on_disk == {3}
        touched = set()
        for frame in frames:
            index = writer.index_of(frame)
            writer.write_frame(index, _frame_arrays(frame))
            touched.add(index // 3)  # the shard zarr stores this frame in
        return sorted(touched)

    with ThreadPoolExecutor(max_workers=3) as pool:
        touched_per_writer = list(pool.map(write_shard, groups.values()))
    # Each writer touched exactly one shard object, and no two writers touched the same one.
    assert all(len(touched) == 1 for touched in touched_per_writer)
    assert len({touched[0] for touched in touched_per_writer}) == len(groups)
    shard_dirs = sorted(p.name for p in (tmp_path / "par.zarr" / "normal" / "c").iterdir())
    assert shard_dirs == ["0", "1", "2"]
    for index, frame in enumerate(FRAMES):
        _check_frame(read_stored_frame(uri, index), _frame_arrays(frame))


def test_existing_store_is_kept_or_refused(tmp_path: Path) -> None:
    uri = str(tmp_path / "again.zarr")
    _create(uri, passes=["matte"])
    matte = np.full((HEIGHT, WIDTH), 0.5, dtype=np.float32)
    write_frame(uri, 0, {"matte": matte})
    _create(uri, passes=["matte"])  # same layout: kept, frame 0 survives
    np.testing.assert_array_equal(read_stored_frame(uri, 0)["matte"], matte)
    with pytest.raises(StorageError, match="different layout"):
        _create(uri, passes=["matte", "seg"])
    _create(uri, passes=["matte", "seg"], overwrite=True)
    assert np.isnan(read_stored_frame(uri, 0)["matte"]).all()


def test_seg_keeps_its_class_names_and_another_class_list_is_another_layout(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "classes.zarr")
    _create(uri, passes=["seg"], seg_classes=SEG_CLASSES)
    store = open_shot_store(uri)
    assert store["seg"].attrs["class_names"] == list(SEG_CLASSES)
    assert "class_names" in store["seg"].attrs["content"]
    assert "seg_classes" not in store.attrs  # Sapiens2's 29: as stores made before
    _create(uri, passes=["seg"])  # no names given: the same layout, kept
    with pytest.raises(StorageError, match="different layout"):  # v1's 28: other indices
        _create(uri, passes=["seg"], seg_classes=V1_SEG_CLASSES)
    _create(uri, passes=["seg"], seg_classes=V1_SEG_CLASSES, overwrite=True)
    store = open_shot_store(uri)
    assert store["seg"].attrs["class_names"] == list(V1_SEG_CLASSES)
    assert store.attrs["seg_classes"] == 28


def test_bad_frames_raise_frame_errors(tmp_path: Path) -> None:
    uri = str(tmp_path / "bad.zarr")
    _create(uri, passes=["normal", "seg", "pose"])
    with pytest.raises(FrameError, match=r"frame 1004 .*normal.*\(6, 9, 3\)"):
        write_frame(uri, 3, {"normal": np.zeros((5, 9, 3))})
    with pytest.raises(FrameError, match="albedo"):
        write_frame(uri, 3, {"albedo": np.zeros((HEIGHT, WIDTH, 3))})
    with pytest.raises(FrameError, match="keypoints"):
        write_frame(uri, 3, {"pose": [{"keypoints": np.zeros((17, 2)), "scores": np.zeros(17)}]})
    with pytest.raises(FrameError, match=r"0\.\.254"):
        write_frame(uri, 3, {"seg": np.full((HEIGHT, WIDTH), 300)})
    with pytest.raises(FrameError, match="outside"):
        write_frame(uri, 7, {"seg": np.zeros((HEIGHT, WIDTH), np.uint8)})
    with pytest.raises(StorageError, match="no shot store"):
        read_stored_frame(str(tmp_path / "missing.zarr"), 0)


def test_extra_people_keep_the_most_confident(tmp_path: Path) -> None:
    uri = str(tmp_path / "crowd.zarr")
    _create(uri, passes=["pose"])
    people = [
        {"keypoints": np.full((KEYPOINTS, 2), float(i)), "scores": np.full(KEYPOINTS, i / 10)}
        for i in range(5)
    ]
    write_frame(uri, 0, {"pose": people})
    pose = read_stored_frame(uri, 0)["pose"]
    assert sorted(pose[:, 0, 0].tolist()) == [2.0, 3.0, 4.0]
