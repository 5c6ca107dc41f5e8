"""Rotating tile-view normals into the frame camera, checked against known geometry."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bench.standins import IdentityModel
from tasks.blending import FrameBlender
from tasks.normal_rotation import (
    normalize_vectors,
    rotate_normals,
    rotation_to_ray,
    tile_center_ray,
    tile_rotation,
)
from tasks.tiling import Feather, Region, Tile, extract_tiles, plan_frame

FRAME_HW = (2160, 3840)
FOCAL = 2500.0


def _rotate(vectors, rotation: np.ndarray) -> np.ndarray:
    """rotate_normals on (..., 3) numpy vectors (as planes (3, 1, N), back to (..., 3))."""
    array = np.asarray(vectors, dtype=np.float32)
    planes = torch.from_numpy(np.ascontiguousarray(array.reshape(-1, 3).T)).view(3, 1, -1)
    return rotate_normals(planes, rotation).reshape(3, -1).T.numpy().reshape(array.shape)


def _normalize(vectors) -> np.ndarray:
    array = np.asarray(vectors, dtype=np.float32)
    planes = torch.from_numpy(np.ascontiguousarray(array.reshape(-1, 3).T))
    return normalize_vectors(planes).T.numpy().reshape(array.shape)


def _tile_centred_at(center_y: float, center_x: float, size: int = 512) -> Tile:
    y0, x0 = round(center_y - size / 2), round(center_x - size / 2)
    box = Region(y0, x0, y0 + size, x0 + size)
    return Tile(0, 0, 0, box, Region(0, 0, size, size), (size, size), Feather(0, 0, 0, 0))


def test_a_centred_tile_gets_the_identity_and_leaves_normals_untouched():
    tile = _tile_centred_at(1080, 1920)
    rotation = tile_rotation(tile, FRAME_HW, FOCAL)
    assert np.array_equal(rotation, np.eye(3))
    normals = torch.randn((3, 8, 8))
    assert rotate_normals(normals, rotation) is normals


def test_the_rotation_maps_the_optical_axis_to_the_tile_centre_ray():
    tile = _tile_centred_at(300, 3500)
    ray = tile_center_ray(tile, FRAME_HW, FOCAL)
    expected = np.array([(3500 - 1920) / FOCAL, (300 - 1080) / FOCAL, 1.0])
    np.testing.assert_allclose(ray, expected / np.linalg.norm(expected), atol=1e-12)
    rotation = tile_rotation(tile, FRAME_HW, FOCAL)
    np.testing.assert_allclose(rotation @ [0.0, 0.0, 1.0], ray, atol=1e-12)


def test_ray_directions_follow_opencv_axes():
    right_and_below = tile_center_ray(_tile_centred_at(2000, 3600), FRAME_HW, FOCAL)
    left_and_above = tile_center_ray(_tile_centred_at(100, 200), FRAME_HW, FOCAL)
    assert right_and_below[0] > 0 and right_and_below[1] > 0 and right_and_below[2] > 0
    assert left_and_above[0] < 0 and left_and_above[1] < 0


@pytest.mark.parametrize("center", [(300, 3500), (2000, 100), (1080, 3800), (5, 1920)])
def test_the_rotation_is_proper_minimal_and_keeps_unit_length(center):
    ray = tile_center_ray(_tile_centred_at(*center), FRAME_HW, FOCAL)
    rotation = rotation_to_ray(ray)
    np.testing.assert_allclose(rotation @ rotation.T, np.eye(3), atol=1e-12)
    assert math.isclose(np.linalg.det(rotation), 1.0, abs_tol=1e-12)
    # Minimal: it turns by exactly the angle between +z and the ray...
    angle = math.acos((np.trace(rotation) - 1) / 2)
    assert math.isclose(angle, math.acos(ray[2]), abs_tol=1e-9)
    # ...about an axis in the image plane (no roll about the view direction).
    eigenvalues, eigenvectors = np.linalg.eig(rotation)
    axis = np.real(eigenvectors[:, np.argmin(np.abs(eigenvalues - 1))])
    assert abs(axis[2]) < 1e-9
    normals = _normalize(np.random.default_rng(1).standard_normal((50, 3)))
    rotated = _rotate(normals, rotation)
    np.testing.assert_allclose(np.linalg.norm(rotated, axis=-1), 1.0, atol=1e-6)


def test_a_horizontal_offset_is_a_pure_yaw_by_the_angle_of_view():
    tile = _tile_centred_at(1080, 3000)
    theta = math.atan((3000 - 1920) / FOCAL)
    yaw = np.array(
        [
            [math.cos(theta), 0.0, math.sin(theta)],
            [0.0, 1.0, 0.0],
            [-math.sin(theta), 0.0, math.cos(theta)],
        ]
    )
    np.testing.assert_allclose(tile_rotation(tile, FRAME_HW, FOCAL), yaw, atol=1e-12)


def test_a_wall_facing_the_camera_seen_through_an_off_centre_tile():
    # Frame camera looks at a wall z = 5; its normal points back at the camera: (0, 0, -1).
    # The tile camera is the frame camera turned (yaw) towards the tile centre, so it sees the
    # wall at an angle: in its own axes (built here from trigonometry, not from the code under
    # test) the wall's normal is (x_t . n, y_t . n, z_t . n). That is what a perfect model
    # predicts on the tile; rotating it must give back the frame-space normal.
    tile = _tile_centred_at(1080, 700)
    theta = math.atan((700 - 1920) / FOCAL)
    x_tile = np.array([math.cos(theta), 0.0, -math.sin(theta)])
    y_tile = np.array([0.0, 1.0, 0.0])
    z_tile = np.array([math.sin(theta), 0.0, math.cos(theta)])
    wall_normal = np.array([0.0, 0.0, -1.0])
    seen_by_tile = np.array([x_tile @ wall_normal, y_tile @ wall_normal, z_tile @ wall_normal])
    assert seen_by_tile[0] < -0.4  # the tile really sees the wall at an angle

    rotation = tile_rotation(tile, FRAME_HW, FOCAL)
    predicted = np.broadcast_to(seen_by_tile.astype(np.float32), (4, 4, 3))
    expected = np.broadcast_to(wall_normal, (4, 4, 3))
    np.testing.assert_allclose(_rotate(predicted, rotation), expected, atol=1e-6)


def test_a_surface_facing_the_tile_camera_faces_back_along_the_tile_ray():
    tile = _tile_centred_at(200, 3300)
    ray = tile_center_ray(tile, FRAME_HW, FOCAL)
    facing_tile = np.array([0.0, 0.0, -1.0], dtype=np.float32)
    rotated = _rotate(facing_tile, tile_rotation(tile, FRAME_HW, FOCAL))
    np.testing.assert_allclose(rotated, -ray, atol=1e-6)


def test_rotated_tiles_blend_into_one_consistent_frame_normal():
    # A perfect model on each tile predicts the wall's normal in that tile's camera;
    # after rotation every tile agrees, so the blend is the frame-space normal everywhere.
    height, width, focal = 700, 800, 500.0
    plan = plan_frame(height, width, "normal", tile_hw=(256, 192), overlap=64)
    wall_normal = np.array([0.0, 0.0, -1.0])
    blender = FrameBlender.for_plan(plan, 3)
    for tile in plan.tiles:
        rotation = tile_rotation(tile, (height, width), focal)
        in_tile_view = torch.from_numpy((rotation.T @ wall_normal).astype(np.float32))
        predicted = in_tile_view.view(3, 1, 1).expand(3, *tile.shape).contiguous()
        blender.add(tile, rotate_normals(predicted, rotation))
    expected = np.broadcast_to(wall_normal.reshape(3, 1, 1), (3, height, width))
    np.testing.assert_allclose(blender.result(), expected, atol=1e-6)


def test_a_padded_tile_uses_the_centre_of_the_padded_array():
    plan = plan_frame(2160, 3840, "backbone4k")  # padded to 2176 rows at the bottom
    (tile,) = plan.tiles
    ray = tile_center_ray(tile, (2160, 3840), FOCAL)
    assert ray[0] == 0.0
    assert math.isclose(ray[1] / ray[2], 8 / FOCAL)


def test_identity_model_through_a_single_centred_tile_with_rotation_is_exact():
    image = torch.rand((3, 600, 500), generator=torch.Generator().manual_seed(2))
    plan = plan_frame(600, 500, "normal")
    (tile,) = plan.tiles
    values = IdentityModel().predict_batch(extract_tiles(image, plan), "normal")["normal"][0]
    rotated = rotate_normals(values, tile_rotation(tile, (600, 500), FOCAL))
    blender = FrameBlender.for_plan(plan, 3)
    blender.add(tile, rotated)
    assert torch.equal(blender.result(), image)


def test_normalize_vectors_gives_unit_length_and_keeps_zero():
    vectors = torch.tensor([[3.0, 4.0, 0.0], [0.0, 0.0, 0.0], [1e-3, 0.0, 0.0]]).T.contiguous()
    assert normalize_vectors(vectors) is vectors  # in place
    unit = vectors.T.numpy()
    assert unit.dtype == np.float32
    np.testing.assert_allclose(unit[0], [0.6, 0.8, 0.0], atol=1e-7)
    assert not unit[1].any()
    np.testing.assert_allclose(unit[2], [1.0, 0.0, 0.0])


@pytest.mark.parametrize("focal", [0.0, -1.0, float("nan")])
def test_a_bad_focal_length_is_refused(focal):
    with pytest.raises(ValueError, match="focal"):
        tile_center_ray(_tile_centred_at(100, 100), FRAME_HW, focal)


def test_rotation_to_ray_refuses_rays_behind_the_camera():
    with pytest.raises(ValueError, match="positive z"):
        rotation_to_ray(np.array([0.0, 0.0, -1.0]))
