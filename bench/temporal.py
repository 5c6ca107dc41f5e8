"""Temporal stabilisation (tasks/stabilise/: the stabiliser, the keypoint smoother) on a synthetic
shot with ground truth (bench/temporal_scene.py): per pass, the error against the truth on the
person and at motion/occlusion boundaries, per-frame vs stabilised; temporal QC's flicker score
(median and worst frame) of both; a static shot, a shot with a cut, core-seconds per frame of
flow + stabilisation, and peak memory at two shot lengths.

    python -m bench.temporal                     # 384x216, 48 frames: a few minutes on 2 cores
    python -m bench.temporal --json
    python -m bench.temporal --size 4096x2160 --frames 8 --cost-only   # the cost per 4K frame
    python -m bench.temporal --flow-check        # composed vs direct flow to frames 2 away

Goals (issue 24): stabilised error on the person at most 0.6 of per-frame; at boundaries at
most 1.1; the worst frame's flicker score falls at least 3x; at most 2 core-s per 4096x2160
frame; peak memory flat in shot length. Core-seconds are ``time.process_time`` (every thread of
the process) around the stabiliser's calls alone, not the synthetic shot's making. It runs with
the allocator settings of the platform's workers (``flows.allocator``), as ``bench.io`` does.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from bench.common import as_a_worker_runs
from bench.temporal_scene import PASS_KINDS, Scene, Truth, model, person_order, render
from tasks.plate_flow import DEFAULT_FLOW, FlowSettings, flow_image, pair_motion, reduced_size
from tasks.stabilise.settings import DEFAULT_FUSION, FusionSettings
from tasks.stabilise.stabiliser import StabilisedFrame, TemporalStabiliser, compose, sampling_grid
from tasks.temporal_qc import flicker, proxies_of, qc_passes

_LUMA = np.array([0.2126, 0.7152, 0.0722], dtype=np.float32)
UNITS = {"normal": "deg", "pointmap": "rel", "depth": "abs", "albedo": "abs", "matte": "abs",
         "seg": "mislabel", "pose": "px"}  # fmt: skip


def errors(name: str, values: np.ndarray, truth: Truth) -> np.ndarray:
    """(H, W) per-pixel error of a pass against the truth, in the units of ``UNITS``."""
    t = truth.passes[name]
    if name == "normal":
        cosine = np.clip((values * t).sum(axis=0), -1.0, 1.0)
        return np.degrees(np.arccos(cosine))
    if name == "pointmap":
        return np.linalg.norm(values - t, axis=0) / np.abs(t[2])
    if name == "seg":
        return (values.argmax(axis=0) != truth.labels).astype(np.float32)
    return np.abs(values - t).mean(axis=0)


def zarr_layout(passes: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Passes as the Zarr store holds them (what temporal QC reads)."""
    out = {}
    for name, values in passes.items():
        if name == "seg":
            out[name] = values.argmax(axis=0).astype(np.uint8)
        elif values.shape[0] == 1:
            out[name] = values[0]
        else:
            out[name] = values.transpose(1, 2, 0)
    return out


@dataclass
class _Sums:
    total: float = 0.0
    count: int = 0

    def add(self, values: np.ndarray, region: np.ndarray) -> None:
        picked = values[region]
        self.total += float(picked.sum())
        self.count += int(picked.size)

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else float("nan")


@dataclass
class Version:
    """One version's figures over a shot."""

    person: dict[str, _Sums] = field(default_factory=dict)
    boundary: dict[str, _Sums] = field(default_factory=dict)
    proxies: list[Any] = field(default_factory=list)

    def add(self, frame: int, passes: Mapping[str, np.ndarray], truth: Truth) -> None:
        for name, values in passes.items():
            error = errors(name, values, truth)
            self.person.setdefault(name, _Sums()).add(error, truth.person)
            self.boundary.setdefault(name, _Sums()).add(error, truth.boundary)
        luma = truth.plate @ _LUMA
        self.proxies.append(proxies_of(frame, luma, zarr_layout(passes)))


