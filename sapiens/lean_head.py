"""The deconvolution heads' inference forward in bounded memory: the same maths as running
their layers one after another, without the full-size temporaries.

Sapiens v1's depth head ends in four stride-2 deconvolutions and two 1x1 convs of 384
channels at the full 1024x768 input: each of those maps is 1.2 GB in fp32 per image, and
run plainly each layer keeps its input beside its output while oneDNN adds reorder buffers
of its own, several such maps at once (docs/design/cpu-inference.md). Here, with no gradient
wanted:

- the images of a batch go through the head one group at a time, a group as large as fits
  `GROUP_BYTES` per map (instance norm is per image, so the grouping changes nothing);
- a deconvolution writes its output in bands of rows (`BAND_BYTES`), each computed from the
  input rows it needs, so the convolution's own buffers are a band's;
- a 1x1 conv is computed band by band, in place when its input is ours and as wide as its
  output (each output pixel depends only on the same input pixel);
- instance norm and SiLU are applied in place (the norm's statistics and arithmetic in fp32,
  band by band, for bf16/fp16 maps).

Peak memory is then about the largest map of one group plus a band. Outputs equal the plain
forward's to float tolerance (the sums are the same, their order may differ).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

BAND_BYTES = 64 << 20  # output bytes computed at once by one deconvolution or 1x1 conv
GROUP_BYTES = 512 << 20  # per map: images of a batch that go through the head together


def lean_forward(deconv_layers: nn.Sequential, conv_layers: nn.Sequential, output: nn.Module,
                 feats: Tensor) -> Tensor:  # fmt: skip
    """``output(conv_layers(deconv_layers(feats)))``, for layers made of (conv, norm, act)
    triples; a layer this does not know runs as it is."""
    if feats.shape[0] == 0:
        return output(conv_layers(deconv_layers(feats)))
    per_image = _largest_map_bytes(deconv_layers, conv_layers, feats[:1])
    group = max(1, GROUP_BYTES // max(per_image, 1))
    outs = [_run(deconv_layers, conv_layers, output, feats[i : i + group])
            for i in range(0, feats.shape[0], group)]  # fmt: skip
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def _largest_map_bytes(deconv_layers: nn.Sequential, conv_layers: nn.Sequential,
                       one: Tensor) -> int:  # fmt: skip
    h, w = one.shape[-2:]
    largest = 0
    for layer in deconv_layers:
        if isinstance(layer, nn.ConvTranspose2d):
            h = (h - 1) * layer.stride[0] - 2 * layer.padding[0] + layer.kernel_size[0]
            w = (w - 1) * layer.stride[1] - 2 * layer.padding[1] + layer.kernel_size[1]
            largest = max(largest, layer.out_channels * h * w)
    for layer in conv_layers:
        if isinstance(layer, nn.Conv2d):
            largest = max(largest, layer.out_channels * h * w)
    return largest * one.element_size()


def _run(deconv_layers: nn.Sequential, conv_layers: nn.Sequential, output: nn.Module,
         x: Tensor) -> Tensor:  # fmt: skip
    owned = False  # whether x is ours to overwrite (never the caller's input)
    for layer in list(deconv_layers) + list(conv_layers):
        if isinstance(layer, nn.ConvTranspose2d) and _bandable_deconv(layer):
            x, owned = _deconv(layer, x), True
        elif _pointwise_conv(layer):
            x = _conv1x1(layer, x, x if owned else None)  # type: ignore[arg-type]
            owned = True
        elif isinstance(layer, nn.InstanceNorm2d) and not layer.affine and owned:
            x = layer(x) if layer.track_running_stats else _instance_norm_(x, layer.eps)
        elif isinstance(layer, nn.SiLU) and owned:
            _silu_(x)
        else:
            x, owned = layer(x), True
    if _pointwise_conv(output):
        return _conv1x1(output, x, None)  # type: ignore[arg-type]
    return output(x)


def _bands(rows: int, row_bytes: int) -> list[tuple[int, int]]:
    step = max(1, BAND_BYTES // max(row_bytes, 1))
    return [(a, min(a + step, rows)) for a in range(0, rows, step)]


def _bandable_deconv(layer: nn.ConvTranspose2d) -> bool:
    return (
        layer.groups == 1
        and layer.dilation == (1, 1)
        and layer.output_padding == (0, 0)
        and layer.padding_mode == "zeros"
        and isinstance(layer.padding, tuple)
    )


def _deconv(layer: nn.ConvTranspose2d, x: Tensor) -> Tensor:
    """The layer's output, computed in bands of output rows. Output row o is row o + p of
    the unpadded transposed convolution, which input row i reaches at rows s*i .. s*i + k-1;
    a band is computed from the input rows that reach it, unpadded in height, and cropped."""
    (k, _), (s, _), (p, pw) = layer.kernel_size, layer.stride, layer.padding
    b, _, h_in, _ = x.shape
    w_out = (x.shape[-1] - 1) * layer.stride[1] - 2 * pw + layer.kernel_size[1]
    h_out = (h_in - 1) * s - 2 * p + k
    out = x.new_empty(b, layer.out_channels, h_out, w_out)
    for o0, o1 in _bands(h_out, b * layer.out_channels * w_out * x.element_size()):
        i0 = max(0, -(-(o0 + p - k + 1) // s))
        i1 = min(h_in, (o1 + p - 1) // s + 1)
        band = F.conv_transpose2d(
            x[:, :, i0:i1], layer.weight, layer.bias, stride=layer.stride, padding=(0, pw)
        )
        start = o0 + p - s * i0
        out[:, :, o0:o1] = band[:, :, start : start + o1 - o0]
    return out


def _pointwise_conv(layer: nn.Module) -> bool:
    return (
        isinstance(layer, nn.Conv2d)
        and layer.kernel_size == (1, 1)
        and layer.stride == (1, 1)
        and layer.groups == 1
        and layer.dilation == (1, 1)
        and layer.padding in ((0, 0), "valid")
    )


def _conv1x1(layer: nn.Conv2d, x: Tensor, into: Tensor | None) -> Tensor:
    """The 1x1 conv band by band, written over `into` (x itself) when it is as wide."""
    b, _, h, w = x.shape
    out = into if into is not None and layer.out_channels == x.shape[1] else None
    if out is None:
        out = x.new_empty(b, layer.out_channels, h, w)
    for r0, r1 in _bands(h, b * max(layer.out_channels, x.shape[1]) * w * x.element_size()):
        out[:, :, r0:r1] = F.conv2d(x[:, :, r0:r1], layer.weight, layer.bias)
    return out


def _instance_norm_(x: Tensor, eps: float) -> Tensor:
    """Instance norm without affine weights, in place where x is contiguous: per image and
    channel, minus the mean over the pixels, over the root of the biased variance plus eps
    (as F.instance_norm)."""
    if not x.is_contiguous():
        return F.instance_norm(x, eps=eps)
    b, c = x.shape[:2]
    flat = x.view(b * c, -1)
    if x.dtype == torch.float32:
        var, mean = torch.var_mean(flat, dim=1, correction=0, keepdim=True)
        flat.sub_(mean).mul_(torch.rsqrt(var + eps))
        return x
    mean, var = _float_stats(flat)
    rstd = torch.rsqrt(var + eps)
    for r0, r1 in _bands(flat.shape[1], b * c * 4):
        part = flat[:, r0:r1]
        part.copy_((part.float() - mean) * rstd)
    return x


def _float_stats(flat: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and biased variance per row of a low-precision (N, P) map, accumulated in fp32
    over column bands (two passes: no full-size fp32 copy)."""
    n, pixels = flat.shape
    bands = _bands(pixels, n * 4)
    total = torch.zeros(n, 1, dtype=torch.float32, device=flat.device)
    for r0, r1 in bands:
        total += flat[:, r0:r1].float().sum(dim=1, keepdim=True)
    mean = total / pixels
    squares = torch.zeros_like(total)
    for r0, r1 in bands:
        squares += (flat[:, r0:r1].float() - mean).square().sum(dim=1, keepdim=True)
    return mean, squares / pixels


def _silu_(x: Tensor) -> None:
    F.silu(x, inplace=True)


__all__ = ["BAND_BYTES", "GROUP_BYTES", "lean_forward"]
