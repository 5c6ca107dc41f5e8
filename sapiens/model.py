"""The two kinds of Sapiens2 model, each carrying the `info` it was made from, and the one
factory that assembles either from that description.

A pretrain model is the backbone itself (keys without a prefix); a task model is a backbone
and a decode head (keys `backbone.*` / `decode_head.*`). `build_model` makes one with random
weights; `loading.load_model` makes one on the meta device and then assigns a file's tensors.
"""

from __future__ import annotations

from typing import TypeAlias

import torch
from torch import Tensor, nn

from . import arch as A
from .backbone import Sapiens2Backbone
from .heads import build_head
from .info import ModelInfo


class SapiensPretrainModel(Sapiens2Backbone):
    """A pretrain backbone with its `info`; calling it returns the feature map."""

    info: ModelInfo

    def __init__(self, info: ModelInfo) -> None:
        super().__init__(info.backbone)
        self.info = info


class SapiensTaskModel(nn.Module):
    """Calling it on a normalized (B, 3, H, W) batch returns the head's raw output, as
    upstream's estimators do: a tensor, or `(points, scale)` for the pointmap head."""

    info: ModelInfo

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


SapiensModel: TypeAlias = SapiensPretrainModel | SapiensTaskModel


def make_model(info: ModelInfo, device: torch.device, seed: int | None = None) -> SapiensModel:
    """The model `info` describes, on `device`: the one place backbone, head and info are put
    together (package-internal; `build_model` and `load_model` are the public ways in).

    With real memory the weights get upstream's random init, from `seed` when given. On the
    meta device nothing is allocated or initialised, so a loader can assign a file's tensors.
    """
    random = device.type != "meta"
    with torch.device(device):
        if seed is not None and random:
            torch.manual_seed(seed)
        if info.head is None:
            model: SapiensModel = SapiensPretrainModel(info)
            parts: tuple[nn.Module, ...] = (model,)
        else:
            backbone, head = Sapiens2Backbone(info.backbone), build_head(info.head)
            model = SapiensTaskModel(backbone, head, info)
            parts = (backbone, head)
    if random:
        for part in parts:  # backbone first, then head: the seeded draws keep their order
            _init_weights(part)
    return model


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
) -> SapiensModel:
    """Build a backbone (task=None) or a task model with random weights.

    `state_dict()` has exactly upstream's key names and shapes. On the meta device nothing
    is allocated, so every size can be inspected for free.
    """
    name, named_4k = A.canonical_arch(arch)
    spec = A.backbone_spec(name, tokenizer or named_4k)
    head = A.head_spec(name, task, spec.embed_dim, input_hw) if task is not None else None
    info = ModelInfo(spec.arch_label, task, spec, head, input_hw=input_hw)
    model = make_model(info, torch.device(device if device is not None else "cpu"), seed)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


def model_info(model: nn.Module) -> ModelInfo:
    info = getattr(model, "info", None)
    if not isinstance(info, ModelInfo):
        raise TypeError("not a Sapiens2 model built or loaded by this library")
    return info
