"""How fast the up-front checkpoint check is: NaN/Inf on the raw bits with numpy
(`sapiens.finite.nonfinite_tensors`, what planning runs) against loading every tensor through
torch (`safe_open(...).get_tensor` + `torch.isfinite`, what `load_model` does), on a real
Sapiens2 file of a few hundred MB (a random-weight 0.1b model by default).

Each method runs with the file in the page cache ("warm") and after its pages were dropped
with posix_fadvise(DONTNEED) ("cold": disk-bound, as on a first run on a fresh node).

    python -m bench.checkpoint_verify                         # 0.1b normal in bf16 and f32
    python -m bench.checkpoint_verify --arch 0.4b --task seg --dtypes bf16 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch


def make_checkpoint(directory: Path, arch: str, task: str | None, dtype: torch.dtype) -> Path:
    from sapiens.loading import save_model
    from sapiens.model import build_model

    path = directory / f"{arch}_{task or 'pretrain'}_{str(dtype).split('.')[-1]}.safetensors"
    if not path.is_file():
        save_model(build_model(arch, task, seed=0, dtype=dtype), path, trained=True)
    return path


def drop_from_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def numpy_bits(path: Path) -> None:
    from sapiens.finite import nonfinite_tensors
    from sapiens.safetensors_format import read_tensor_index

    entries, _ = read_tensor_index(path)
    assert not nonfinite_tensors(path, entries)


def torch_load(path: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device="cpu") as fh:
        for key in fh.keys():  # noqa: SIM118 (safe_open is not a Mapping)
            tensor = fh.get_tensor(key)
            assert not tensor.is_floating_point() or bool(torch.isfinite(tensor).all())


def full_verify(path: Path) -> None:
    from sapiens.loading import verify_checkpoint

    verify_checkpoint(path)


METHODS: dict[str, Callable[[Path], None]] = {
    "numpy raw bits": numpy_bits,
    "torch get_tensor+isfinite": torch_load,
    "verify_checkpoint (header+shapes+numpy)": full_verify,
}


def best_seconds(method: Callable[[Path], None], path: Path, repeat: int, cold: bool) -> float:
    best = float("inf")
    for _ in range(repeat):
        if cold:
            drop_from_page_cache(path)
        start = time.perf_counter()
        method(path)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="0.1b")
    parser.add_argument("--task", default="normal")
    parser.add_argument("--dtypes", default="bf16,f32")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", help="keep the checkpoints here (default: a temp dir)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the flow process checks on one core
    dtypes = {"bf16": torch.bfloat16, "f32": torch.float32, "f16": torch.float16}
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(args.dir or tmp)
        directory.mkdir(parents=True, exist_ok=True)
        for name in args.dtypes.split(","):
            path = make_checkpoint(directory, args.arch, args.task, dtypes[name])
            mb = path.stat().st_size / 1e6
            print(f"\n{path.name}: {mb:.0f} MB")
            for cold in (False, True):
                for label, method in METHODS.items():
                    method(path)  # warm-up (imports, page cache)
                    seconds = best_seconds(method, path, args.repeat, cold)
                    state = "cold" if cold else "warm"
                    print(f"  {state}  {label:42s} {seconds:6.3f} s  {mb / seconds:7.0f} MB/s")


if __name__ == "__main__":
    main()
