"""Units of work: colour, tiling, blending, checkpoints, the per-chunk worker routine."""
