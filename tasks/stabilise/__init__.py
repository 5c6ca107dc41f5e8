"""The stabiliser's room: a per-frame version's passes made steady over time, as a new version.

- ``stabiliser``: the streaming windows: frames in, fused frames out (``TemporalStabiliser``),
  the flow to each neighbour composed along the window;
- ``fusion``: one frame fused with its warped neighbours, at the reduced size or at some plate
  pixels; ``lift``: the reduced size, its edges, and the lift back to the plate's;
- ``rules``: the rule per kind of values (distances, robust mean, the warps' certainties),
  named by each pass in the pass table (``schemas.passes.Pass.fusion``);
- ``settings``: how passes are fused, and the method's name recorded with a version;
- ``smoothing``: pose keypoints smoothed over time (``KeypointSmoother``);
- ``window`` and ``weights``: the streaming window and the Gaussian weights both smoothers use;
- ``worker``: a stabilised version's chunk, run by ``tasks.chunk_worker``.

Why it works as it does, with its measurements: docs/design/stabilisation.md.
"""
