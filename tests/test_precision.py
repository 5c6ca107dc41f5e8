"""The precision a worker's models run in: what ``--precision`` becomes on a CPU and why."""

from __future__ import annotations

import platform
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tasks import precision

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _fresh_choices():
    precision._choose.cache_clear()
    yield
    precision._choose.cache_clear()


def _cpu(monkeypatch: pytest.MonkeyPatch, instructions: tuple[str, ...], holds: bool = True):
    monkeypatch.setattr(precision, "cpu_bf16_instructions", lambda: instructions)
    monkeypatch.setattr(precision, "cpu_name", lambda: "Test CPU")
    reason = "held" if holds else "normal mean angle 3.1 deg > limit 0.5"
    asked = []

    def verdict(device):
        asked.append(device)
        return SimpleNamespace(holds=holds, reason=reason)

    monkeypatch.setattr(precision, "_gate_verdict", verdict)
    return asked


def test_auto_is_bf16_on_a_cpu_with_bf16_instructions_where_the_gate_holds(monkeypatch):
    asked = _cpu(monkeypatch, ("AMX-BF16", "AVX512-BF16"))
    choice = precision.choose_precision("auto", CPU)
    assert choice.dtype == torch.bfloat16
    assert "AMX-BF16" in choice.reason and "gate held" in choice.reason
    assert asked == [CPU]
    assert choice.line().startswith("precision bfloat16 (auto asked)")


def test_auto_falls_back_to_fp32_when_the_gate_fails(monkeypatch):
    _cpu(monkeypatch, ("AVX512-BF16",), holds=False)
    choice = precision.choose_precision("auto", CPU)
    assert choice.dtype == torch.float32
    assert "gate failed" in choice.reason and "normal mean angle" in choice.reason


def test_auto_is_fp32_without_bf16_instructions_and_never_runs_the_gate(monkeypatch):
    asked = _cpu(monkeypatch, ())
    choice = precision.choose_precision("auto", CPU)
    assert choice.dtype == torch.float32
    assert "no bf16 instructions" in choice.reason
    assert asked == []


def test_bf16_asked_on_a_cpu_without_it_runs_fp32_and_says_why(monkeypatch):
    _cpu(monkeypatch, ())
    choice = precision.choose_precision("bf16", CPU)
    assert choice.dtype == torch.float32
    assert "bf16 asked for" in choice.reason and "Test CPU" in choice.reason


def test_bf16_asked_by_name_skips_the_gate(monkeypatch):
    asked = _cpu(monkeypatch, ("AVX512-BF16",), holds=False)
    choice = precision.choose_precision("bf16", CPU)
    assert choice.dtype == torch.bfloat16 and asked == []


@pytest.mark.parametrize(("instructions", "holds", "dtype"), [
    (("AMX-BF16",), True, torch.bfloat16),
    (("AMX-BF16",), False, torch.float32),
    ((), True, torch.float32),
])  # fmt: skip
def test_fp16_on_a_cpu_runs_as_auto(monkeypatch, instructions, holds, dtype):
    _cpu(monkeypatch, instructions, holds)
    choice = precision.choose_precision("fp16", CPU)
    assert choice.dtype == dtype
    assert choice.reason.startswith("fp16 asked for on a CPU")


def test_fp32_and_cuda_choices_need_no_cpu_facts(monkeypatch):
    asked = _cpu(monkeypatch, ("AMX-BF16",))
    assert precision.choose_precision("fp32", CPU).dtype == torch.float32
    cuda = torch.device("cuda")
    assert precision.choose_precision("auto", cuda).dtype == torch.bfloat16
    assert precision.choose_precision("fp16", cuda).dtype == torch.float16
    assert asked == []


@pytest.mark.skipif(
    platform.machine() != "x86_64" or not Path("/proc/cpuinfo").exists(),
    reason="the kernel's CPU flags are read from /proc/cpuinfo on x86_64 Linux",
)
def test_this_machines_instructions_are_the_kernels_cpu_flags():
    flags = {
        flag
        for line in Path("/proc/cpuinfo").read_text().splitlines()
        if line.startswith("flags")
        for flag in line.split(":", 1)[1].split()
    }
    found = precision.cpu_bf16_instructions()
    assert ("AVX512-BF16" in found) == ("avx512_bf16" in flags)
    assert ("AMX-BF16" in found) == ("amx_bf16" in flags)
    assert precision.cpu_name() not in ("", "x86_64")


def test_auto_is_fp32_when_the_gate_cannot_run(monkeypatch):
    _cpu(monkeypatch, ("AMX-BF16",))

    def broken(_device):
        raise FileNotFoundError("tasks/precision_gate_weights/backbone.safetensors")

    monkeypatch.setattr(precision, "_gate_verdict", broken)
    choice = precision.choose_precision("auto", CPU)
    assert choice.dtype == torch.float32
    assert "could not run" in choice.reason and "backbone.safetensors" in choice.reason


def test_auto_on_this_cpu_goes_through_the_real_gate(tmp_path, monkeypatch):
    """No stand-ins: this machine's instructions and the gate's own models and limits."""
    monkeypatch.setenv("SVFX_PRECISION_GATE_CACHE", str(tmp_path / "gate.json"))
    choice = precision.choose_precision("auto", CPU)
    if not precision.cpu_bf16_instructions():
        assert choice.dtype == torch.float32 and "no bf16 instructions" in choice.reason
        return
    assert "accuracy gate" in choice.reason
    assert (tmp_path / "gate.json").is_file()  # measured once, kept for the machine