@dataclass
class ShotRun:
    frames: list[int]
    per_frame: Version
    stabilised: Version
    outputs: dict[int, dict[str, np.ndarray]]  # kept only when asked (small shots)
    pose_per_frame: _Sums
    pose_smoothed: _Sums
    core_seconds: float
    wall_seconds: float
    pose_core_seconds: float
    forward_none: list[int]
    plate_size_share: float  # of the fused pixels, the share fused at the plate's size


def run_shot(
    scene: Scene,
    settings: FusionSettings = DEFAULT_FUSION,
    flow: FlowSettings = DEFAULT_FLOW,
    device: str = "cpu",
    *,
    noisy: bool = True,
    metrics: bool = True,
    keep: bool = False,
    indices: range | None = None,
    pose: bool = True,
) -> ShotRun:
    """Stream a synthetic shot through the stabiliser (and the keypoint smoother) and score
    it. ``noisy``: push the model's passes (else the truth); ``keep``: keep every output
    (small shots only); ``indices``: the frame indices pushed (default all); ``pose``: smooth
    the keypoints too (the smoother needs SciPy, which the GPU kit does not carry)."""
    stabiliser = TemporalStabiliser(PASS_KINDS, (scene.height, scene.width), device, settings, flow)
    smoother = None
    if pose:
        from tasks.stabilise.smoothing import KeypointSmoother

        smoother = KeypointSmoother()
    per_frame, stabilised = Version(), Version()
    pose_pf, pose_smooth = _Sums(), _Sums()
    truths: dict[int, Truth] = {}
    outputs: dict[int, dict[str, np.ndarray]] = {}
    core = wall = pose_core = 0.0
    forward_none: list[int] = []
    frames = []

    def take(results: list[StabilisedFrame]) -> None:
        for result in results:
            truth = truths.pop(result.frame)
            passes = {n: v.cpu().numpy() for n, v in result.passes.items()}
            if result.forward is None:
                forward_none.append(result.frame)
            if metrics:
                stabilised.add(result.frame, passes, truth)
            if keep:
                outputs[result.frame] = passes

    def take_pose(results: list[tuple[int, np.ndarray]], answers: dict[int, np.ndarray]) -> None:
        for frame, people in results:
            _pose_error(pose_smooth, people, answers.pop(frame))

    answers: dict[int, np.ndarray] = {}
    for index in indices if indices is not None else range(scene.frames):
        frame = scene.first_frame + index
        frames.append(frame)
        truth = render(scene, index)
        if noisy:
            passes, people = model(scene, index, truth)
        else:
            passes = truth.passes
            people = truth.keypoints[person_order(scene, index)]
        answers[frame] = truth.keypoints[person_order(scene, index)]
        if metrics:
            per_frame.add(frame, passes, truth)
            _pose_error(pose_pf, people, answers[frame])
        truths[frame] = truth
        tensors = {n: torch.from_numpy(v).to(device) for n, v in passes.items()}
        c0, w0 = time.process_time(), time.perf_counter()
        results = stabiliser.push(frame, truth.plate, tensors)
        _sync(device)
        core += time.process_time() - c0
        wall += time.perf_counter() - w0
        take(results)
        if smoother is not None:
            c0 = time.process_time()
            smoothed = smoother.push(frame, people)
            pose_core += time.process_time() - c0
            take_pose(smoothed, answers)
    c0, w0 = time.process_time(), time.perf_counter()
    results = stabiliser.flush()
    _sync(device)
    core += time.process_time() - c0
    wall += time.perf_counter() - w0
    take(results)
    if smoother is not None:
        take_pose(smoother.flush(), answers)
    return ShotRun(
        frames, per_frame, stabilised, outputs, pose_pf, pose_smooth, core, wall, pose_core,
        forward_none, stabiliser.pixels_at_plate_size / max(1, stabiliser.pixels_fused),
    )  # fmt: skip


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _pose_error(sums: _Sums, people: np.ndarray, truth: np.ndarray) -> None:
    valid = np.isfinite(truth[..., 0]) & np.isfinite(people[..., 0])
    distance = np.hypot(*(people[..., :2] - truth[..., :2]).transpose(2, 0, 1))
    sums.add(np.where(valid, distance, 0.0), valid)


