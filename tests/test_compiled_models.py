"""torch.compile on a worker: a corrupt compiled-code cache is rebuilt, a compiler that keeps
failing leaves the model running eagerly, and neither is ever a crash."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from sapiens.torch_compile import compile_modules
from tasks import compiled_models

ROOT = Path(__file__).resolve().parents[1]

# One small module through the worker's guard, in a process of its own (a cache is only read
# back by a new process); prints "healed" when the cache had to be cleared.
SCRIPT = textwrap.dedent(
    """
    import os, shutil, sys
    import torch
    from torch import nn
    from sapiens.torch_compile import compile_modules
    cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    class Net(nn.Module):  # our own module: dynamo does not trace torch's own as a top frame
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
        def forward(self, x):
            return torch.nn.functional.silu(self.fc(x)) * 2
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(4, 8)
    with torch.inference_mode():
        want = net(x)
        def heal():
            print("healed")
            shutil.rmtree(cache, ignore_errors=True)
        compile_modules([net], heal=heal, on_eager=lambda why: print("eager", why))
        got = net(x)
    print("equal" if torch.allclose(got, want, atol=1e-6) else "differ")
    """
)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def _run(cache: Path) -> str:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.slow
def test_a_corrupt_compiled_code_cache_is_rebuilt_not_a_crash(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _run(cache)
    assert "equal" in first and "healed" not in first
    libraries = list(cache.rglob("*.so"))
    assert libraries, "the compile left no compiled code in its cache"
    for lib in libraries:
        lib.write_bytes(b"garbage")  # what a killed write or a full disk leaves
    second = _run(cache)
    assert "healed" in second and "equal" in second and "eager" not in second
    third = _run(cache)  # the rebuilt cache loads cleanly
    assert "healed" not in third and "equal" in third


def test_a_compiler_that_keeps_failing_leaves_the_module_eager(monkeypatch) -> None:
    net = _Net().eval()
    x = torch.randn(2, 4)
    want = net(x)

    def broken(*_args, **_kwargs):
        def run(*_a, **_k):
            raise torch._dynamo.exc.TorchDynamoException("no C++ compiler found")

        return run

    healed, told = [], []
    compile_modules([net], heal=lambda: healed.append(1), on_eager=told.append)
    monkeypatch.setattr(torch, "compile", broken)
    # the first compile fails too: the part's compiled code is replaced by the broken one
    state = next(
        c.cell_contents
        for c in net._compiled_call_impl.__closure__
        if isinstance(c.cell_contents, dict)
    )
    state["compiled"] = broken()
    with torch.inference_mode():
        got = net(x)
        again = net(x)
    assert torch.equal(got, want) and torch.equal(again, want)
    assert healed == [1]  # cleared once, then given up
    assert len(told) == 1 and "no C++ compiler" in told[0]
    assert net._compiled_call_impl is None  # eager from then on


def test_a_failure_of_the_computation_itself_is_raised(monkeypatch) -> None:
    net = _Net().eval()
    healed: list[int] = []
    compile_modules([net], heal=lambda: healed.append(1), on_eager=lambda _w: None)
    with pytest.raises(RuntimeError, match=r"shapes cannot be multiplied|size mismatch|mat1"):
        net(torch.randn(2, 5))
    assert healed == []


def test_the_cache_is_per_torch_version_under_svfx_home(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SVFX_HOME", str(tmp_path))
    cache = compiled_models.compile_cache_dir()
    assert cache == tmp_path / "compile-cache" / f"torch-{torch.__version__}"
    monkeypatch.delenv("SVFX_HOME")
    assert compiled_models.compile_cache_dir() is None


CPU, CUDA, MPS = torch.device("cpu"), torch.device("cuda"), torch.device("mps")
NATIVE, STAND_IN = (1024, 768), (256, 192)


@pytest.mark.parametrize(
    ("value", "device", "input_hw", "wanted"),
    [
        ("1", CUDA, STAND_IN, True),
        ("on", CPU, STAND_IN, True),
        ("0", CPU, NATIVE, False),
        ("off", CPU, NATIVE, False),
        ("maybe", CPU, NATIVE, False),
        ("auto", CPU, NATIVE, True),
        (None, CPU, (4096, 3072), True),
        (None, CPU, STAND_IN, False),
        (None, CUDA, NATIVE, True),
        (None, CUDA, STAND_IN, False),
        ("0", CUDA, NATIVE, False),
        (None, MPS, NATIVE, False),
    ],
)
def test_compile_is_chosen_for_real_models_on_cpu_and_cuda_workers(
    monkeypatch, value: str | None, device: torch.device, input_hw, wanted: bool
) -> None:
    """By default a CPU or CUDA worker compiles a real model (one input shape per pass, the
    predictor pads its calls) and not a tiny stand-in; SVFX_COMPILE forces either way."""
    monkeypatch.setattr(compiled_models, "cpp_compiler", lambda: "/usr/bin/g++")
    monkeypatch.setattr(compiled_models.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(compiled_models.shutil, "which", lambda name: f"/usr/bin/{name}")
    if value is None:
        monkeypatch.delenv(compiled_models.COMPILE_ENV, raising=False)
    else:
        monkeypatch.setenv(compiled_models.COMPILE_ENV, value)
    chosen, why = compiled_models.compile_wanted(device, input_hw)
    assert chosen is wanted
    assert why  # every choice says why, for the worker's log
    if value == "maybe":
        assert "'maybe' is not 1, 0 or auto" in why


def test_a_cpu_node_without_a_cpp_compiler_runs_real_models_uncompiled(monkeypatch) -> None:
    monkeypatch.delenv(compiled_models.COMPILE_ENV, raising=False)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(compiled_models.shutil, "which", lambda name: None)
    chosen, why = compiled_models.compile_wanted(CPU, NATIVE)
    assert not chosen and "no C++ compiler" in why
    monkeypatch.setenv("CXX", "icpx")
    monkeypatch.setattr(compiled_models.shutil, "which", lambda name: f"/opt/bin/{name}")
    assert compiled_models.cpp_compiler() == "/opt/bin/icpx"


def test_a_cuda_node_without_triton_or_a_c_compiler_runs_real_models_uncompiled(monkeypatch):
    monkeypatch.delenv(compiled_models.COMPILE_ENV, raising=False)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(compiled_models.importlib.util, "find_spec", lambda name: None)
    chosen, why = compiled_models.compile_wanted(CUDA, NATIVE)
    assert not chosen and "Triton is not installed" in why
    monkeypatch.setattr(compiled_models.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(compiled_models.shutil, "which", lambda name: None)
    chosen, why = compiled_models.compile_wanted(CUDA, NATIVE)
    assert not chosen and "no C compiler for Triton" in why
    monkeypatch.setattr(compiled_models.shutil, "which", lambda name: f"/usr/bin/{name}")
    chosen, why = compiled_models.compile_wanted(CUDA, NATIVE)
    assert chosen and "/usr/bin/gcc" in why  # Triton's own choice: gcc before clang
    monkeypatch.setenv("CC", "clang-18")
    assert "/usr/bin/clang-18" in compiled_models.compile_wanted(CUDA, NATIVE)[1]


def test_a_worker_keeps_its_compiled_graphs(monkeypatch, tmp_path: Path) -> None:
    """The caches that let a new process load compiled code instead of compiling it are on,
    in the folder under SVFX_HOME, though importing dynamo put torch's default in the
    environment; a folder the user chose is kept."""
    import torch._functorch.config
    import torch._inductor.config
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("SVFX_HOME", str(tmp_path))
    monkeypatch.setenv(compiled_models.CACHE_ENV, default_cache_dir())  # what dynamo leaves
    monkeypatch.setattr(torch._inductor.config, "fx_graph_cache", False)
    monkeypatch.setattr(torch._functorch.config, "enable_autograd_cache", False)
    monkeypatch.setattr(compiled_models, "compile_model", lambda model, **_kw: model)
    net = _Net()
    assert compiled_models.compile_for_worker(net, "net") is net
    assert os.environ[compiled_models.CACHE_ENV] == str(compiled_models.compile_cache_dir())
    assert torch._inductor.config.fx_graph_cache
    assert torch._functorch.config.enable_autograd_cache
    monkeypatch.setenv(compiled_models.CACHE_ENV, str(tmp_path / "mine"))
    compiled_models.compile_for_worker(net, "net")
    assert os.environ[compiled_models.CACHE_ENV] == str(tmp_path / "mine")
