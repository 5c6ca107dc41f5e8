"""A batched multi-task predictor: several task models (one per output, since the released
checkpoints each carry their own backbone), a batch of RGB tiles in, every requested output
out. Each model is named by the caller (the platform names them by pass); what is done with
it follows the task the model was made for (its ``ModelInfo``).

Input: float RGB in [0, 1] in the model's encoding, any H and W. Each pass is prepared as
upstream prepares it (letterbox for normal/pointmap/albedo, stretch for segmentation and
matting), run in sub-batches of `batch_size` (halved when the device runs out of memory; on
a CPU at most `CPU_PIXELS_PER_CALL` of input per call, see `sub_batch`), post-processed on the
device and brought back to the input size. A compiled model's calls are padded to that
sub-batch size (copies of the last input, their outputs dropped), so it sees one shape per
pass and compiles once. `predict_batch` keeps everything on the device,
channels first (what the platform's workers use); `predict` takes and returns numpy, channels
last:

  normal   (B, H, W, 3)  unit vectors, camera space (OpenCV axes: +x right, +y down, +z fwd)
  albedo   (B, H, W, 3)  in [0, 1], model encoding (convert back to scene-linear downstream)
  pointmap (B, H, W, 3)  metric XYZ; plus `focal` (B,) in input pixels, `pointmap_scale` (B,)
  seg      (B, H, W, 29) softmax probabilities (labels = argmax); v1: 28 classes
  depth    (B, H, W, 1)  Sapiens v1's relative depth, raw (foreground-normalised downstream)
  matte    (B, H, W)     alpha in [0, 1]; plus `matte_fg` (B, H, W, 3) when the head has it
  features (B, C, h, w)  backbone feature map (pretrain backbones, incl. the 4K variant)

`timer` measures the time spent inside the networks (on a GPU without waiting for it).

Pose is top-down on person crops: `predict_pose(image, boxes)`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from . import postprocess as post
from .arch import ALBEDO, DEPTH, MATTING, NORMAL, POINTMAP, POSE, SEG
from .device_timer import DeviceTimer
from .errors import DeviceMemoryError
from .info import ModelInfo
from .model import model_info
from .pose import PoseResult, estimate_pose
from .preprocess import letterbox, normalize, pad_to_multiple, restore, stretch, to_batch

# Sapiens2 letterboxes these tasks' inputs, stretches the others' (v1 stretches every one).
LETTERBOXED = {NORMAL, ALBEDO, POINTMAP}
# On a CPU one 1024x768 input already fills the cores' matrix units, and a larger batch only
# adds memory and time (docs/design/cpu-inference.md). Smaller inputs (the tiny stand-ins'
# 256x192) still share a call up to `batch_size`.
CPU_PIXELS_PER_CALL = 1024 * 768
log = logging.getLogger(__name__)


def sub_batch(batch_size: int, device: torch.device, input_hw: tuple[int, int]) -> int:
    """How many inputs of ``input_hw`` one model call takes: ``batch_size``, and on a CPU no
    more than make up `CPU_PIXELS_PER_CALL` (at least one)."""
    if device.type != "cpu":
        return batch_size
    return max(1, min(batch_size, CPU_PIXELS_PER_CALL // (input_hw[0] * input_hw[1])))


def channels_last_head(model: nn.Module) -> None:
    """On a CPU, a task head's convolutions in channels-last: oneDNN runs them without
    reordering every activation to its blocked layout and back, faster and with identical
    outputs (docs/design/cpu-inference.md). Weights are converted in place; the module still
    takes and returns ordinary tensors."""
    head = getattr(model, "head_module", None)
    if head is not None:
        head.to(memory_format=torch.channels_last)


class Predictor:
    def __init__(
        self,
        models: Mapping[str, nn.Module],
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        batch_size: int = 4,
        compile: bool = False,
        expected_tasks: Mapping[str, str | None] | None = None,
        pad_batches: bool | None = None,
    ) -> None:
        """``models`` by the caller's names; ``expected_tasks`` (name -> task, None for a
        pretrain backbone), when given, must name every model and match the task each was
        made for. ``pad_batches``: every call of a model takes exactly its sub-batch size, a
        short batch padded (see ``_network``); None (the default) pads the compiled models,
        which would compile again for every new batch size, and not the eager ones, which
        would only compute the padding for nothing."""
        if not models:
            raise ValueError("a predictor needs at least one model")
        first = next(iter(models.values()))
        self.device = torch.device(device) if device else next(first.parameters()).device
        if dtype is None:
            dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.dtype = dtype
        self.batch_size = batch_size
        self.models: dict[str, nn.Module] = {}
        self.infos: dict[str, ModelInfo] = {}
        for name, model in models.items():
            info = model_info(model)
            if expected_tasks is not None:
                if name not in expected_tasks:
                    raise ValueError(f"unknown output {name!r}; known: {', '.join(expected_tasks)}")
                if info.task != expected_tasks[name]:
                    raise ValueError(
                        f"{name!r} needs a {expected_tasks[name] or 'pretrain'} model, got "
                        f"{info.task or 'a pretrain backbone'} ({info.path or info.arch})"
                    )
            model = model.to(device=self.device, dtype=dtype).eval()
            if self.device.type == "cpu":
                channels_last_head(model)
            if compile:
                from .torch_compile import compile_model

                compile_model(model)
            self.models[name] = model
            self.infos[name] = info
        self.padded = {
            name: is_compiled(model) if pad_batches is None else pad_batches
            for name, model in self.models.items()
        }
        self.timer = DeviceTimer(self.device)
        self._fitting: dict[tuple[str, int, int], int] = {}  # sub-batch size that fitted

    @property
    def passes(self) -> tuple[str, ...]:
        return tuple(self.models)

    def predict(
        self, images: np.ndarray | Tensor, passes: Iterable[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Every requested pass of (B, H, W, 3) RGB images, as float32 numpy, channels last
        (matte (B, H, W)): a convenience over ``predict_batch`` for callers that want arrays
        on the host. The platform's workers stay on the device with ``predict_batch``."""
        wanted = [p for p in (passes or self.passes) if p not in self.infos or not self._posed(p)]
        missing = [p for p in wanted if p not in self.models]
        if missing:
            raise ValueError(f"no model loaded for {missing}; loaded: {list(self.models)}")
        x = to_batch(images, self.device)
        if not bool(torch.isfinite(x).all()):
            raise ValueError("input tiles contain NaN or Inf values")
        out: dict[str, np.ndarray] = {}
        for name in wanted:
            task = self.infos[name].task
            for key, value in self.predict_batch(x, name).items():
                alpha = key == name and task == MATTING
                out[key] = _host(value, channels_last=task is not None, squeeze=alpha)
        return out

    def _posed(self, name: str) -> bool:
        return self.infos[name].task == POSE

    def predict_batch(self, x01: Tensor, name: str) -> dict[str, Tensor]:
        """One pass of a (B, 3, H, W) batch of RGB in [0, 1] on this predictor's device; the
        outputs stay there, float32, channels first, at the input size:

          normal   (B, 3, H, W)  unit vectors, camera space
          albedo   (B, 3, H, W)  in [0, 1], model encoding
          pointmap (B, 3, H, W)  metric XYZ; plus `focal` (B,) in input pixels and
                                 `pointmap_scale` (B,)
          seg      (B, C, H, W)  softmax probabilities (29 classes; v1: 28)
          depth    (B, 1, H, W)  v1's relative depth, as the network gives it
          matte    (B, 1, H, W)  alpha; plus `matte_fg` (B, 3, H, W) when the head has it
          features (B, C, h, w)  backbone feature map

        The batch runs in sub-batches of `batch_size`. A sub-batch the device has no memory
        for is halved and retried, down to one input; the size that fitted is kept for later
        batches of the same pass and input size, and a padded model's short sub-batches are
        padded to it (one shape per pass and input size, whatever the batch: the last of a
        frame's tiles, the last group of a chunk). One input that does not fit raises
        DeviceMemoryError naming the pass and the size.
        """
        if name not in self.models:
            raise ValueError(f"no model loaded for {name!r}; loaded: {list(self.models)}")
        shape = (name, *x01.shape[-2:])
        info = self.infos[name]
        called_hw = info.input_hw if info.task is not None else x01.shape[-2:]  # backbone: as is
        first = sub_batch(self.batch_size, self.device, called_hw)
        size = min(self._fitting.get(shape, first), first)
        parts: dict[str, list[Tensor]] = {}
        start = 0
        while start < x01.shape[0]:
            try:
                chunk = self._run(name, x01[start : start + size], size)
            except torch.OutOfMemoryError as exc:
                release_cached_memory(self.device)
                if size == 1:
                    h, w = x01.shape[-2:]
                    raise DeviceMemoryError(
                        f"the {name} model ran out of {self.device.type} memory on one "
                        f"{w}x{h} input (w x h): {str(exc).splitlines()[0]}"
                    ) from exc
                size = max(1, size // 2)
                self._fitting[shape] = size
                log.warning(
                    "the %s model ran out of device memory; retrying %dx%d inputs %d at a time",
                    name, x01.shape[-1], x01.shape[-2], size,
                )  # fmt: skip
                continue
            for key, value in chunk.items():
                parts.setdefault(key, []).append(value)
            start += size
        return {k: v[0] if len(v) == 1 else torch.cat(v) for k, v in parts.items()}

    def _network(self, name: str, x: Tensor, size: int) -> Any:
        """The model's output for a batch of ``x``'s normalised inputs. A padded model always
        takes ``size`` inputs: a shorter batch is made up with copies of its last input (real
        values, so no kernel sees an input unlike the others) and their outputs dropped; the
        outputs of the real inputs are those of an unpadded call up to the last bits a
        batch-size-dependent kernel may change (``tests/test_predictor.py``)."""
        short = size - x.shape[0] if self.padded[name] else 0
        if short > 0:
            x = torch.cat([x, x[-1:].expand(short, *x.shape[1:])])
        with self.timer.measure():
            raw = self.models[name](x.to(self.dtype))
        if short <= 0:
            return raw
        real = size - short
        return tuple(r[:real] for r in raw) if isinstance(raw, tuple) else raw[:real]

    @torch.inference_mode()
    def _run(self, name: str, x01: Tensor, size: int) -> dict[str, Tensor]:
        info = self.infos[name]
        task = info.task
        if task is None:  # a pretrain backbone: its feature map
            padded, _ = pad_to_multiple(x01, info.backbone.input_multiple)
            return {name: self._network(name, normalize(padded), size).float()}
        # v1 resizes every dense input plainly to 1024x768 (reference §3), Sapiens2 letterboxes.
        boxed = task in LETTERBOXED and info.family == "sapiens2"
        prepare = letterbox if boxed else stretch
        canvas, geom = prepare(x01, info.input_hw)
        canvas, (pb, pr) = pad_to_multiple(canvas, info.backbone.input_multiple)
        geom = geom.padded(pb, pr)  # `restore` then drops this padding too
        raw = self._network(name, normalize(canvas), size)
        if task == NORMAL:
            return {name: post.unit_normals(restore(post.unit_normals(raw.float()), geom))}
        if task == ALBEDO:
            return {name: restore(post.albedo_rgb(raw), geom)}
        if task == SEG:
            return {name: post.seg_probabilities(restore(raw.float(), geom))}
        if task == DEPTH:
            return {name: restore(raw.float(), geom)}
        if task == MATTING:
            alpha, fg = post.split_matte(raw)
            result = {name: restore(alpha, geom)}
            if fg is not None:
                result[f"{name}_fg"] = restore(fg, geom)
            return result
        if task == POINTMAP:
            points, scale = raw
            metric, focal_canvas = post.metric_points(points, scale)
            return {
                name: restore(metric, geom),
                "focal": (focal_canvas / geom.scale_x).float(),
                "pointmap_scale": scale.reshape(-1).float(),
            }
        raise ValueError(f"the {name} model ({task}) has no dense output (pose: predict_pose)")

    def predict_pose(
        self,
        image: np.ndarray | Tensor,
        boxes_xyxy,
        *,
        flip_test: bool = True,
        channels_first: bool = False,
    ) -> PoseResult:
        """K keypoints per boxed person (308; v1: 17, 133 or 308), in plate pixels (top-down,
        UDP crop, flip test). ``image`` is (H, W, 3) RGB in [0, 1], or with
        ``channels_first`` a (3, H, W) tensor (on the device: no copy)."""
        posed = [name for name, info in self.infos.items() if info.task == POSE]
        if not posed:
            raise ValueError("no pose model loaded")
        name, info = posed[0], self.infos[posed[0]]
        crops_per_call = 2 * sub_batch(self.batch_size, self.device, info.input_hw)
        if channels_first:
            img = torch.as_tensor(image).to(device=self.device, dtype=torch.float32)
        else:
            img = to_batch(image, self.device)[0]

        def run(crops: Tensor) -> Tensor:
            return self._network(name, normalize(crops), crops_per_call).float()

        return estimate_pose(
            run,
            img,
            boxes_xyxy,
            flip_test=flip_test,
            batch_size=crops_per_call,
            input_hw=info.input_hw,
            num_keypoints=info.head.out_channels if info.head else 308,
        )


def _host(value: Tensor, channels_last: bool, squeeze: bool) -> np.ndarray:
    """An output on the host as ``predict`` gives it: channels last (a feature map stays
    channels first), alpha (B, H, W)."""
    if value.ndim == 4 and channels_last:
        value = value.permute(0, 2, 3, 1)
        if squeeze:
            value = value[..., 0]
    return value.float().contiguous().cpu().numpy()


def is_compiled(model: nn.Module) -> bool:
    """Whether ``model``, or a part of it, runs compiled: ``torch.compile``'d whole, or a
    module compiled in place (``nn.Module.compile``, as ``sapiens.torch_compile`` does; a
    part that gave up compiling has its compiled call removed again)."""
    if hasattr(model, "_orig_mod"):  # torch.compile(model)'s wrapper
        return True
    return any(getattr(m, "_compiled_call_impl", None) is not None for m in model.modules())


def release_cached_memory(device: torch.device) -> None:
    """Give the allocator's cached blocks back after an out-of-memory error, so the retry
    starts from what is really in use."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
