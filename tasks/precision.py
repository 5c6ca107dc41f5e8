"""Which precision a worker's models run in, and why (``--precision``).

``auto``: bf16 on CUDA (tensor cores). On a CPU, bf16 where the CPU does bf16 in hardware
(AMX-BF16: Intel's server CPUs since Sapphire Rapids; AVX512-BF16: Intel since Cooper Lake,
AMD since Zen 4; BF16 on Arm since v8.6) and the bf16 accuracy gate (``tasks.precision_gate``:
bf16 against fp32 on the same weights and plates, every pass) holds on this CPU; fp32
elsewhere.
Without those instructions bf16 is emulated and slower than fp32, so it is never chosen.

Asked for by name on a CPU, a precision the CPU cannot do well is not run as asked; the
worker says what it runs instead and why, and records that in every output's provenance
(a farm mixes nodes: the machine that submits cannot know which CPU a chunk lands on, and a
refusal there would fail the shot's frames one node at a time):

- ``bf16`` on a CPU without bf16 instructions runs in fp32;
- ``fp16`` on a CPU runs as ``auto`` would (bf16 where it holds, else fp32): CPUs do fp16
  arithmetic in hardware only with AMX-FP16 or AVX512-FP16, whose kernels torch does not use
  for these models' layers, and fp16's range (65,504) is narrower than the bf16 the models
  were trained in.

``bf16`` on a CPU with bf16 instructions runs in bf16 without the gate: asked for by name.
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

from tasks.dtypes import PRECISIONS, dtype_word

# The x86 capabilities torch reports (torch.cpu.get_capabilities) that make bf16 fast, best
# first, with the name a user knows them by.
X86_BF16 = (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16"))
ARM_BF16_FLAG = "bf16"  # /proc/cpuinfo "Features" on aarch64 (Armv8.6-A BF16)


@dataclass(frozen=True)
class PrecisionChoice:
    """What ``--precision`` became on this device: the dtype the models run in and why."""

    asked: str
    dtype: torch.dtype
    reason: str

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    @property
    def short(self) -> str:
        """The ``--precision`` word for the dtype (bf16, fp32, fp16)."""
        return dtype_word(self.dtype)

    def line(self) -> str:
        return f"precision {self.name} ({self.asked} asked): {self.reason}"


def cpu_name() -> str:
    caps = _cpu_capabilities()
    name = str(caps.get("cpu_name") or "") if caps else ""
    return name or platform.processor() or platform.machine() or "this CPU"


def cpu_bf16_instructions() -> tuple[str, ...]:
    """The bf16 instructions this CPU has, by the names users know them by (empty: none)."""
    if platform.machine().lower() in ("aarch64", "arm64"):
        return ("Arm BF16",) if ARM_BF16_FLAG in _arm_features() else ()
    caps = _cpu_capabilities()
    return tuple(label for key, label in X86_BF16 if caps.get(key))


def choose_precision(precision: str, device: torch.device) -> PrecisionChoice:
    """The precision a worker's models run in on ``device``, with the reason (see above)."""
    return _choose(precision, str(device))


@functools.cache
def _choose(precision: str, device_text: str) -> PrecisionChoice:
    device = torch.device(device_text)
    if device.type == "cuda":
        if precision == "auto":
            return PrecisionChoice(precision, torch.bfloat16, "CUDA: bf16 on the tensor cores")
        return PrecisionChoice(precision, PRECISIONS[precision], "asked for by name")
    if precision == "fp32":
        return PrecisionChoice(precision, torch.float32, "asked for by name")
    instructions = cpu_bf16_instructions()
    if precision == "bf16":
        if instructions:
            return PrecisionChoice(
                precision, torch.bfloat16, f"asked for by name; {cpu_name()} has {instructions[0]}"
            )
        return PrecisionChoice(
            precision,
            torch.float32,
            f"bf16 asked for, but {cpu_name()} has no bf16 instructions (AMX-BF16, "
            "AVX512-BF16 or Arm BF16): emulated bf16 runs slower than fp32, so fp32",
        )
    auto = _cpu_auto(device, instructions)
    if precision == "fp16":
        return PrecisionChoice(
            precision,
            auto.dtype,
            "fp16 asked for on a CPU, which has no fp16 kernels for these models (and fp16's "
            f"range is narrower than bf16's): run as auto, {auto.name}: {auto.reason}",
        )
    return auto


def _cpu_auto(device: torch.device, instructions: tuple[str, ...]) -> PrecisionChoice:
    if not instructions:
        return PrecisionChoice(
            "auto",
            torch.float32,
            f"{cpu_name()} has no bf16 instructions (AMX-BF16, AVX512-BF16 or Arm BF16)",
        )
    try:
        verdict = _gate_verdict(device)
    except Exception as exc:  # a broken install (its weights gone): fp32, and say why
        return PrecisionChoice(
            "auto",
            torch.float32,
            f"{cpu_name()} has {instructions[0]} but the bf16 accuracy gate could not run "
            f"({type(exc).__name__}: {exc})",
        )
    if not verdict.holds:
        return PrecisionChoice(
            "auto",
            torch.float32,
            f"{cpu_name()} has {instructions[0]} but the bf16 accuracy gate failed: "
            f"{verdict.reason}",
        )
    return PrecisionChoice(
        "auto",
        torch.bfloat16,
        f"{cpu_name()} has {instructions[0]} and the bf16 accuracy gate held",
    )


def _gate_verdict(device: torch.device):  # -> tasks.precision_gate.GateVerdict
    """The accuracy gate's verdict for bf16 on this CPU (run once per CPU and torch)."""
    from tasks.precision_gate import gate_verdict

    return gate_verdict(device)


def _cpu_capabilities() -> dict[str, object]:
    """torch's account of the x86 CPU (empty elsewhere, or on a torch without it)."""
    try:
        caps = torch.cpu.get_capabilities()
    except (AttributeError, RuntimeError):
        return {}
    try:
        return dict(caps)  # a read-only mapping
    except (TypeError, ValueError):
        return {}


def _arm_features() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {
        flag
        for line in text.splitlines()
        if line.lower().startswith("features")
        for flag in line.split(":", 1)[-1].split()
    }
