"""The bf16 accuracy gate (tasks/precision_gate.py) and its toy models (tasks/gate_models.py):
the models' outputs follow the plate smoothly, fp32 against itself is exact, bf16 holds on this
CPU, a tight limit fails naming its metric, and a bad cache entry is measured again."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from sapiens.predictor import Predictor
from sapiens.safetensors_format import read_header
from tasks import precision_gate as gate
from tasks.gate_models import (
    GATE_TASKS,
    NOTE,
    WEIGHTS_DIR,
    gate_model_files,
    load_gate_models,
)
from tasks.precision_gate_scene import GATE_SEEDS, TRAINING_SEEDS, make_scene

CPU = torch.device("cpu")
DENSE = ("normal", "pointmap", "albedo", "matte", "seg", "depth")


@pytest.fixture(scope="module")
def predictor() -> Predictor:
    with gate_model_files() as files:
        models = load_gate_models(files, CPU, torch.float32)
    return Predictor(models, device=CPU, dtype=torch.float32, expected_tasks=GATE_TASKS)


@pytest.fixture(scope="module")
def bf16_figures() -> dict[str, float]:
    return gate.measure(CPU, torch.bfloat16)


def test_weights_are_small_trained_toys_in_bf16() -> None:
    files = sorted(WEIGHTS_DIR.glob("*.safetensors"))
    assert sum(f.stat().st_size for f in files) < 4_000_000
    assert (WEIGHTS_DIR / "README.md").is_file()
    for path in files:
        _shapes, dtypes, metadata = read_header(path)
        assert metadata["note"] == NOTE
        assert set(dtypes.values()) == {"BF16"}, path.name
        if "task" in metadata:
            assert metadata["untrained"] == "false"


def test_gate_plates_are_not_training_plates() -> None:
    assert not set(GATE_SEEDS) & set(TRAINING_SEEDS)


def _dense(predictor: Predictor, plates: torch.Tensor) -> dict[str, torch.Tensor]:
    return {name: predictor.predict_batch(plates, name)[name] for name in DENSE}


def test_outputs_follow_the_plate_smoothly(predictor: Predictor) -> None:
    """Two plates give clearly different outputs; a change to one below an 8-bit step
    (a ripple of 1/255) changes them far less: they vary with the input, and smoothly."""
    first, second = (make_scene(seed).plate for seed in GATE_SEEDS)
    rows, cols = torch.meshgrid(
        torch.arange(first.shape[1]), torch.arange(first.shape[2]), indexing="ij"
    )
    nudged = (first + torch.sin(cols / 7.0 + rows / 11.0) / 255.0).clamp(0.0, 1.0)
    out = _dense(predictor, torch.stack([first, second, nudged]))
    for name, values in out.items():
        between = (values[0] - values[1]).abs().mean()
        small = (values[0] - values[2]).abs().mean()
        assert between > 5e-3, f"{name}: about the same output for two different plates"
        assert small < 0.1 * between, f"{name}: a tiny change moved it {small:.4f} ({between:.4f})"


def test_outputs_mean_something(predictor: Predictor) -> None:
    """Far better than a constant against the figure's own layers: the matte and the seg
    labels find it, the normals turn with its surface, pose lands on its keypoints."""
    for seed in GATE_SEEDS:
        scene = make_scene(seed)
        out = _dense(predictor, scene.plate[None])
        person = scene.alpha >= 0.5
        matte = out["matte"][0, 0] >= 0.5
        assert (matte & person).sum() / (matte | person).sum() > 0.55  # intersection / union
        found = out["seg"][0].argmax(0) > 0  # not background
        assert (found == person).float().mean() > 0.85
        # normals: against the best constant (the figure's mean normal) on the figure
        mean = (scene.normals * scene.alpha).sum((1, 2))
        constant = (scene.normals * (mean / mean.norm())[:, None, None]).sum(0)[person].mean()
        predicted = (out["normal"][0] * scene.normals).sum(0)[person].mean()
        assert predicted > 0.9 and predicted > constant + 0.2
        pose = predictor.predict_pose(scene.plate, scene.box[None].numpy(), channels_first=True)
        distance = (torch.from_numpy(pose.keypoints[0]) - scene.keypoints).norm(dim=1)
        assert distance.median() < 0.05 * (scene.box[3] - scene.box[1])


def test_fp32_against_itself_is_exact() -> None:
    figures = gate.measure(CPU, torch.float32)
    for metric, value in figures.items():
        assert value == (1.0 if metric == "seg.agreement" else 0.0), metric
    assert gate.check(figures)[0]


def test_bf16_holds_on_this_cpu(bf16_figures: dict[str, float]) -> None:
    holds, reason = gate.check(bf16_figures)
    assert holds, reason
    # and it is measured, not zero: bf16 does differ from fp32
    assert bf16_figures["normal.angle_mean"] > 0
    assert bf16_figures["seg.coverage_mean"] > 0


def test_a_tight_limit_fails_naming_its_metric(
    bf16_figures: dict[str, float], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SVFX_HOME", str(tmp_path))
    monkeypatch.delenv("SVFX_PRECISION_GATE_CACHE", raising=False)  # the suite's shared one
    monkeypatch.setattr(gate, "measure", lambda device, dtype: dict(bf16_figures))
    tight = gate.with_bound(gate.LIMITS, "matte.error_p99", 0.0)
    verdict = gate.gate_verdict(CPU, limits=tight)
    assert not verdict.holds
    assert verdict.reason.startswith("bf16: matte error, p99 ")
    assert "is above the limit 0" in verdict.reason
    assert "\n" not in verdict.reason
    loose = gate.gate_verdict(CPU)  # the same figures, from the cache, the declared limits
    assert loose.holds and loose.cached
    assert loose.figures == verdict.figures
    agreement = gate.with_bound(gate.LIMITS, "seg.agreement", 1.5)
    assert "seg label agreement" in gate.gate_verdict(CPU, limits=agreement).reason
    with pytest.raises(KeyError, match="no limit on 'nope'"):
        gate.with_bound(gate.LIMITS, "nope", 1.0)


BAD_ENTRIES = {
    "not a dict": "figures",
    "no figures": {"seconds": 1.0},
    "figures not a dict": {"figures": 0.1},
    "a metric missing": {"figures": {"normal.angle_mean": 0.1}},
    "figures as text": {"figures": {metric: "0.1" for metric in gate.METRICS}},
    "figures as booleans": {"figures": dict.fromkeys(gate.METRICS, True)},
}


BAD_FILES = {"half a file": '{"figures": ', "a list": "[1, 2]", "a number": "5"}


@pytest.mark.parametrize("entry", [*BAD_ENTRIES, *BAD_FILES])
def test_a_bad_cache_entry_is_measured_again(
    entry: str,
    bf16_figures: dict[str, float],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SVFX_HOME", str(tmp_path))
    monkeypatch.delenv("SVFX_PRECISION_GATE_CACHE", raising=False)  # the suite's shared one
    calls = []

    def fake_measure(device: torch.device, dtype: torch.dtype) -> dict[str, float]:
        calls.append(dtype)
        return dict(bf16_figures)

    monkeypatch.setattr(gate, "measure", fake_measure)
    cache_file = tmp_path / gate.GATE_CACHE.filename
    if entry in BAD_ENTRIES:
        cache_file.write_text(json.dumps({gate.gate_key(CPU, torch.bfloat16): BAD_ENTRIES[entry]}))
    else:
        cache_file.write_text(BAD_FILES[entry])
    verdict = gate.gate_verdict(CPU)
    assert calls == [torch.bfloat16] and not verdict.cached and verdict.holds
    again = gate.gate_verdict(CPU)
    assert calls == [torch.bfloat16] and again.cached
    assert again.figures == pytest.approx(bf16_figures)


def test_a_failing_nan_is_kept_and_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dtype that gives NaN fails the gate, from the cache too (JSON keeps the NaN)."""
    monkeypatch.setenv("SVFX_HOME", str(tmp_path))
    monkeypatch.delenv("SVFX_PRECISION_GATE_CACHE", raising=False)  # the suite's shared one
    figures = {metric: math.nan for metric in gate.METRICS}
    monkeypatch.setattr(gate, "measure", lambda device, dtype: dict(figures))
    assert not gate.gate_verdict(CPU).holds
    cached = gate.gate_verdict(CPU)
    assert cached.cached and not cached.holds
    assert cached.reason == "bf16: normal angle, mean nan deg is above the limit 1 deg"


def test_the_key_names_the_machine_and_torch() -> None:
    key = gate.gate_key(CPU, torch.bfloat16)
    assert torch.__version__ in key and "bf16" in key
    assert gate.cpu_identity() in key
    assert gate.gate_key(CPU, torch.float16) != key
    assert gate.gate_verdict(CPU, torch.float32).holds  # fp32 is the reference: nothing to do
