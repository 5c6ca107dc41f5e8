"""Rotating normals predicted on an off-centre tile into the frame's camera.

Convention: camera space with OpenCV axes, +x right, +y down, +z forward (the way the camera
looks), the predictor's convention. Pixel (row i, column j) covers [j, j+1) x [i, i+1) in
continuous image coordinates, so a frame of H x W pixels has its principal point, assumed at
the frame centre, at (cx, cy) = (W/2, H/2).

Derivation. A pixel at (u, v) of a frame with focal length f (in frame pixels) sees along the
ray ((u - cx)/f, (v - cy)/f, 1) in frame-camera coordinates. The model knows nothing of the
crop: it treats every image it gets as centred on its own optical axis. For a tile that is the
view of a camera at the same centre of projection whose optical axis (+z) is the ray through
the tile's centre (cx_t, cy_t):

    d = normalise(((cx_t - cx) / f, (cy_t - cy) / f, 1)).

(This is exact for the ray through the centre and a first-order match elsewhere: a true
rotated camera's image differs from the crop by a homography that is close to the identity
for tiles a few tens of degrees off axis.) The tile camera's axes are the frame camera's
turned by a rotation R with R (0, 0, 1) = d. Many rotations do that (any extra roll about d);
we take the minimal one, whose axis lies in the image plane, so the tile camera has no roll and
its +x stays as close to the frame's +x as it can. With a = (0, 0, 1), b = d, Rodrigues'
formula for the rotation taking a to b is

    v = a x b = (-d_y, d_x, 0),  c = a . b = d_z,
    R = I + [v]x + [v]x^2 / (1 + c),

where [v]x is the cross-product matrix of v. Here c = d_z = 1 / |((cx_t-cx)/f, (cy_t-cy)/f, 1)|
is always > 0, so the formula never meets its singularity (c = -1). Normals are directions, so
a normal n_t in tile-camera coordinates is n_f = R n_t in frame-camera coordinates. R is
orthonormal, so unit normals stay unit. A centred tile has d = (0, 0, 1), v = 0 and R = I
exactly, and its normals are returned untouched.

"The tile's centre" is the centre of the array the model saw, which for a padded tile is not
the centre of its frame box. Anamorphic plates: plan, predict and rotate on the desqueezed
(square-pixel) frame, with f in desqueezed pixels (see ``tasks.anamorphic``).
"""

from __future__ import annotations

import numpy as np

from tasks.tiling import Tile


def tile_center_ray(tile: Tile, frame_hw: tuple[int, int], focal: float) -> np.ndarray:
    """Unit direction d (float64, (3,)) of the tile's centre in frame-camera coordinates."""
    if not np.isfinite(focal) or focal <= 0:
        raise ValueError(f"focal length must be a positive number of pixels, got {focal}")
    height, width = frame_hw
    # The array the model saw starts at box - valid (a padded tile reaches past the frame).
    center_y = tile.box.y0 - tile.valid.y0 + tile.shape[0] / 2
    center_x = tile.box.x0 - tile.valid.x0 + tile.shape[1] / 2
    ray = np.array([(center_x - width / 2) / focal, (center_y - height / 2) / focal, 1.0])
    return ray / np.linalg.norm(ray)


def rotation_to_ray(direction: np.ndarray) -> np.ndarray:
    """The minimal rotation (3, 3), float64, taking (0, 0, 1) to the unit vector ``direction``.

    ``direction`` must have a positive z (true of every ray in front of the camera).
    """
    d = np.asarray(direction, dtype=np.float64)
    if d.shape != (3,) or not np.isclose(np.linalg.norm(d), 1.0) or d[2] <= 0:
        raise ValueError(f"direction must be a unit 3-vector with positive z, got {d}")
    axis = np.array([-d[1], d[0], 0.0])  # (0, 0, 1) x d
    cross = np.array(
        [
            [0.0, -axis[2], axis[1]],
            [axis[2], 0.0, -axis[0]],
            [-axis[1], axis[0], 0.0],
        ]
    )
    return np.eye(3) + cross + cross @ cross / (1.0 + d[2])


def tile_rotation(tile: Tile, frame_hw: tuple[int, int], focal: float) -> np.ndarray:
    """Rotation (3, 3) taking normals from ``tile``'s camera to the frame's camera."""
    return rotation_to_ray(tile_center_ray(tile, frame_hw, focal))


def rotate_normals(normals: np.ndarray, rotation: np.ndarray) -> np.ndarray:
    """``rotation @ n`` for every vector of ``normals`` (..., 3), in the normals' dtype.

    An exact identity rotation returns ``normals`` itself, bit for bit.
    """
    if normals.shape[-1:] != (3,):
        raise ValueError(f"normals must have 3 components in the last axis, got {normals.shape}")
    if np.array_equal(rotation, np.eye(3)):
        return normals
    return normals @ rotation.T.astype(normals.dtype)


def normalize_vectors(vectors: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """Vectors (..., 3) scaled to unit length (a new array); near-zero vectors stay near zero.

    Use after blending or resampling normals: weighted means of unit vectors are shorter.
    """
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.maximum(norms, np.asarray(eps, dtype=vectors.dtype))
