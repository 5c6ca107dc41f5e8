"""`ModelInfo`: what a model is (its architecture description) and where it came from.

No torch here: the checkpoint reader builds one from a file's header alone, and the model
factory assembles a model from one."""

from __future__ import annotations

from dataclasses import dataclass, field

from . import arch as A


@dataclass
class ModelInfo:
    """What a model is and where it came from: recorded in every output's provenance."""

    arch: str  # e.g. "sapiens2_1b", "sapiens2_1b_4k", "custom"
    task: str | None  # None for a pretrain backbone
    backbone: A.BackboneSpec
    head: A.HeadSpec | None = None
    input_hw: tuple[int, int] = A.NATIVE_INPUT_HW
    path: str | None = None
    sha256: str | None = None
    trained: bool = False  # False for random weights (build_model, tests, the demo)
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def family(self) -> str:
        """'sapiens2' or 'sapiens1' (v1, ECCV 2024)."""
        return self.backbone.family

    @property
    def label(self) -> str:
        kind = self.task or "pretrain"
        weights = "" if self.trained else " (UNTRAINED random weights)"
        return f"{self.arch} {kind}{weights}"
