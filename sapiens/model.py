"""Task models (backbone + decode head, keys `backbone.*` / `decode_head.*`) and builders."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from . import arch as A
from .backbone import Sapiens2Backbone
from .heads import build_head


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
    def label(self) -> str:
        kind = self.task or "pretrain"
        weights = "" if self.trained else " (UNTRAINED random weights)"
        return f"{self.arch} {kind}{weights}"


class SapiensTaskModel(nn.Module):
    """Calling it on a normalized (B, 3, H, W) batch returns the head's raw output, as
    upstream's estimators do: a tensor, or `(points, scale)` for the pointmap head."""

    def __init__(self, backbone: Sapiens2Backbone, decode_head: nn.Module, info: ModelInfo):
        super().__init__()
        self.backbone = backbone
        self.decode_head = decode_head
        self.info = info

    @property
    def task(self) -> str:
        assert self.info.task is not None
        return self.info.task

    def forward(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        return self.decode_head(self.backbone(x))


def _init_weights(module: nn.Module) -> None:
    """Upstream's training init (reference §1.10), so untrained models behave sanely."""
    for m in module.modules():
        if isinstance(m, nn.Linear | nn.Conv2d | nn.ConvTranspose2d):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    scale_mlp = getattr(module, "scale_final_layer", None)
    if scale_mlp is not None:
        # Untrained pointmap heads: predict s ~ 1 (a 768 px focal) rather than s ~ 0, which
        # would blow metric points up; trained weights replace this.
        nn.init.constant_(scale_mlp[-1].bias, 1.0)
    if isinstance(module, Sapiens2Backbone):
        for p in (module.cls_token, module.storage_tokens):
            nn.init.trunc_normal_(p, std=0.02)
        if module.tokenizer is not None:
            nn.init.trunc_normal_(module.tokenizer.w_cls, std=0.02)
            nn.init.trunc_normal_(module.tokenizer.local_pos_embed, std=0.02)


def build_model(
    arch: str,
    task: str | None = None,
    tokenizer: bool = False,
    *,
    input_hw: tuple[int, int] = A.NATIVE_INPUT_HW,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    seed: int | None = None,
) -> nn.Module:
    """Build a backbone (task=None) or a task model with random weights.

    `state_dict()` has exactly upstream's key names and shapes. On the meta device nothing
    is allocated, so every size can be inspected for free.
    """
    name, named_4k = A.canonical_arch(arch)
    spec = A.backbone_spec(name, tokenizer or named_4k)
    device = torch.device(device) if device is not None else torch.device("cpu")
    arch_label = f"{name}_4k" if spec.has_tokenizer else name
    with torch.device(device):
        if seed is not None and device.type != "meta":
            torch.manual_seed(seed)
        backbone = Sapiens2Backbone(spec)
        head = None
        if task is not None:
            head = build_head(A.head_spec(name, task, spec.embed_dim, input_hw))
    if device.type != "meta":
        _init_weights(backbone)
        if head is not None:
            _init_weights(head)
    if task is None:
        model: nn.Module = backbone
        backbone.info = ModelInfo(arch_label, None, spec, input_hw=input_hw)  # type: ignore[assignment]
    else:
        assert head is not None
        info = ModelInfo(arch_label, task, spec, head.spec, input_hw=input_hw)
        model = SapiensTaskModel(backbone, head, info)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


def model_info(model: nn.Module) -> ModelInfo:
    info = getattr(model, "info", None)
    if not isinstance(info, ModelInfo):
        raise TypeError("not a Sapiens2 model built or loaded by this library")
    return info