def flicker_figures(version: Version, frames: list[int]) -> dict[str, dict[str, float]]:
    """Temporal QC of a version: its median r(t) (the pass's change per plate change, before
    the shot's median divides it: comparable between versions), its worst frame's r(t) on that
    same scale (``worst_r``: what the issue's "worst frame falls 3x" compares), and the worst
    frame's score as QC shows it (``worst``: divided by the version's own median, so it says
    how far the worst frame stands out of its own shot, not how much it flickers)."""
    passes = qc_passes(list(PASS_KINDS))
    scores = flicker(frames, version.proxies, passes)
    raw = flicker(frames, version.proxies, passes, normalised=False)
    out = {}
    for name, by_frame in scores.items():
        worst = max(by_frame, key=by_frame.__getitem__)
        out[name] = {
            "median_ratio": float(np.median(list(raw[name].values()))),
            "worst_r": float(max(raw[name].values())),
            "worst": float(by_frame[worst]),
            "worst_frame": worst,
        }
    return out


def quality(run: ShotRun) -> dict[str, dict[str, float]]:
    pf_flicker = flicker_figures(run.per_frame, run.frames)
    st_flicker = flicker_figures(run.stabilised, run.frames)
    table = {}
    for name in PASS_KINDS:
        row = {
            "person_per_frame": run.per_frame.person[name].mean,
            "person_stabilised": run.stabilised.person[name].mean,
            "boundary_per_frame": run.per_frame.boundary[name].mean,
            "boundary_stabilised": run.stabilised.boundary[name].mean,
        }
        row["person_ratio"] = row["person_stabilised"] / row["person_per_frame"]
        row["boundary_ratio"] = row["boundary_stabilised"] / row["boundary_per_frame"]
        if name in pf_flicker:
            row["flicker_median_r_per_frame"] = pf_flicker[name]["median_ratio"]
            row["flicker_median_r_stabilised"] = st_flicker[name]["median_ratio"]
            row["flicker_worst_frame_per_frame"] = pf_flicker[name]["worst_frame"]
            row["flicker_worst_frame_stabilised"] = st_flicker[name]["worst_frame"]
            row["flicker_worst_per_frame"] = pf_flicker[name]["worst"]
            row["flicker_worst_stabilised"] = st_flicker[name]["worst"]
            row["flicker_worst_fall"] = pf_flicker[name]["worst"] / st_flicker[name]["worst"]
            row["flicker_worst_r_per_frame"] = pf_flicker[name]["worst_r"]
            row["flicker_worst_r_stabilised"] = st_flicker[name]["worst_r"]
            row["flicker_worst_r_fall"] = pf_flicker[name]["worst_r"] / st_flicker[name]["worst_r"]
        table[name] = row
    table["pose"] = {
        "person_per_frame": run.pose_per_frame.mean,
        "person_stabilised": run.pose_smoothed.mean,
        "person_ratio": run.pose_smoothed.mean / run.pose_per_frame.mean,
    }
    return table


