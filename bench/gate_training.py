"""Train the toy models of the bf16 accuracy gate (``tasks.precision_gate``) on synthetic scenes.

A random network's outputs mean nothing (a seg model whose every pixel is a near tie, a pose
model with no peak), so bf16 against fp32 on one says little. These models are trained here,
briefly, on the synthetic figures of ``tasks.precision_gate_scene``, so that their outputs
follow the plate and vary smoothly with it: normals from the figure's surface, the pointmap
and v1's depth from its geometry, albedo its flat colours, the matte its coverage, seg its
parts and pose heatmap peaks at its landmark points. They are toy models, not Sapiens.

The six Sapiens2 tasks are ``sapiens2_tiny`` heads trained together on one shared backbone
(one backbone pass per step feeds five heads; pose runs it on person crops), which the weights
folder stores once (``tasks/precision_gate_weights/``: the backbone, a file per head, and v1's
``sapiens1_tiny`` depth model whole); every tensor is stored as bf16, so fp32 and bf16 load the
very same values. Deterministic on one thread with the same torch build (run twice, the same
bytes). 600 steps of 2 scenes from a pool of 256 take five to six minutes on one thread of this
project's shared machine; the models are far from converged (the matte and seg rough, albedo
the weakest), which the gate does not need: outputs that follow the plate smoothly.

    python -m bench.gate_training                      # the committed weights
    python -m bench.gate_training --steps 40 --out /tmp/gate-weights   # a quick try
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sapiens.arch import ALBEDO, CANONICAL_FOCAL, DEPTH, MATTING, NORMAL, POINTMAP, POSE, SEG
from sapiens.loading import save_model
from sapiens.model import SapiensTaskModel, build_model
from sapiens.pose import crop_people, image_to_input, make_crop
from sapiens.preprocess import normalize
from tasks import gate_models
from tasks.precision_gate_scene import FOCAL, HW, TRAINING_SEEDS, GateScene, make_scene

HEATMAP_SIGMA = 2.0  # heatmap pixels, as upstream's UDP codec draws its targets
SAPIENS2_TASKS = (NORMAL, POINTMAP, ALBEDO, MATTING, SEG, POSE)
assert {*SAPIENS2_TASKS, DEPTH} == set(gate_models.GATE_TASKS.values()), "a gate model untrained"
# The scale the pointmap head should give: metric = points / s, focal = 768 / s (canvas px)
POINTMAP_SCALE = CANONICAL_FOCAL / FOCAL
PERSON_WEIGHT = 4.0


@dataclass
class Batch:
    """The normalised plates (B, 3, H, W), their person crops and every task's target."""

    plates: Tensor
    crops: Tensor
    scenes: list[GateScene]
    heatmaps: Tensor


