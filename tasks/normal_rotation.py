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
import torch
from torch import Tensor

from tasks.pixel_blocks import row_blocks
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


def rotate_normals(normals: Tensor, rotation: np.ndarray) -> Tensor:
    """``rotation @ n`` for every vector of ``normals`` (..., 3, h, w): components on the
    channel axis, on the model's device, in the normals' dtype.

    An exact identity rotation returns ``normals`` itself, bit for bit.
    """
    if normals.ndim < 3 or normals.shape[-3] != 3:
        raise ValueError(
            f"normals must have 3 components on the channel axis, got {tuple(normals.shape)}"
        )
    if np.array_equal(rotation, np.eye(3)):
        return normals
    matrix = torch.as_tensor(rotation, dtype=normals.dtype, device=normals.device)
    return torch.einsum("ij,...jhw->...ihw", matrix, normals)


def normalize_vectors(vectors: Tensor, eps: float = 1e-8) -> Tensor:
    """Vectors (3, ...) — components first, a frame's planes — scaled to unit length, in
    place; near-zero vectors stay near zero. Returns ``vectors``.

    Use after blending or resampling normals: weighted means of unit vectors are shorter. The
    length is sqrt((x*x + y*y) + z*z), summed in that order and divided by, as numpy's
    ``v / max(norm(v), eps)`` does it; on the CPU a band of rows at a time (cache). The square
    root is taken in float64 and rounded once, which is the correctly rounded float32 root:
    torch's own float32 ``sqrt`` on AVX-512 CPUs is one ulp off for about 17% of inputs.
    """
    if vectors.shape[0] != 3:
        raise ValueError(f"vectors must have 3 components first, got {tuple(vectors.shape)}")
    flat = vectors.view(3, vectors.shape[1], -1) if vectors.ndim > 2 else vectors.view(3, 1, -1)
    floor = torch.tensor(eps, dtype=vectors.dtype, device=vectors.device)
    length = torch.empty(0, dtype=vectors.dtype, device=vectors.device)
    square = torch.empty(0, dtype=vectors.dtype, device=vectors.device)
    for rows in row_blocks(vectors.device, flat.shape[1], flat.shape[2] * 12):
        x, y, z = flat[0, rows], flat[1, rows], flat[2, rows]
        length = length.resize_(x.shape)
        square = square.resize_(x.shape)
        torch.mul(x, x, out=length)
        length.add_(torch.mul(y, y, out=square))
        length.add_(torch.mul(z, z, out=square))
        length.copy_(length.double().sqrt_())  # torch's float32 sqrt is not exact on CPUs
        torch.maximum(length, floor, out=length)
        flat[:, rows].div_(length)
    return vectors