def static_check(scene: Scene, settings: FusionSettings, device: str) -> dict[str, float]:
    """A shot that does not move: the truth pushed comes back unchanged (mean and 99.9th
    percentile of the change per pass: the plate's grain moves the flow by hundredths of a
    pixel, which shows only across sharp edges), and the model's passes gain as they would
    with a perfect flow (error ratio per pass)."""
    still = replace(scene, static=True)
    clean = run_shot(still, settings, device=device, noisy=False, keep=True)
    out: dict[str, float] = {}
    changes: dict[str, list[np.ndarray]] = {}
    for frame, passes in clean.outputs.items():
        truth = render(still, frame - still.first_frame)
        for name, values in passes.items():
            changes.setdefault(name, []).append(np.abs(values - truth.passes[name]).ravel())
    for name, values in changes.items():
        joined = np.concatenate(values)
        out[f"clean_mean_change_{name}"] = float(joined.mean())
        out[f"clean_p999_change_{name}"] = float(np.quantile(joined, 0.999))
    noisy = quality(run_shot(still, settings, device=device))
    for name, row in noisy.items():
        out[f"noisy_person_ratio_{name}"] = row["person_ratio"]
    return out


def cut_check(scene: Scene, settings: FusionSettings, device: str) -> dict[str, Any]:
    """A shot with a cut halfway: the frames each side come out exactly as when each side is
    stabilised alone (nothing blended across), and the cut frame has no forward flow."""
    cut = replace(scene, cut_at=scene.frames // 2)
    whole = run_shot(cut, settings, device=device, metrics=False, keep=True)
    before = run_shot(cut, settings, device=device, metrics=False, keep=True,
                      indices=range(cut.cut_at or 0))  # fmt: skip
    after = run_shot(cut, settings, device=device, metrics=False, keep=True,
                     indices=range(cut.cut_at or 0, cut.frames))  # fmt: skip
    alone = {**before.outputs, **after.outputs}
    difference = max(
        float(np.abs(whole.outputs[f][n] - alone[f][n]).max())
        for f in whole.outputs
        for n in whole.outputs[f]
    )
    last_before = cut.first_frame + (cut.cut_at or 0) - 1
    return {
        "cut_after_frame": last_before,
        "detected": last_before in whole.forward_none,
        "max_difference_vs_each_side_alone": difference,
    }


def memory_probe(scene: Scene, settings: FusionSettings, device: str) -> int:
    """Peak resident memory (bytes) of this process after streaming the shot."""
    run_shot(scene, settings, device=device, metrics=False)
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return -1


def memory_check(scene: Scene, settings: FusionSettings, device: str) -> dict[str, float]:
    out = {}
    for frames in (scene.frames, 2 * scene.frames):
        command = [sys.executable, "-m", "bench.temporal", "--memory-probe",
                   "--size", f"{scene.width}x{scene.height}", "--frames", str(frames),
                   "--radius", str(settings.radius), "--fusion-side", str(settings.max_side),
                   "--device", device,
                   "--threads", str(torch.get_num_threads())]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        out[f"peak_rss_mib_{frames}_frames"] = int(done.stdout.split()[-1]) / 2**20
    return out


def flow_check(scene: Scene, flow: FlowSettings) -> dict[str, float]:
    """Flow to the frame two away: direct DIS vs the two adjacent flows composed. The truth's
    normals of frame t+2 warped to frame t, against frame t's, on the person where the flow is
    confident (> 0.5): mean angle, the share of the person confident, core-s per frame."""
    sums = {"direct": [0.0, 0, 0], "composed": [0.0, 0, 0]}
    cost = {"direct": 0.0, "composed": 0.0}
    truths = [render(scene, i) for i in range(0, min(scene.frames, 24))]
    images = [flow_image(t.plate, flow) for t in truths]
    hw = (scene.height, scene.width)
    from tasks.plate_flow import confidence_to_plate, to_plate

    adjacent = []
    c0 = time.process_time()
    for a, b in itertools.pairwise(images):
        adjacent.append(pair_motion(a, b, flow))
    cost["adjacent"] = (time.process_time() - c0) / len(adjacent)
    for i in range(len(truths) - 2):
        c0 = time.process_time()
        direct = pair_motion(images[i], images[i + 2], flow)
        cost["direct"] += time.process_time() - c0
        c0 = time.process_time()
        first, then = adjacent[i], adjacent[i + 1]
        composed = compose(
            *(
                torch.from_numpy(x)
                for x in (first.forward, first.confidence_a, then.forward, then.confidence_a)
            )
        )
        cost["composed"] += time.process_time() - c0
        for name, (vectors, confidence) in {
            "direct": (torch.from_numpy(direct.forward), torch.from_numpy(direct.confidence_a)),
            "composed": composed,
        }.items():
            grid = sampling_grid(to_plate(vectors, hw, "cpu"))
            there = torch.from_numpy(truths[i + 2].passes["normal"])[None]
            warped = torch.nn.functional.grid_sample(
                there, grid, mode="bilinear", padding_mode="border", align_corners=True
            )[0].numpy()
            warped /= np.linalg.norm(warped, axis=0, keepdims=True)
            angle = np.degrees(np.arccos(np.clip((warped * truths[i].passes["normal"]).sum(0),
                                                 -1, 1)))  # fmt: skip
            trusted = confidence_to_plate(confidence, hw, "cpu").numpy() > 0.5
            region = truths[i].person & ~truths[i].boundary
            picked = region & trusted
            sums[name][0] += float(angle[picked].sum())
            sums[name][1] += int(picked.sum())
            sums[name][2] += int(region.sum())
    pairs = len(truths) - 2
    out = {}
    for name, (total, count, region) in sums.items():
        out[f"{name}_angle_deg"] = total / max(count, 1)
        out[f"{name}_confident_share"] = count / max(region, 1)
        out[f"{name}_core_s_per_pair"] = cost[name] / pairs
    out["adjacent_pair_core_s"] = cost["adjacent"]
    return out


def _fusion_sizes(plate_hw: tuple[int, int], settings: FusionSettings) -> str:
    """``WxH`` the passes are fused at, and the class probabilities' where that differs."""

    def size(side: int) -> str:
        return "x".join(map(str, reduced_size(plate_hw, side)[::-1]))

    others, labels = size(settings.max_side), size(settings.side("labels"))
    return others if labels == others else f"{others} (seg {labels})"


def _table(report: dict[str, Any]) -> str:
    lines = [f"shot {report['size']}, {report['frames']} frames, radius {report['radius']}, "
             f"fused at {report['fusion_size']}, "
             f"{'direct' if report['direct_flow'] else 'composed'} flow beyond 1 frame, "
             f"device {report['device']}, {report['threads']} torch thread(s)"]  # fmt: skip
    if "quality" in report:
        lines.append(
            f"{'pass':9s} {'unit':8s} {'person pf':>10s} {'stab':>8s} {'ratio':>6s}  "
            f"{'bound pf':>9s} {'stab':>8s} {'ratio':>6s}  {'median r pf/st':>17s}  "
            f"{'worst pf/st':>13s} {'fall':>5s}  {'worst r pf/st':>15s} {'fall':>5s}"
        )
        for name, row in report["quality"].items():
            line = (
                f"{name:9s} {UNITS[name]:8s} {row['person_per_frame']:10.4f} "
                f"{row['person_stabilised']:8.4f} {row['person_ratio']:6.2f}"
            )
            if "boundary_ratio" in row:
                line += (
                    f"  {row['boundary_per_frame']:9.4f} {row['boundary_stabilised']:8.4f} "
                    f"{row['boundary_ratio']:6.2f}"
                )
            if "flicker_worst_fall" in row:
                pf, st = row["flicker_median_r_per_frame"], row["flicker_median_r_stabilised"]
                line += f"  {pf:8.2f} /{st:7.2f}"
                pf, st = row["flicker_worst_per_frame"], row["flicker_worst_stabilised"]
                line += f"  {pf:6.2f} /{st:5.2f} {row['flicker_worst_fall']:5.1f}"
                pf, st = row["flicker_worst_r_per_frame"], row["flicker_worst_r_stabilised"]
                line += f"  {pf:7.2f} /{st:6.2f} {row['flicker_worst_r_fall']:5.1f}"
            lines.append(line)
        lines.append(
            "goals: person ratio <= 0.6, boundary ratio <= 1.1, worst-frame fall >= 3 (worst r: "
            "the worst frame's r(t) on the scale of the median; worst: as QC shows it, over "
            "its own version's median)"
        )
    for key in ("static", "cut", "memory", "flow_check"):
        if key in report:
            lines.append(f"{key}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in report[key].items()))
    lines.append(
        f"cost: {report['core_s_per_frame']:.3f} core-s per {report['size']} frame "
        f"(flow + every pass), {report['wall_s_per_frame']:.3f} s wall, "
        f"{report['plate_size_share']:.1%} of pixels fused at the plate's size; pose "
        f"{report['pose_core_s_per_frame'] * 1000:.2f} core-ms per frame"
    )
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="384x216", help="WxH of the synthetic plate")
    parser.add_argument("--frames", type=int, default=48)
    parser.add_argument("--radius", type=int, default=DEFAULT_FUSION.radius)
    parser.add_argument(
        "--fusion-side",
        type=int,
        default=DEFAULT_FUSION.max_side,
        help="the long side the fusion runs at (default %(default)s: a 4096x2160 plate is fused "
        "at 1024x540 and the correction upsampled; a smaller plate at its own size). The 4K "
        "reduction on a shot the bench can score: --size 1536x864 --fusion-side 384",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: core-seconds are the figure, and on a shared 2-core "
        "machine a second intra-op thread spins for its share and multiplies them)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--cost-only", action="store_true", help="only the timing")
    parser.add_argument("--flow-check", action="store_true", help="composed vs direct flow")
    parser.add_argument(
        "--direct-flow", action="store_true", help="DIS to frames 2+ away, not composed"
    )
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument(
        "--skip-checks",
        action="store_true",
        help="no static-shot and cut checks (they keep every frame's passes: some 10 GB at "
        "1536x864)",
    )
    parser.add_argument(
        "--default-allocator",
        action="store_true",
        help="glibc's default malloc settings, not the ones the platform's workers run with "
        "(flows.allocator: glibc's kept blocks and torch's transparent huge pages)",
    )
    parser.add_argument("--memory-probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.fusion_side < 1:
        parser.error(f"--fusion-side must be at least 1, got {args.fusion_side}")
    as_a_worker_runs("bench.temporal", args.default_allocator, argv)
    width, height = (int(v) for v in args.size.lower().split("x"))
    scene = Scene(width, height, args.frames)
    settings = replace(
        DEFAULT_FUSION,
        radius=args.radius,
        direct_flow=args.direct_flow,
        max_side=args.fusion_side,
    )
    torch.set_grad_enabled(False)
    torch.set_num_threads(args.threads)
    if args.memory_probe:
        print(memory_probe(scene, settings, args.device))
        return
    run = run_shot(scene, settings, device=args.device, metrics=not args.cost_only)
    report: dict[str, Any] = {
        "size": f"{width}x{height}",
        "frames": args.frames,
        "radius": args.radius,
        "fusion_size": _fusion_sizes((height, width), settings),
        "direct_flow": args.direct_flow,
        "device": args.device,
        "threads": args.threads,
        "core_s_per_frame": run.core_seconds / args.frames,
        "wall_s_per_frame": run.wall_seconds / args.frames,
        "pose_core_s_per_frame": run.pose_core_seconds / args.frames,
        "plate_size_share": run.plate_size_share,
    }
    if not args.cost_only:
        report["quality"] = quality(run)
        if not args.skip_checks:
            report["static"] = static_check(scene, settings, args.device)
            report["cut"] = cut_check(scene, settings, args.device)
        if not args.skip_memory:
            report["memory"] = memory_check(scene, settings, args.device)
    if args.flow_check:
        report["flow_check"] = flow_check(scene, DEFAULT_FLOW)
    print(json.dumps(report, indent=2, default=_json) if args.json else _table(report))


def _json(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


if __name__ == "__main__":
    main()
