"""The fusion's rule per kind of values (``schemas.passes.Fusion``): how far apart two
samples are, their robust weighted mean, and how a neighbour's pass is sampled and how sure
each sample is.

| rule           | distance r                              | mean                          |
|----------------|-----------------------------------------|-------------------------------|
| unit_vectors   | chord between unit vectors              | weighted, re-normalised       |
| points         | distance relative to the estimate's     | weighted, in the pass's units |
| relative_depth | absolute difference                     | weighted                      |
| colour         | root mean square over the channels      | weighted                      |
| alpha          | absolute difference                     | weighted                      |
| labels         | total variation between probabilities   | weighted (still sums to 1)    |

Why each rule and its scale: docs/design/stabilisation.md.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

EPS = 1e-6  # the centre's weight that always remains: where every weight vanished, it stands
TINY = 1e-12
# the robustness term's smallest exponent: exp(-30) is 1e-13, already nothing, and results
# below float32's normal range (exp(-87) and less) make the CPU take a slow path
_FLOOR = -30.0
# A distance beyond this is as good as infinite to every weight here (exp(-(1e18)^2) is 0);
# held below it, the medoid's sums of distances stay finite (``_to_medoid``)
_FAR = 1e18
# The kinds whose neighbours' samples get a certainty from their bilinear value against the
# nearest pixel's (``warp_with_certainty``). Relative depth has its own, the share of its taps
# on the person and its slope (``warp_relative_depth``). Colour and labels go without: it
# changed their results too little to pay for a second warp of their channels.
NEAREST_CERTAINTY = frozenset({"unit_vectors", "points", "alpha"})
# relative depth is -1 off the person and within 0..1 on it (a noisy model strays below 0): a
# value above this is on the person
OFF_PERSON = -0.5
# The scale of a relative depth sample's slope certainty against the nearest pixel's depth
# (``warp_relative_depth``): both come from one frame, so its normalisation, which the robust
# scale (``FusionSettings.relative_depth``) must allow for, is not in their distance, only
# the slope within a pixel.
_DEPTH_STEP = 0.06


def warp_with_certainty(
    values: Tensor, grid: Tensor, distance: Callable[[Tensor, Tensor], Tensor], scale: float
) -> tuple[Tensor, Tensor]:
    """A pass (C, H, W) sampled bilinearly at ``grid`` (``sampling_grid``), and each sample's
    certainty (h, w): exp(-d^2 / 2 scale^2) of the distance d between it and the nearest
    pixel's value (the robustness term's form, on the kind's distance and scale). Where a
    sample's taps straddle an edge of the pass in its own frame (a silhouette, a depth step, a
    crease), a flow a fraction of a pixel off lands on the wrong side of it; there the two
    differ and the sample loses its weight; on a smooth surface they agree. 0 where either is
    not finite."""
    sample, nearest = warp(values, grid, "bilinear"), warp(values, grid, "nearest")
    certainty = gaussian_(distance(nearest, sample), scale)
    return sample, torch.nan_to_num_(certainty, 0.0, 0.0, 0.0)


def gaussian_(distance: Tensor, scale: float) -> Tensor:
    """exp(-d^2 / 2 scale^2) of each distance, in place: the form of every weight here (the
    robustness term, the samples' certainties), its exponent floored at ``_FLOOR``."""
    return distance.square_().mul_(-0.5 / scale**2).clamp_(min=_FLOOR).exp_()


def warp(values: Tensor, grid: Tensor, mode: str) -> Tensor:
    batch = values[None]
    return F.grid_sample(batch, grid, mode=mode, padding_mode="border", align_corners=True)[0]


def on_person(depth: Tensor) -> Tensor:
    """Relative depth (1, H, W) as ``warp_relative_depth`` takes it: (2, H, W), the depth times
    the on-person mask, and the mask. A non-finite pixel counts as on the person, so a sample
    that reaches it is not finite and has no weight (``Band.fuse``), as in any pass."""
    valued = (depth <= OFF_PERSON).logical_not_().to(depth.dtype)
    return torch.cat([depth * valued, valued])


def warp_relative_depth(pair: Tensor, grid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Relative depth (``on_person``'s pair) sampled at ``grid`` (``sampling_grid``):
    interpolated bilinearly among the pixels on the person only (the depth times the mask, and
    the mask, warped, then divided), -1 where most of a sample's taps are off the person; and
    two certainties of each sample (h, w). Its share certainty, |2 x share on the person - 1|:
    1 where its taps agree, 0 where it straddles its frame's silhouette (which side it is on is
    unsure). Its slope certainty, exp(-d^2 / 2 ``_DEPTH_STEP``^2) of the distance d between
    the sample and the nearest pixel's depth where both are on the person: a sample on a steep
    slope (the person's rim, where the depth runs to the background's within a pixel or two)
    is as far off as the flow is, there. Depth is -1 off the person, so a plain bilinear sample
    at the silhouette would be neither (a mix such as -0.25); nearest sampling keeps the two
    apart but moves the depth by up to half a pixel's slope."""
    warped = warp(pair, grid, "bilinear")
    share = warped[1:2]
    on = share >= 0.5
    depth = warped[0:1].div_(share.clamp_min(TINY))
    depth = torch.where(on, depth, torch.full_like(depth, -1.0))
    nearest = warp(pair, grid, "nearest")
    both = on & (nearest[1:2] > 0.5)
    step = torch.where(both, depth - nearest[0:1], torch.zeros_like(depth))[0]
    steadiness = torch.nan_to_num_(gaussian_(step, _DEPTH_STEP), 0.0, 0.0, 0.0)
    return depth, share[0].mul(2.0).sub_(1.0).abs_(), steadiness


def robust_mean(
    kind: str, samples: list[Tensor], weights: list[Tensor], scale: float, iterations: int
) -> Tensor:
    """The robust weighted mean of ``samples`` (each (C, h, w), the centre first) under their
    base ``weights`` ((h, w) each). It starts from each pixel's weighted medoid (the sample
    with the least weighted distance to the others: what most of the trusted samples agree
    on, which a plain mean is not where some samples are wrong), then ``iterations`` times
    takes the mean with each weight times exp(-r^2 / 2 scale^2) of the sample's distance r to
    the last estimate (module table). The first round's distances, to the medoid, are the
    ones the medoid was chosen by: the medoid itself is never gathered from the samples."""
    distance = DISTANCE[kind]
    apart = _to_medoid(samples, weights, kind)
    estimate = samples[0]  # read from the second round on
    for round_ in range(max(1, iterations)):
        robust = []
        for i, (x, w) in enumerate(zip(samples, weights, strict=True)):
            r = apart[i] if round_ == 0 else distance(x, estimate)
            robust.append(gaussian_(r, scale).mul_(w))
        estimate = _weighted_mean(kind, samples, robust)
    return estimate


def _to_medoid(samples: list[Tensor], weights: list[Tensor], kind: str) -> list[Tensor]:
    """Per pixel, each sample's distance to the medoid: the sample whose weighted distance to
    the others is least (ties: the earlier, so the centre). Each pair's distance is computed
    once; a distance relative to its second sample (points: |x - m| / |m|) is kept as its
    symmetric part and the samples' scales, so the distance to the medoid is exact either way
    round. On the CPU at 4K this saved the medoid's gather (four selections of every channel:
    seg's are 29) and a round of distances.

    The selections are arithmetic, not ``torch.where``: a product with a 0/1 mask, or a lerp
    by 0 or 1, picks a finite value exactly, and on the CPU runs several times faster than
    ``torch.where``. Distances and scales are held below ``_FAR``, so every sum here stays
    finite."""
    count = len(samples)
    part = _SYMMETRIC.get(kind, DISTANCE[kind])
    scales = [_scale_of(x) for x in samples] if kind in _SYMMETRIC else None
    pairs: dict[tuple[int, int], Tensor] = {}
    costs = [torch.zeros_like(weights[0]) for _ in range(count)]
    for i in range(count):
        for j in range(i + 1, count):
            pairs[i, j] = part(samples[i], samples[j]).clamp_(max=_FAR)
            d = pairs[i, j] if scales is None else pairs[i, j] / scales[j]
            costs[i].addcmul_(d, weights[j])
            costs[j].addcmul_(d, weights[i])
    pick = torch.zeros_like(weights[0])  # the medoid's index (small integers: exact)
    least = costs[0]
    for j in range(1, count):
        better = ((costs[j] < least) & (weights[j] > 0)).to(least.dtype)
        least = least.lerp(costs[j], better)
        pick.addcmul_(better, j - pick)
    chosen = [(pick == j).to(pick.dtype) for j in range(count)]
    out = []
    for i in range(count):
        r = torch.zeros_like(weights[0])  # the medoid itself: 0
        for j in range(count):
            if j != i:
                r.addcmul_(chosen[j], pairs[min(i, j), max(i, j)])
        if scales is not None:
            scale = torch.zeros_like(weights[0])
            for j in range(count):
                scale.addcmul_(chosen[j], scales[j])
            r.div_(scale)
        out.append(r)
    return out


def _weighted_mean(kind: str, samples: list[Tensor], weights: list[Tensor]) -> Tensor:
    centre = samples[0]
    total = weights[0] + EPS
    mean = centre * total
    for x, w in zip(samples[1:], weights[1:], strict=True):
        mean.addcmul_(x, w)
        total.add_(w)
    mean.div_(total)
    if kind == "unit_vectors":
        norm = pixel_norm(mean)
        mean = torch.where(norm > TINY, mean / norm.clamp_min(TINY), centre)
    return mean


def pixel_norm(x: Tensor) -> Tensor:
    """The length of each pixel's vector (over dim 0); ``linalg.vector_norm`` over the outer
    dimension is some ten times slower on the CPU."""
    return x.square().sum(dim=0).sqrt_()


def chord(x: Tensor, m: Tensor) -> Tensor:
    return pixel_norm(x - m)


def _relative(x: Tensor, m: Tensor) -> Tensor:
    return pixel_norm(x - m).div_(_scale_of(m))


def _scale_of(m: Tensor) -> Tensor:
    """What ``_relative`` divides by (finite: ``_FAR``)."""
    return pixel_norm(m).clamp_(TINY, _FAR)


def _absolute(x: Tensor, m: Tensor) -> Tensor:
    return (x - m).abs_().amax(dim=0)


def _rms(x: Tensor, m: Tensor) -> Tensor:
    return (x - m).square_().mean(dim=0).sqrt_()


def _total_variation(x: Tensor, m: Tensor) -> Tensor:
    return (x - m).abs_().sum(dim=0).mul_(0.5)


DISTANCE: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "unit_vectors": chord,
    "points": _relative,
    "relative_depth": _absolute,
    "colour": _rms,
    "alpha": _absolute,
    "labels": _total_variation,
}
# the distances that are not symmetric: their symmetric part, then divided by ``_scale_of``
_SYMMETRIC: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"points": chord}


def all_finite(values: Tensor) -> bool:
    low, high = torch.aminmax(values)
    return bool(torch.isfinite(low) & torch.isfinite(high))
