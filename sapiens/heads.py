"""Task heads, key-compatible with upstream (reference §2.2-2.6).

Each head takes the backbone feature map (B, C, h, w) and returns the raw output upstream
returns: dense maps at 16x the grid (normal, albedo, pointmap, seg, matting) or 4x (pose).
Layer indices inside the Sequentials are part of the key names, so the layout is kept.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from .arch import ALBEDO, MATTING, NORM_EPS, NORMAL, POINTMAP, POSE, SEG, HeadSpec
from .lean_head import lean_forward
from .v1_arch import FAMILY as V1_FAMILY
from .v1_arch import OUTPUT_LAYER as V1_OUTPUT_LAYER


class RMSNorm2d(nn.Module):
    """RMSNorm over channels at each pixel (albedo head); key `<name>.norm.weight`."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(channels, eps=NORM_EPS)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _norm(channels: int, rms: bool) -> nn.Module:
    # Instance norm without affine weights, per-sample statistics even in eval (upstream).
    return RMSNorm2d(channels) if rms else nn.InstanceNorm2d(channels, eps=1e-5)


def _conv_block(cin: int, cout: int, k: int, rms: bool, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2), _norm(cout, rms), nn.SiLU()]


def _deconv_block(cin: int, cout: int) -> list[nn.Module]:
    return [
        nn.ConvTranspose2d(cin, cout, 4, stride=2, padding=1, bias=False),
        nn.InstanceNorm2d(cout, eps=1e-5),
        nn.SiLU(),
    ]


class DenseHead(nn.Module):
    """input conv -> PixelShuffle upsampling blocks -> 3x3 convs -> 1x1 output conv.

    The same topology serves normal (`conv_normal`), albedo (RMSNorm2d, `conv_albedo`),
    pointmap (`conv_pointmap`, plus the scale branch) and matting (`conv_matting`, sigmoid;
    its upstream layout is unverified, see loading.py).
    """

    output_names: ClassVar[dict[str, str]] = {
        NORMAL: "conv_normal",
        ALBEDO: "conv_albedo",
        POINTMAP: "conv_pointmap",
        MATTING: "conv_matting",
    }

    def __init__(self, spec: HeadSpec) -> None:
        super().__init__()
        self.spec = spec
        rms = spec.task == ALBEDO
        c = spec.in_channels
        self.input_conv = nn.Sequential(*_conv_block(c, c, 3, rms))
        blocks = []
        cur = c
        for out in spec.upsample_channels:
            conv = nn.Conv2d(cur, 4 * out, 3, padding=1)
            blocks.append(nn.Sequential(conv, nn.PixelShuffle(2), _norm(out, rms), nn.SiLU()))
            cur = out
        self.upsample_blocks = nn.ModuleList(blocks)
        layers: list[nn.Module] = []
        for out in spec.conv_channels:
            layers += _conv_block(cur, out, spec.conv_kernel, rms)
            cur = out
        self.conv_layers = nn.Sequential(*layers)
        setattr(self, self.output_names[spec.task], nn.Conv2d(cur, spec.out_channels, 1))
        if spec.task == POINTMAP:
            scale_layers: list[nn.Module] = []
            cur = c
            for out in spec.scale_conv_channels:
                scale_layers += _conv_block(cur, out, 1, False, stride=2)
                cur = out
            self.scale_conv_layers = nn.Sequential(*scale_layers)
            mlp: list[nn.Module] = [nn.Flatten()]
            dims = spec.scale_mlp
            for i in range(len(dims) - 1):
                mlp.append(nn.Linear(dims[i], dims[i + 1]))
                if i < len(dims) - 2:
                    mlp.append(nn.SiLU())
            self.scale_final_layer = nn.Sequential(*mlp)

    def forward(self, feats: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        x = self.input_conv(feats)
        for block in self.upsample_blocks:
            x = block(x)
        x = self.conv_layers(x)
        out = getattr(self, self.output_names[self.spec.task])(x)
        if self.spec.task == MATTING:
            return out.sigmoid()
        if self.spec.task == POINTMAP:
            scale_feats = self.scale_conv_layers(feats)
            expected = self.spec.scale_mlp[0]
            if scale_feats[0].numel() != expected:
                raise ValueError(
                    f"the pointmap scale branch takes {expected} features, which fixes the "
                    f"input size; got a {feats.shape[-2]}x{feats.shape[-1]} grid "
                    f"({scale_feats[0].numel()} features): letterbox to the model's input size"
                )
            return out, self.scale_final_layer(scale_feats)
        return out


class DeconvHead(nn.Module):
    """ConvTranspose2d upsampling -> 1x1 convs -> 1x1 output (seg: 29 logits; pose: 308
    heatmaps at 1/4 of the input).

    Sapiens v1's heads for every task are this head too (upstream's VitHead, VitDepthHead,
    VitNormalHead and HeatmapHead with use_silu): the output conv is `conv_seg` (seg: 28
    logits at 1/2, depth: 1 channel at full size, normal: 3 at 1/2) or `final_layer` (pose:
    17, 133 or 308 heatmaps at 1/4). The Dropout2d before `conv_seg` is a no-op at eval.
    With no gradient wanted it runs in bounded memory (`lean_head`)."""

    output_names: ClassVar[dict[str, str]] = {SEG: "conv_seg", POSE: "conv_pose"}

    def __init__(self, spec: HeadSpec) -> None:
        super().__init__()
        self.spec = spec
        v1 = spec.family == V1_FAMILY
        self.output_name = V1_OUTPUT_LAYER[spec.task] if v1 else self.output_names[spec.task]
        layers: list[nn.Module] = []
        cur = spec.in_channels
        for out in spec.deconv_channels:
            layers += _deconv_block(cur, out)
            cur = out
        self.deconv_layers = nn.Sequential(*layers)
        convs: list[nn.Module] = []
        for out in spec.conv_channels:
            convs += _conv_block(cur, out, spec.conv_kernel if v1 else 1, False)
            cur = out
        self.conv_layers = nn.Sequential(*convs)
        setattr(self, self.output_name, nn.Conv2d(cur, spec.out_channels, 1))

    def forward(self, feats: Tensor) -> Tensor:
        output = getattr(self, self.output_name)
        if not torch.is_grad_enabled() and not torch.compiler.is_compiling():
            return lean_forward(self.deconv_layers, self.conv_layers, output, feats)
        return output(self.conv_layers(self.deconv_layers(feats)))


def build_head(spec: HeadSpec) -> nn.Module:
    if spec.family == V1_FAMILY:
        if spec.task not in V1_OUTPUT_LAYER:
            raise ValueError(f"no Sapiens v1 head for task {spec.task!r}")
        return DeconvHead(spec)
    if spec.task in DenseHead.output_names:
        return DenseHead(spec)
    if spec.task in DeconvHead.output_names:
        return DeconvHead(spec)
    raise ValueError(f"no head for task {spec.task!r}")


__all__ = ["DeconvHead", "DenseHead", "RMSNorm2d", "build_head"]
