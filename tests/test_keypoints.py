"""The 308-keypoint set: order, left/right mirror relation and skeleton."""

from __future__ import annotations

import hashlib

import pytest

from sapiens.keypoints import (
    FLIP_INDICES,
    KEYPOINT_COLORS,
    KEYPOINT_INDEX,
    KEYPOINT_NAMES,
    SKELETON,
    SKELETON_COLORS,
    mirror_name,
)

# sha256 of repr(tuple(...)) of the keypoint names, of the flip indices built from each
# keypoint's `swap` name, and of the skeleton links as index pairs, all computed from
# upstream facebookresearch/sapiens2 @ 3098c14, sapiens/pose/configs/_base_/keypoints308.py
# (teeth removed). They pin the whole order and the whole mirror relation.
UPSTREAM_NAMES_SHA256 = "7bef2d18fb816d4a8ff275808273ea1ad0245ed94ae64a4de75d236f8a8034eb"
UPSTREAM_FLIP_SHA256 = "35a10d9bf077d4b4dc5e2fb0546a323b77c487c3130cfd42a013faf8d73ef785"
UPSTREAM_SKELETON_SHA256 = "1a829f9318018073ea07601e5059d8cbb224411f4d92af1521c5e59271233fac"


def _digest(values: object) -> str:
    return hashlib.sha256(repr(tuple(values)).encode()).hexdigest()


def test_keypoint_order_matches_upstream() -> None:
    assert len(KEYPOINT_NAMES) == 308
    assert len(set(KEYPOINT_NAMES)) == 308
    assert not any(name.startswith("teeth_") for name in KEYPOINT_NAMES)
    assert _digest(KEYPOINT_NAMES) == UPSTREAM_NAMES_SHA256


@pytest.mark.parametrize(
    ("index", "name"),
    [
        (0, "nose"),
        (5, "left_shoulder"),
        (9, "left_hip"),
        (14, "right_ankle"),
        (15, "left_big_toe"),
        (20, "right_heel"),
        (21, "right_thumb4"),
        (24, "right_thumb_third_joint"),
        (41, "right_wrist"),
        (42, "left_thumb4"),
        (62, "left_wrist"),
        (69, "neck"),
        (70, "center_of_glabella"),
        (220, "l_top_end_of_inferior_crus"),
        (272, "l_center_of_iris"),
        (307, "r_border_of_pupil_midpoint_2"),
    ],
)
def test_landmark_indices(index: int, name: str) -> None:
    assert KEYPOINT_NAMES[index] == name
    assert KEYPOINT_INDEX[name] == index


def test_flip_indices_are_an_involution_with_16_midline_points() -> None:
    assert len(FLIP_INDICES) == 308
    assert sorted(FLIP_INDICES) == list(range(308))
    assert all(FLIP_INDICES[FLIP_INDICES[i]] == i for i in range(308))
    fixed = [KEYPOINT_NAMES[i] for i in range(308) if FLIP_INDICES[i] == i]
    assert len(fixed) == 16
    assert {"nose", "neck", "tip_of_chin", "center_of_cupid_bow"} <= set(fixed)
    for name in fixed:
        assert not {"left", "right", "l", "r"} & set(name.split("_")), name


def test_flip_indices_match_upstream_swap_relation() -> None:
    assert _digest(FLIP_INDICES) == UPSTREAM_FLIP_SHA256


# Pairs read from the upstream `swap` fields; several renumber along a face contour.
@pytest.mark.parametrize(
    ("name", "mirror"),
    [
        ("left_wrist", "right_wrist"),
        ("left_pinky_finger_third_joint", "right_pinky_finger_third_joint"),
        ("upper_startpoint_of_r_eyebrow", "upper_startpoint_of_l_eyebrow"),
        ("upper_midpoint_1_of_r_eyebrow", "upper_midpoint_1_of_l_eyebrow"),
        ("upper_midpoint_2_of_r_eyebrow", "upper_midpoint_3_of_l_eyebrow"),
        ("l_midpoint_2_of_upper_lash_line", "r_midpoint_1_of_upper_lash_line"),
        ("l_midpoint_6_of_upper_eyelid_line", "r_midpoint_3_of_upper_eyelid_line"),
        ("l_centerpoint_of_lower_eyelid_line", "r_centerpoint_of_lower_eyelid_line"),
        ("inner_corner_of_r_nostril", "inner_corner_of_l_nostril"),
        ("midpoint_1_of_upper_outer_lip", "midpoint_2_of_upper_outer_lip"),
        ("midpoint_4_of_lower_inner_lip", "midpoint_5_of_lower_inner_lip"),
        ("l_point_2_of_inner_helix", "r_point_8_of_inner_helix"),
        ("l_point_5_of_inner_helix", "r_point_5_of_inner_helix"),
        ("l_midpoint_between_22_15", "r_midpoint_between_22_15"),
        ("l_border_of_iris_3", "r_border_of_iris_9"),
        ("l_border_of_iris_12", "r_border_of_iris_12"),
        ("r_border_of_pupil_midpoint_2", "l_border_of_pupil_midpoint_3"),
        ("l_border_of_pupil_midpoint_1", "r_border_of_pupil_midpoint_4"),
        ("midpoint_2_of_nose_bridge", "midpoint_2_of_nose_bridge"),
        ("tip_of_nose", "tip_of_nose"),
    ],
)
def test_known_mirror_pairs(name: str, mirror: str) -> None:
    assert mirror_name(name) == mirror
    assert mirror_name(mirror) == name
    assert FLIP_INDICES[KEYPOINT_INDEX[name]] == KEYPOINT_INDEX[mirror]


def test_skeleton_links_and_colours() -> None:
    assert len(SKELETON) == 65
    assert len(SKELETON_COLORS) == 65
    assert _digest(SKELETON) == UPSTREAM_SKELETON_SHA256
    assert all(0 <= a < 308 and 0 <= b < 308 and a != b for a, b in SKELETON)
    assert SKELETON[0] == (KEYPOINT_INDEX["left_ankle"], KEYPOINT_INDEX["left_knee"])
    assert SKELETON_COLORS[0] == (0, 255, 0)  # left limbs green, RGB
    assert SKELETON_COLORS[2] == (255, 128, 0)  # right limbs orange
    for color in (*SKELETON_COLORS, *KEYPOINT_COLORS):
        assert len(color) == 3 and all(isinstance(c, int) and 0 <= c <= 255 for c in color)
    assert len(KEYPOINT_COLORS) == 308


def test_skeleton_is_left_right_symmetric() -> None:
    links = {frozenset(link) for link in SKELETON}
    mirrored = {frozenset(FLIP_INDICES[i] for i in link) for link in SKELETON}
    assert mirrored == links