def pose_targets(scene: GateScene, heatmap_hw: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """The person crop (3, H, W) in [0, 1] the pose model sees for this scene (the box the
    gate gives: the figure's pixels) and the 308 target heatmaps (K, h, w): a Gaussian at each
    keypoint, where UDP puts it (x_hm = x_in (w - 1) / (W_in - 1))."""
    crop = make_crop(scene.box.tolist(), HW)
    pixels = crop_people(scene.plate, [crop], HW)[0]
    in_input = image_to_input(scene.keypoints[None].double(), [crop], HW)[0]
    h, w = heatmap_hw
    x = in_input[:, 0] * (w - 1) / (HW[1] - 1)
    y = in_input[:, 1] * (h - 1) / (HW[0] - 1)
    gy = torch.arange(h, dtype=torch.float64)[None, :, None]
    gx = torch.arange(w, dtype=torch.float64)[None, None, :]
    d2 = (gx - x[:, None, None]) ** 2 + (gy - y[:, None, None]) ** 2
    return pixels, torch.exp(-d2 / (2 * HEATMAP_SIGMA**2)).float()


def scene_pool(seeds: Iterable[int], heatmap_hw: tuple[int, int]) -> list[tuple]:
    pool = []
    for seed in seeds:
        scene = make_scene(seed)
        crop, heatmaps = pose_targets(scene, heatmap_hw)
        pool.append((scene, crop, heatmaps))
    return pool


def batch_of(pool: list[tuple], indices: Tensor) -> Batch:
    picked = [pool[int(i)] for i in indices]
    plates = torch.stack([scene.plate for scene, _, _ in picked])
    crops = torch.stack([crop for _, crop, _ in picked])
    return Batch(
        plates=normalize(plates),
        crops=normalize(crops),
        scenes=[scene for scene, _, _ in picked],
        heatmaps=torch.stack([h for _, _, h in picked]),
    )


def stack(batch: Batch, field: str) -> Tensor:
    return torch.stack([getattr(scene, field) for scene in batch.scenes])


def dense_losses(models: dict[str, SapiensTaskModel], batch: Batch) -> dict[str, Tensor]:
    """Each dense Sapiens2 task's loss, on one pass of the shared backbone."""
    features = models[NORMAL].backbone(batch.plates)
    alpha = stack(batch, "alpha")[:, None]
    # The figure covers a quarter of a plate or so: its pixels count PERSON_WEIGHT times more.
    weight = 1.0 + (PERSON_WEIGHT - 1.0) * alpha
    weight = weight / weight.mean()
    losses = {}
    raw = models[NORMAL].decode_head(features)  # the unit target itself: the platform
    losses[NORMAL] = ((raw - stack(batch, "normals")).pow(2) * weight).mean()  # normalises
    points, scale = models[POINTMAP].decode_head(features)
    target = stack(batch, "points")
    metric = points / scale.view(-1, 1, 1, 1)
    relative = (metric - target).abs().sum(1, keepdim=True) / target[:, 2:]
    scale_error = (scale.log() - math.log(POINTMAP_SCALE)).pow(2).mean()
    losses[POINTMAP] = (relative * weight).mean() + scale_error
    albedo = models[ALBEDO].decode_head(features)
    # weighted up: copying the plate's colours through the backbone is the slowest to learn
    losses[ALBEDO] = 10.0 * ((albedo - stack(batch, "albedo")).pow(2) * weight).mean()
    matte = models[MATTING].decode_head(features)
    fg_error = (matte[:, :3] - stack(batch, "foreground")).abs() * alpha
    losses[MATTING] = ((matte[:, 3:] - alpha).abs() * weight).mean() + fg_error.mean()
    logits = models[SEG].decode_head(features)
    cross_entropy = F.cross_entropy(logits, stack(batch, "labels"), reduction="none")
    losses[SEG] = (cross_entropy * weight[:, 0]).mean()
    return losses


def pose_loss(model: SapiensTaskModel, batch: Batch) -> Tensor:
    """Where: each heatmap as a distribution over its pixels against the target's (a cross
    entropy, which finds the peaks in few steps where plain MSE sits at all-zero maps); and
    how high: MSE weighted towards the peaks, so that a peak's value (the keypoint's score,
    which must be above 0) comes out near 1."""
    maps = model(batch.crops)
    flat, target = maps.flatten(2), batch.heatmaps.flatten(2)
    where = -(F.log_softmax(flat, dim=-1) * target / target.sum(-1, keepdim=True)).sum(-1)
    height = ((flat - target) ** 2 * (1.0 + 20.0 * target)).mean()
    return 0.3 * where.mean() + 30.0 * height  # about the dense tasks' share of the backbone


def depth_target(scene: GateScene) -> Tensor:
    """v1 depth's target: depth over the person from 0 (nearest) to 1 (farthest), the
    background beyond, clipped at 2. The platform min-max normalises the raw output over the
    person, so any such scale serves; this one keeps the person's span near 1, as a model
    trained with a scale-invariant loss would, rather than a few hundredths of an offset."""
    person = scene.alpha >= 0.5
    near, far = scene.depth[person].min(), scene.depth[person].max()
    return ((scene.depth - near) / (far - near)).clamp(-0.5, 2.0)


def depth_loss(model: SapiensTaskModel, batch: Batch) -> Tensor:
    targets = torch.stack([depth_target(scene) for scene in batch.scenes])
    return (model(batch.plates)[:, 0] - targets).abs().mean()


def start_outputs(models: dict[str, SapiensTaskModel], depth: SapiensTaskModel) -> None:
    """Output biases at the targets' typical values, so that a few hundred steps are spent
    on the shape of the outputs rather than on their offset."""
    with torch.no_grad():
        models[NORMAL].decode_head.conv_normal.bias.copy_(torch.tensor([0.0, 0.0, -1.0]))
        models[ALBEDO].decode_head.conv_albedo.bias.fill_(0.5)
        pointmap = models[POINTMAP].decode_head
        pointmap.conv_pointmap.bias.copy_(torch.tensor([0.0, 0.0, 5.0 * POINTMAP_SCALE]))
        pointmap.scale_final_layer[-1].bias.fill_(POINTMAP_SCALE)
        depth.head_module.conv_seg.bias.fill_(0.8)


def start_seg(model: SapiensTaskModel, pool: list[tuple]) -> None:
    """The seg logits' biases at the classes' log frequencies in the training scenes."""
    labels = torch.cat([scene.labels.flatten() for scene, _, _ in pool])
    counts = torch.bincount(labels, minlength=model.decode_head.spec.out_channels).float()
    with torch.no_grad():
        model.decode_head.conv_seg.bias.copy_((counts / counts.sum()).clamp_min(1e-4).log())


def schedule(step: int, steps: int, warmup: int = 20) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def train(
    steps: int, batch_size: int, pool_size: int, seed: int, lr: float, log_every: int
) -> tuple[dict[str, SapiensTaskModel], SapiensTaskModel, dict[str, float]]:
    torch.manual_seed(seed)
    first = build_model("tiny", NORMAL, input_hw=HW, seed=seed)
    assert isinstance(first, SapiensTaskModel)
    models: dict[str, SapiensTaskModel] = {NORMAL: first}
    for task in SAPIENS2_TASKS[1:]:
        model = build_model("tiny", task, input_hw=HW, seed=seed)
        assert isinstance(model, SapiensTaskModel)
        model.backbone = first.backbone  # one backbone for every head
        models[task] = model
    depth = build_model("sapiens1_tiny", DEPTH, input_hw=HW, seed=seed)
    assert isinstance(depth, SapiensTaskModel)
    start_outputs(models, depth)
    heatmap_hw = (HW[0] // 4, HW[1] // 4)  # the pose head's output
    t0 = time.perf_counter()
    pool = scene_pool(TRAINING_SEEDS[:pool_size], heatmap_hw)
    print(f"{len(pool)} training scenes in {time.perf_counter() - t0:.1f} s")
    start_seg(models[SEG], pool)
    parameters = {id(p): p for m in (*models.values(), depth) for p in m.parameters()}
    backbones = {id(p) for m in (first, depth) for p in m.backbone.parameters()}
    groups = [
        {"params": [p for k, p in parameters.items() if k in backbones], "lr": lr},
        {"params": [p for k, p in parameters.items() if k not in backbones], "lr": 2.5 * lr},
    ]
    optimiser = torch.optim.AdamW(groups, weight_decay=0.01)
    lr_schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: schedule(s, steps))
    gen = torch.Generator().manual_seed(seed)
    for m in (*models.values(), depth):
        m.train()
    last: dict[str, float] = {}
    t0 = time.perf_counter()
    for step in range(steps):
        batch = batch_of(pool, torch.randint(len(pool), (batch_size,), generator=gen))
        losses = dense_losses(models, batch)
        losses[POSE] = pose_loss(models[POSE], batch)
        losses[DEPTH] = depth_loss(depth, batch)
        optimiser.zero_grad(set_to_none=True)
        sum(losses.values()).backward()
        nn.utils.clip_grad_norm_(parameters.values(), 1.0)
        optimiser.step()
        lr_schedule.step()
        last = {task: loss.item() for task, loss in losses.items()}
        if step % log_every == 0 or step == steps - 1:
            figures = " ".join(f"{task} {value:.4f}" for task, value in last.items())
            print(f"step {step:4d}  {time.perf_counter() - t0:6.1f} s  {figures}", flush=True)
    for m in (*models.values(), depth):
        m.eval()
    return models, depth, last


def save(models: dict[str, SapiensTaskModel], depth: SapiensTaskModel, out: Path) -> None:
    """Each model through `save_model` (the metadata a trained model has), as bf16; then the
    Sapiens2 files split into the shared backbone and one file per head."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        for task, model in {**models, DEPTH: depth}.items():
            whole = Path(scratch) / f"{task}.safetensors"
            save_model(model.to(torch.bfloat16), whole, trained=True)
            gate_models.store_model(whole, out, task)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--pool", type=int, default=len(TRAINING_SEEDS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--threads", type=int, default=1, help="1: reproducible bytes")
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--out", type=Path, default=gate_models.WEIGHTS_DIR)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    models, depth, losses = train(
        args.steps, args.batch, args.pool, args.seed, args.lr, args.log_every
    )
    save(models, depth, args.out)
    total = sum(f.stat().st_size for f in args.out.glob("*.safetensors"))
    print(f"saved to {args.out} ({total / 1e6:.2f} MB) in {time.perf_counter() - t0:.0f} s")
    print("final losses: " + ", ".join(f"{k} {v:.4f}" for k, v in losses.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
