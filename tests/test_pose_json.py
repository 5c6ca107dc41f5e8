"""Pose JSON per shot: plain JSON, streamed, atomic, assembled from per-frame fragments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import s3fs

from storage.errors import FrameError
from storage.location import Location
from storage.pose_json import (
    POSE_FORMAT,
    PoseHeader,
    assemble_pose_json,
    read_pose_json,
    write_pose_fragment,
    write_pose_json,
)

K = 308
NAMES = [f"kp_{i}" for i in range(K)]
SKELETON = [("kp_0", "kp_1"), (1, 2)]


def _person(seed: int, box_score: float | None = None) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    person: dict[str, Any] = {
        "box": np.array([10.5, 20.25, 110.0, 220.0]),
        "keypoints": (rng.random((K, 2)) * 200).astype(np.float32),
        "scores": rng.random(K).astype(np.float32),
    }
    if box_score is not None:
        person["box_score"] = box_score
    return person


def _header(**changes: Any) -> PoseHeader:
    fields: dict[str, Any] = {
        "keypoint_names": NAMES,
        "skeleton": SKELETON,
        "image_size": (1920, 1080),
        "data_window": (0, 0, 1919, 1079),
        "provenance": {"sapiens2/model": "sapiens2_0.4b"},
    }
    return PoseHeader(**{**fields, **changes})


def test_streamed_json_is_plain_json(tmp_path: Path) -> None:
    path = tmp_path / "sh010.pose.json"
    first, second = _person(1, box_score=0.9), _person(2)
    second["keypoints"][5] = np.nan
    frames = [(1001, [first, second]), (1002, []), (1003, None), (1004, [first])]
    result = write_pose_json(str(path), iter(frames), _header())
    assert result.size == path.stat().st_size

    data = json.loads(path.read_text())  # nothing platform-specific needed
    assert data["format"] == POSE_FORMAT
    assert data["image_size"] == {"width": 1920, "height": 1080}
    assert data["data_window"] == [0, 0, 1919, 1079]
    assert data["keypoint_names"] == NAMES
    assert data["skeleton"] == [["kp_0", "kp_1"], [1, 2]]
    assert data["provenance"] == {"sapiens2/model": "sapiens2_0.4b"}
    assert list(data["frames"]) == ["1001", "1002", "1004"]
    assert data["frames"]["1002"] == []
    assert data["missing_frames"] == [1003]
    people = data["frames"]["1001"]
    assert people[0]["box"] == [10.5, 20.25, 110.0, 220.0]
    assert people[0]["box_score"] == 0.9
    assert "box_score" not in people[1]
    keypoints = np.array(people[0]["keypoints"], dtype=np.float64)
    assert keypoints.shape == (K, 3)
    np.testing.assert_allclose(keypoints[:, :2], first["keypoints"], atol=5e-4)
    np.testing.assert_allclose(keypoints[:, 2], first["scores"], atol=5e-5)
    assert people[1]["keypoints"][5][:2] == [None, None]
    assert read_pose_json(str(path)) == data


def test_bad_records_name_the_frame(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    short = {"box": [0, 0, 1, 1], "keypoints": np.zeros((17, 2)), "scores": np.zeros(17)}
    with pytest.raises(FrameError, match=r"frame 1002 .*308 keypoints"):
        write_pose_json(str(path), [(1001, []), (1002, [short])], _header())
    assert not path.exists()
    with pytest.raises(ValueError, match="unknown keypoint"):
        write_pose_json(str(path), [], _header(skeleton=[("kp_0", "elbow")]))


def test_fragments_assemble_into_shot_json_on_s3(s3_bucket: tuple[str, dict[str, Any]]) -> None:
    root, options = s3_bucket
    fragments = f"{root}/sh010/pose_fragments"
    write_pose_fragment(Location(fragments, options), 1001, [_person(1, 0.8)])
    write_pose_fragment(Location(fragments, options), 1003, [])
    uri = f"{root}/sh010/sh010.pose.json"
    assemble_pose_json(
        Location(uri, options), Location(fragments, options), [1001, 1002, 1003], _header()
    )
    data = json.loads(s3fs.S3FileSystem(**options).cat_file(uri))
    assert data["missing_frames"] == [1002]
    assert data["frames"]["1003"] == []
    assert data["frames"]["1001"][0]["box_score"] == 0.8
    direct = write_pose_json(
        Location(f"{root}/sh010/direct.json", options), [(1001, [_person(1, 0.8)])], _header()
    )
    assert direct.size > 0
    again = json.loads(s3fs.S3FileSystem(**options).cat_file(f"{root}/sh010/direct.json"))
    assert again["frames"]["1001"] == data["frames"]["1001"]
