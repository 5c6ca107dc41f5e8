"""A batched multi-task predictor: several task models (one per pass, since the released
checkpoints each carry their own backbone), a batch of RGB tiles in, every requested pass out.

Input: float RGB in [0, 1] in the model's encoding, (B, H, W, 3), any H and W. Each pass is
prepared as upstream prepares it (letterbox for normal/pointmap/albedo, stretch for
segmentation and matting), run in sub-batches of `batch_size`, post-processed on the device
and brought back to the input size. Outputs are float32 numpy, channels last:

  normal   (B, H, W, 3)  unit vectors, camera space (OpenCV axes: +x right, +y down, +z fwd)
  albedo   (B, H, W, 3)  in [0, 1], model encoding (convert back to scene-linear downstream)
  pointmap (B, H, W, 3)  metric XYZ; plus `focal` (B,) in input pixels, `pointmap_scale` (B,)
  seg      (B, H, W, 29) softmax probabilities (labels = argmax)
  matte    (B, H, W)     alpha in [0, 1]; plus `matte_fg` (B, H, W, 3) when the head has it
  features (B, C, h, w)  backbone feature map (pretrain backbones, incl. the 4K variant)

Pose is top-down on person crops: `predict_pose(image, boxes)`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import torch
from torch import Tensor, nn

from . import postprocess as post
from .info import ModelInfo
from .model import model_info
from .pose import PoseResult, estimate_pose
from .preprocess import letterbox, normalize, pad_to_multiple, restore, stretch, to_batch

# pass name -> the task of the checkpoint that makes it
PASS_TASKS = {
    "normal": "normal",
    "albedo": "albedo",
    "pointmap": "pointmap",
    "seg": "seg",
    "matte": "matting",
    "pose": "pose",
    "features": None,
}
LETTERBOXED = {"normal", "albedo", "pointmap"}


class Predictor:
    def __init__(
        self,
        models: Mapping[str, nn.Module],
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        batch_size: int = 4,
        compile: bool = False,
    ) -> None:
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
            if name not in PASS_TASKS:
                raise ValueError(f"unknown pass {name!r}; known: {', '.join(PASS_TASKS)}")
            info = model_info(model)
            if info.task != PASS_TASKS[name]:
                got = info.task or "a pretrain backbone"
                raise ValueError(
                    f"pass {name!r} needs a {PASS_TASKS[name] or 'pretrain'} model, "
                    f"got {got} ({info.path or info.arch})"
                )
            model = model.to(device=self.device, dtype=dtype).eval()
            if compile:
                from .torch_compile import compile_model

                compile_model(model)
            self.models[name] = model
            self.infos[name] = info

    @property
    def passes(self) -> tuple[str, ...]:
        return tuple(self.models)

    def predict(
        self, images: np.ndarray | Tensor, passes: Iterable[str] | None = None
    ) -> dict[str, np.ndarray]:
        wanted = [p for p in (passes or self.passes) if p != "pose"]
        missing = [p for p in wanted if p not in self.models]
        if missing:
            raise ValueError(f"no model loaded for {missing}; loaded: {list(self.models)}")
        x = to_batch(images, self.device)
        if not bool(torch.isfinite(x).all()):
            raise ValueError("input tiles contain NaN or Inf values")
        out: dict[str, list[np.ndarray]] = {}
        for name in wanted:
            for start in range(0, x.shape[0], self.batch_size):
                chunk = self._run(name, x[start : start + self.batch_size])
                for key, value in chunk.items():
                    out.setdefault(key, []).append(value)
        return {k: np.concatenate(v) for k, v in out.items()}

    @torch.inference_mode()
    def _run(self, name: str, x01: Tensor) -> dict[str, np.ndarray]:
        model, info = self.models[name], self.infos[name]
        if name == "features":
            padded, _ = pad_to_multiple(x01, info.backbone.input_multiple)
            return {"features": _np(model(normalize(padded).to(self.dtype)), channels_last=False)}
        # v1 resizes every dense input plainly to 1024x768 (reference §3), Sapiens2 letterboxes.
        boxed = name in LETTERBOXED and info.family == "sapiens2"
        prepare = letterbox if boxed else stretch
        canvas, geom = prepare(x01, info.input_hw)
        canvas, (pb, pr) = pad_to_multiple(canvas, info.backbone.input_multiple)
        geom = geom.padded(pb, pr)  # `restore` then drops this padding too
        raw = model(normalize(canvas).to(self.dtype))
        if name == "normal":
            return {"normal": _np(post.unit_normals(restore(post.unit_normals(raw.float()), geom)))}
        if name == "albedo":
            return {"albedo": _np(restore(post.albedo_rgb(raw), geom))}
        if name == "seg":
            return {"seg": _np(post.seg_probabilities(restore(raw.float(), geom)))}
        if name == "matte":
            alpha, fg = post.split_matte(raw)
            result = {"matte": _np(restore(alpha, geom))[..., 0]}
            if fg is not None:
                result["matte_fg"] = _np(restore(fg, geom))
            return result
        if name == "pointmap":
            points, scale = raw
            metric, focal_canvas = post.metric_points(points, scale)
            return {
                "pointmap": _np(restore(metric, geom)),
                "focal": (focal_canvas / geom.scale_x).cpu().numpy().astype(np.float32),
                "pointmap_scale": scale.reshape(-1).float().cpu().numpy(),
            }
        raise ValueError(f"pass {name!r} has no dense output (pose: use predict_pose)")

    def predict_pose(
        self, image: np.ndarray | Tensor, boxes_xyxy, *, flip_test: bool = True
    ) -> PoseResult:
        """K keypoints per boxed person (308; v1: 17, 133 or 308), in plate pixels (top-down,
        UDP crop, flip test)."""
        if "pose" not in self.models:
            raise ValueError("no pose model loaded")
        model, info = self.models["pose"], self.infos["pose"]
        img = to_batch(image, self.device)[0]

        def run(crops: Tensor) -> Tensor:
            return model(normalize(crops).to(self.dtype)).float()

        return estimate_pose(
            run,
            img,
            boxes_xyxy,
            flip_test=flip_test,
            batch_size=self.batch_size * 2,
            input_hw=info.input_hw,
            num_keypoints=info.head.out_channels if info.head else 308,
        )


def _np(t: Tensor, channels_last: bool = True) -> np.ndarray:
    t = t.float()
    if channels_last:
        t = t.permute(0, 2, 3, 1)
    return t.contiguous().cpu().numpy()
