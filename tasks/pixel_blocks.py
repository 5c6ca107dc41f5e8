"""How many rows of a frame the per-pixel work takes at a time, on the model's device.

The per-pixel work after the model (blending, softmax probabilities to labels and Cryptomatte
ranks, renormalising, type conversion) is one torch implementation for every device. What
differs is how much of a frame one operation should cover:

- on a GPU, all of it: one kernel over the whole array is the fastest, and slicing a frame
  into bands would only add launches;
- on the CPU, a few rows: the same operations over a whole 4K frame stream each intermediate
  (a 29-channel frame is 1 GB) through main memory and page-fault every fresh allocation,
  while a band of rows keeps the work arrays in the core's cache. Bands too small cost
  torch's per-operation overhead instead; `CPU_BLOCK_BYTES` is the size between the two
  (docs/design/pixel-blocks.md).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

CPU_BLOCK_BYTES = 4 << 20


def rows_per_block(
    device: torch.device, rows: int, bytes_per_row: int, block_bytes: int | None = None
) -> int:
    """Rows of a band of per-pixel work: every row on a GPU; on the CPU about
    ``block_bytes`` (default ``CPU_BLOCK_BYTES``) of work arrays' rows."""
    if device.type != "cpu":
        return max(1, rows)
    budget = CPU_BLOCK_BYTES if block_bytes is None else block_bytes
    return max(1, min(rows, budget // max(1, bytes_per_row)))


def row_blocks(
    device: torch.device, rows: int, bytes_per_row: int, block_bytes: int | None = None
) -> Iterator[slice]:
    """Consecutive row slices covering ``rows`` rows, ``rows_per_block`` at a time."""
    step = rows_per_block(device, rows, bytes_per_row, block_bytes)
    for top in range(0, rows, step):
        yield slice(top, min(top + step, rows))
