"""The two kinds of Sapiens model, each carrying the `info` it was made from, and the one
factory that assembles either from that description, Sapiens2 or v1 (`info.family`).

A pretrain model is the backbone itself (keys without a prefix); a task model is a backbone
and a decode head (keys `backbone.*` / `decode_head.*`; v1 pose: `head.*`). `build_model`
makes one with random weights; `loading.load_model` makes one on the meta device and then
assigns a file's tensors.
"""

from __future__ import annotations

from typing import TypeAlias

import torch
from torch import Tensor, nn

from . import arch as A
from . import v1_arch as V1
from .backbone import Sapiens2Backbone
from .heads import build_head
from .info import ModelInfo
from .v1_backbone import SapiensV1Backbone


class SapiensPretrainModel(Sapiens2Backbone):
    """A pretrain backbone with its `info`; calling it returns the feature map."""

    info: ModelInfo

    def __init__(self, info: ModelInfo) -> None:
        super().__init__(info.backbone)
        self.info = info


class SapiensV1PretrainModel(SapiensV1Backbone):
    """A Sapiens v1 (MAE) pretrain backbone with its `info`; calling it returns the feature
    map."""

    info: ModelInfo

    def __init__(self, info: ModelInfo) -> None:
        super().__init__(info.backbone)
        self.info = info


class SapiensTaskModel(nn.Module):
    """Calling it on a normalized (B, 3, H, W) batch returns the head's raw output, as
    upstream's estimators do: a tensor, or `(points, scale)` for the pointmap head.

    The head is registered as `decode_head`, or as `head` for v1 pose (mmpose's name), so
    the state-dict keys are upstream's; `head_module` reaches it under either name."""

    info: ModelInfo

    def __init__(
        self,
        backbone: Sapiens2Backbone | SapiensV1Backbone,
        decode_head: nn.Module,
        info: ModelInfo,
        head_name: str = "decode_head",
    ):
        super().__init__()
        self.backbone = backbone
        setattr(self, head_name, decode_head)
        self.head_name = head_name
        self.info = info

    @property
    def task(self) -> str:
        assert self.info.task is not None
        return self.info.task

    @property
    def head_module(self) -> nn.Module:
        return getattr(self, self.head_name)

    def forward(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        return self.head_module(self.backbone(x))


SapiensModel: TypeAlias = SapiensPretrainModel | SapiensV1PretrainModel | SapiensTaskModel


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
        v1 = info.family == V1.FAMILY
        if info.head is None:
            model: SapiensModel = SapiensV1PretrainModel(info) if v1 else SapiensPretrainModel(info)
            parts: tuple[nn.Module, ...] = (model,)
        else:
            backbone = SapiensV1Backbone(info.backbone) if v1 else Sapiens2Backbone(info.backbone)
            head = build_head(info.head)
            head_name = V1.HEAD_PREFIX[info.head.task][:-1] if v1 else "decode_head"
            model = SapiensTaskModel(backbone, head, info, head_name)
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
    if isinstance(module, SapiensV1Backbone):
        nn.init.trunc_normal_(module.pos_embed, std=0.02)
        if module.cls_token is not None:
            nn.init.trunc_normal_(module.cls_token, std=0.02)
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
    input_hw: tuple[int, int] | None = None,
    num_keypoints: int | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    seed: int | None = None,
) -> SapiensModel:
    """Build a backbone (task=None) or a task model with random weights.

    `state_dict()` has exactly upstream's key names and shapes. On the meta device nothing
    is allocated, so every size can be inspected for free. v1 archs are named 'sapiens_0.3b'
    (or 'sapiens1_0.3b') ... 'sapiens_2b'; their tasks are depth, normal, seg and pose
    (`num_keypoints` 17, 133 or 308, default 308); `input_hw` sets the stored position grid
    (default 1024x768 for tasks, 1024x1024 for the pretrain backbone, as released).
    """
    if V1.is_v1_name(arch):
        if tokenizer:
            raise ValueError("Sapiens v1 has no 4K tokenizer")
        info = V1.v1_info(arch, task, num_keypoints=num_keypoints, input_hw=input_hw)
    else:
        if num_keypoints not in (None, 308):
            raise ValueError("Sapiens2 pose has 308 keypoints")
        input_hw = input_hw or A.NATIVE_INPUT_HW
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
        raise TypeError("not a Sapiens model built or loaded by this library")
    return info
