"""What a frame's blended body-part probabilities become, in torch on the model's device: the
class index per pixel (EXR ``seg.id``, the Zarr labels, the preview) and the Cryptomatte rank
planes (``CryptoBodyPart00..02``). Only these cross to the host, never the probabilities
(29 float32 planes: about 1 GB for a 4K frame).

Cryptomatte ranks (Psyop specification v1.2.0; IDs and manifest in ``storage.cryptomatte``).
For each pixel the classes are sorted by probability (ties: higher class index first), the top
``ranks`` are kept, probabilities below ``min_coverage`` become ID 0 / coverage 0 (the spec's
"no object"), and the kept coverages are renormalised to sum to 1 (summed rank by rank, in
rank order). Rank r goes to plane 2r (ID) and 2r + 1 (coverage): ``<layer>NN.R/G`` for even
ranks and ``.B/A`` for odd ones, NN = r // 2, the order of ``cryptomatte.channel_names``.

How the ranks are found. The bit pattern of a non-negative float32 orders like the float, so
each probability's lowest mantissa bits are replaced by its class index: the keys of a pixel
are distinct, order like the probabilities (ties by class index) and carry the class with
them; the coverage loses those low bits (relative error < 2**-(23 - index_bits), 4e-6 for 29
classes) before renormalising. The sign bit is cleared too, so -0.0 ranks as 0. Rank 0 is the
largest key; rank r is the largest key below rank r - 1's, found without a sort as the
largest of ``key & ((key - previous) >> 31)`` (the arithmetic shift gives all ones where the
key is smaller, zero elsewhere): four passes over the key planes per rank, each of which stays
vectorised, where ``torch.topk`` over 29 classes runs a per-pixel loop on the CPU
(docs/design/pixel-blocks.md). Once no pixel of a band of rows has a rank left above
``min_coverage``, the lower ranks of the band are all "no object" and are not searched (on the
CPU, where asking costs nothing; a GPU searches every rank rather than wait for the answer).

Labels. The argmax over classes, ties to the lowest class index (numpy's and torch's rule).
Where the two best keys differ in their value bits, the best key's class is the argmax
(truncating low bits keeps order, so that class's probability is strictly the largest); only
pixels whose two best probabilities agree to within those bits need the exact argmax, the
largest of ``(p == max) * (C - c)``: on the CPU over those pixels alone (found with
``nonzero``; they are few), on a GPU over every pixel and kept only where they are close
(a ``where`` rather than a sync to learn which).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from storage.cryptomatte import DEFAULT_MIN_COVERAGE, DEFAULT_RANKS, class_ids
from tasks.pixel_blocks import row_blocks

# Bands for the rank search: larger than other per-pixel work's, since each band costs some
# sixty small operations (docs/design/pixel-blocks.md).
_SELECT_BLOCK_BYTES = 16 << 20


@dataclass(frozen=True)
class SegOutputs:
    """A frame's labels, int32 (H, W), and Cryptomatte planes, float32 (4 * layers, H, W),
    on the device of the probabilities."""

    labels: Tensor
    planes: Tensor


def seg_outputs(
    probabilities: Tensor,
    names: Sequence[str],
    ranks: int = DEFAULT_RANKS,
    min_coverage: float = DEFAULT_MIN_COVERAGE,
) -> SegOutputs:
    """Labels and Cryptomatte planes of (C, H, W) class probabilities; ``names[c]`` names class
    ``c``. ``ranks`` is rounded up to whole RGBA layers; ranks beyond the number of classes
    stay 0. NaN probabilities give meaningless values (such a frame is refused anyway)."""
    if probabilities.ndim != 3 or probabilities.shape[0] != len(names):
        raise ValueError(
            f"probabilities must be ({len(names)}, H, W) for {len(names)} class names, "
            f"got {tuple(probabilities.shape)}"
        )
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, got {ranks}")
    classes, height, width = probabilities.shape
    index_bits = max(1, (classes - 1).bit_length())
    if index_bits > 16:
        raise ValueError(f"too many classes ({classes}) for one Cryptomatte layer")
    device = probabilities.device
    probabilities = probabilities.to(torch.float32)
    ranking = _Ranking(
        classes=classes,
        kept=min(max(ranks, 2), classes),  # two ranks at least: the labels need them
        index_mask=(1 << index_bits) - 1,
        minimum=float(torch.tensor(min_coverage, dtype=torch.float32)),
        ids=torch.from_numpy(class_ids(names)).to(device),
    )
    labels = torch.empty(height * width, dtype=torch.int32, device=device)
    planes = torch.empty(((ranks + 1) // 2 * 4, height * width), dtype=torch.float32, device=device)
    bits = probabilities.view(torch.int32)
    for rows in row_blocks(device, height, classes * width * 8, _SELECT_BLOCK_BYTES):
        pixels = slice(rows.start * width, rows.stop * width)
        count = pixels.stop - pixels.start
        best, searched = ranking.best_keys(bits[:, rows].view(classes, count))
        ranking.write_labels(best, searched, probabilities[:, rows], labels[pixels])
        written = min(searched, ranks)
        ranking.write_planes(best[:written], planes[:, pixels])
        planes[2 * written :, pixels].zero_()  # the ranks not searched: "no object"
    return SegOutputs(labels.view(height, width), planes.view(-1, height, width))


@dataclass
class _Ranking:
    classes: int
    kept: int
    index_mask: int
    minimum: float  # min_coverage as float32 holds it
    ids: Tensor
    threshold: int = field(init=False)  # the bit pattern of `minimum`
    _keys: Tensor | None = None
    _below: Tensor | None = None
    _best: Tensor | None = None

    def __post_init__(self) -> None:
        # non-negative float32 bit patterns order like the floats they hold
        self.threshold = int(torch.tensor(self.minimum, dtype=torch.float32).view(torch.int32))

    @property
    def value_mask(self) -> int:
        return 0x7FFFFFFF ^ self.index_mask

    def best_keys(self, bits: Tensor) -> tuple[Tensor, int]:
        """The ``kept`` largest keys of every pixel of (C, n) probability bits, (kept, n),
        largest first, and how many ranks were searched: the ranks after those no pixel has
        above the threshold, and they are not filled in."""
        shape = bits.shape
        if self._keys is None or self._keys.shape != shape:
            self._keys = bits.new_empty(shape)
            self._below = bits.new_empty(shape)
            self._best = bits.new_empty((self.kept, shape[1]))
        keys, below, best = self._keys, self._below, self._best
        assert below is not None and best is not None
        torch.bitwise_and(bits, self.value_mask, out=keys)
        keys.bitwise_or_(torch.arange(self.classes, dtype=torch.int32, device=keys.device)[:, None])
        torch.amax(keys, dim=0, out=best[0])
        for rank in range(1, self.kept):
            if keys.device.type == "cpu" and rank > 1 and not self._any_left(best[rank - 1]):
                return best, rank
            torch.sub(keys, best[rank - 1], out=below)
            below.bitwise_right_shift_(31).bitwise_and_(keys)
            torch.amax(below, dim=0, out=best[rank])
        return best, self.kept

    def _any_left(self, keys: Tensor) -> bool:
        return bool((torch.bitwise_and(keys, self.value_mask) >= self.threshold).any())

    def write_labels(
        self, best: Tensor, searched: int, probabilities: Tensor, labels: Tensor
    ) -> None:
        """The argmax class of each pixel into ``labels`` (n,), from the best keys (kept, n)
        and, where the two best are too close to tell, the (C, rows, W) probabilities."""
        torch.bitwise_and(best[0], self.index_mask, out=labels)
        if searched < 2:  # one class
            return
        first = torch.bitwise_and(best[0], self.value_mask)
        close = first == torch.bitwise_and(best[1], self.value_mask)
        flat = probabilities.reshape(self.classes, -1)
        if labels.device.type == "cpu":  # few such pixels: only theirs
            (picked,) = torch.nonzero(close, as_tuple=True)
            if len(picked):
                labels[picked] = _first_max(flat[:, picked])
            return
        torch.where(close, _first_max(flat), labels, out=labels)

    def write_planes(self, best: Tensor, planes: Tensor) -> None:
        """Coverages (filtered, renormalised in rank order) and IDs of the ranked keys (ranks,
        n) into ``planes`` (4 * layers, n), whose other ranks stay "no object"."""
        coverages = [torch.bitwise_and(key, self.value_mask).view(torch.float32) for key in best]
        for coverage in coverages:
            coverage.masked_fill_(coverage < self.minimum, 0.0)
        total = coverages[0].clone()
        for coverage in coverages[1:]:
            total.add_(coverage)
        total.masked_fill_(total == 0, 1.0)  # every coverage is 0 there
        for rank, (key, coverage) in enumerate(zip(best, coverages, strict=True)):
            renormalised = planes[2 * rank + 1]
            torch.div(coverage, total, out=renormalised)
            pixel_ids = planes[2 * rank]
            index = torch.bitwise_and(key, self.index_mask)
            torch.index_select(self.ids, 0, index, out=pixel_ids)
            pixel_ids.masked_fill_(renormalised == 0, 0.0)


def _first_max(probabilities: Tensor) -> Tensor:
    """The first class holding the largest value of each column of (C, n): the largest of
    ``(p == max) * (C - c)``, int32."""
    classes = probabilities.shape[0]
    codes = classes - torch.arange(classes, dtype=torch.int32, device=probabilities.device)
    code = (probabilities == torch.amax(probabilities, dim=0)).to(torch.int32).mul_(codes[:, None])
    return classes - torch.amax(code, dim=0)
