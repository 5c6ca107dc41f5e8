"""A per-frame version's outputs of one frame, read back as the values a stabiliser fuses.

From the frame's EXR, by the pass table's layers (`schemas.passes`): each dense pass as a
(C, H, W) float32 tensor in its stored units (normals, points in metres, relative depth,
scene-linear albedo, alpha, the `parts` mattes); seg as (C, H, W) class probabilities rebuilt
from the Cryptomatte ranks (the coverage the model's probabilities became: the top ranks,
renormalised), so the stabilised labels and Cryptomatte are made from one fused thing. Pose
from the frame's pose fragment. The frame record says which plate and checkpoints made it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from schemas import passes as pass_table
from schemas.summaries import FrameSummary
from storage.cryptomatte import class_ids
from storage.errors import FrameError
from storage.exr_reader import ExrChannels, read_exr_channels
from storage.exr_writer import part_channels
from storage.pose_json import read_pose_fragment
from tasks.frame_records import read_frame_record
from tasks.output_paths import ShotOutputPaths


@dataclass
class VersionFrame:
    """One frame of a per-frame version: ``passes`` by name, (C, H, W) float32 on the
    device (seg: class probabilities); ``people`` as the pose fragment holds them;
    ``record``: the frame's record (plate checksum, cache key, outputs)."""

    frame: int
    passes: dict[str, Tensor]
    record: FrameSummary
    people: list[dict[str, Any]] = field(default_factory=list)


def read_version_frame(
    paths: ShotOutputPaths,
    frame: int,
    passes: Sequence[str],
    class_names: Sequence[str],
    device: torch.device | str = "cpu",
) -> VersionFrame:
    """Frame ``frame`` of the version at ``paths``: the dense ``passes`` (and pose when
    asked). FrameError naming the file and frame when an output is missing or unreadable."""
    record_uri = paths.frame_record(frame)
    try:
        record, _context = read_frame_record(paths.at(record_uri))
    except FileNotFoundError:
        raise FrameError(
            record_uri, frame, "the frame has no record in the source version (not finished)"
        ) from None
    dense = [pass_table.BY_NAME[n] for n in passes if pass_table.BY_NAME[n].exr]
    values: dict[str, Tensor] = {}
    if dense:
        exr_uri = paths.exr(frame)
        exr = read_exr_channels(paths.at(exr_uri), frame)
        for spec in dense:
            values[spec.name] = _pass_values(spec, exr, class_names, exr_uri, frame).to(device)
    people: list[dict[str, Any]] = []
    if any(pass_table.BY_NAME[n].side_file == "pose_json" for n in passes):
        found = read_pose_fragment(paths.at(paths.pose_fragments), frame)
        if found is None:
            raise FrameError(paths.pose_fragments, frame, "no pose fragment for the frame")
        people = found
    return VersionFrame(frame, values, record, people)


def _pass_values(
    spec: pass_table.Pass,
    exr: ExrChannels,
    class_names: Sequence[str],
    uri: str,
    frame: int,
) -> Tensor:
    if spec.values == "labels":
        crypto = next(layer for layer in spec.exr if layer.cryptomatte)
        names = [n for n in part_channels(crypto) if n in exr.channels]
        if not names:
            raise FrameError(uri, frame, f"no {crypto.part} channels: the {spec.name} pass")
        planes = np.stack([exr.channels[n] for n in names]).astype(np.float32, copy=False)
        return probabilities_from_ranks(torch.from_numpy(planes), class_names)
    layer = spec.exr[0]
    planes_of = layer.planes or tuple(range(len(layer.channels)))
    first = {}  # plane index -> the first channel that holds it (P.z, not depth.Z)
    for channel, plane in zip(layer.channels, planes_of, strict=True):
        first.setdefault(plane, channel)
    missing = [c for c in first.values() if c not in exr.channels]
    if missing:
        raise FrameError(uri, frame, f"no channel {', '.join(missing)}: the {spec.name} pass")
    stacked = np.stack([exr.channels[first[p]].astype(np.float32) for p in sorted(first)])
    return torch.from_numpy(stacked)


def probabilities_from_ranks(planes: Tensor, class_names: Sequence[str]) -> Tensor:
    """(C, H, W) class probabilities from Cryptomatte rank planes (4 per layer: id,
    coverage, id, coverage), each rank's coverage added to its class; IDs of no class (0:
    "no object") add nothing. Each pixel is renormalised to sum to 1 where it has coverage."""
    bits = torch.from_numpy(class_ids(class_names).view(np.int32)).to(planes.device)
    known, order = torch.sort(bits)  # an ID's bits -> its class, by binary search
    classes = len(class_names)
    height, width = planes.shape[-2:]
    probabilities = planes.new_zeros((classes, height * width))
    pairs = planes.reshape(-1, 2, height * width)
    for rank_id, coverage in pairs:
        rank_bits = rank_id.contiguous().view(torch.int32)
        at = torch.searchsorted(known, rank_bits).clamp_(max=classes - 1)
        found = known[at] == rank_bits
        probabilities.scatter_add_(0, order[at][None], torch.where(found, coverage, 0.0)[None])
    total = probabilities.sum(0, keepdim=True)
    probabilities = torch.where(total > 0, probabilities / total.clamp_min(1e-12), probabilities)
    return probabilities.view(classes, height, width)
