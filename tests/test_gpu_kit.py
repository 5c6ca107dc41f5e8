"""The GPU kit on a machine without a GPU: what it carries is what the product's commands, the
CUDA checks and the benches load beyond a node's own torch, numpy, SciPy, Pillow, OpenCV,
safetensors and pytest (nothing the node has, nor what a local-disk node goes without); a
module the node lacks or a missing wheel is named before pip runs;
bench.gpu refuses a machine without CUDA in one line unless told to use the CPU; a GPU whose
peak is not known gets its TFLOP/s and no guessed share."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench import gpu, gpu_kit
from bench.model import peak_for_name

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, check=False
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_bench_gpu_without_cuda_is_one_line_and_exit_2():
    done = _run("bench.gpu", "--default-allocator")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert "no CUDA device here" in done.stderr and "--device cpu" in done.stderr


def test_an_unknown_device_is_refused_in_one_line():
    done = _run("bench.gpu", "--device", "tpu", "--default-allocator")
    assert done.returncode == 2
    assert done.stderr.strip() == "bench.gpu: unknown device 'tpu': use cuda, cuda:N or cpu"


def test_a_gpu_whose_peak_is_unknown_gets_its_tflops_and_no_share(tmp_path):
    assert peak_for_name("NVIDIA H100 80GB HBM3") == 989.4  # the SXM5 board
    assert peak_for_name("NVIDIA H100 PCIe") == 756.0
    assert peak_for_name("NVIDIA H200 NVL") == 835.0
    assert peak_for_name("NVIDIA H100") is None  # which board: not said, so not guessed
    report = gpu.Report(tmp_path, {"name": "NVIDIA RTX PRO 9000"}, smoke=False)
    gpu.peak_figures(report, "model", "1b", 123.4)
    (tflops, share) = report.figures
    assert (tflops.value, tflops.unit) == (123.4, "TFLOP/s")
    assert share.value == "unknown"
    assert "no data-sheet peak known for 'NVIDIA RTX PRO 9000'" in share.note
    known = gpu.Report(tmp_path, {"name": "NVIDIA H200"}, smoke=False)
    gpu.peak_figures(known, "model", "1b", 494.7)
    assert known.figures[1].value == pytest.approx(0.5)


def test_a_kit_missing_a_wheel_names_it_before_pip_runs(tmp_path):
    kit = tmp_path / "gpu-kit"
    (kit / "wheels").mkdir(parents=True)
    (kit / "requirements.txt").write_text("openexr==3.5.3\nzarr==3.1.6\n")
    (kit / "wheels" / "openexr-3.5.3-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"")
    (kit / "wheels" / "zarr-3.1.5-py3-none-any.whl").write_bytes(b"")  # another version
    assert gpu_kit.missing_wheels(kit) == ["zarr==3.1.6"]
    done = _run("bench.gpu_kit", "install", "--kit", str(kit))
    assert done.returncode == 2
    assert "has no wheel for zarr==3.1.6" in done.stderr
    assert "make gpu-kit" in done.stderr


def test_a_node_without_what_the_kit_leaves_to_it_is_named_before_pip_runs(
    tmp_path, monkeypatch, capsys
):
    kit = tmp_path / "gpu-kit"
    (kit / "wheels").mkdir(parents=True)
    (kit / "requirements.txt").write_text("")
    lacking = {**gpu_kit.NODE_HAS, "opencv-python-headless": "no_such_cv2_here"}
    monkeypatch.setattr(gpu_kit, "NODE_HAS", lacking)
    assert gpu_kit.node_lacks(kit) == ["opencv-python-headless"]
    with pytest.raises(SystemExit) as refused:
        gpu_kit.install(kit, None)
    assert refused.value.code == 2
    message = capsys.readouterr().err
    assert "has no opencv-python-headless" in message
    assert "pip install opencv-python-headless" in message


def test_a_kit_never_built_is_named():
    done = _run("bench.gpu_kit", "install", "--kit", "/nonexistent/gpu-kit")
    assert done.returncode == 2
    assert "/nonexistent/gpu-kit/requirements.txt is not there" in done.stderr


def test_a_node_without_scipy_is_named_before_pip_runs(tmp_path, monkeypatch, capsys):
    kit = tmp_path / "gpu-kit"
    (kit / "wheels").mkdir(parents=True)
    (kit / "requirements.txt").write_text("")
    monkeypatch.setattr(gpu_kit, "NODE_HAS", {**gpu_kit.NODE_HAS, "scipy": "no_such_scipy"})
    with pytest.raises(SystemExit) as refused:
        gpu_kit.install(kit, None)
    assert refused.value.code == 2
    assert "has no scipy: the kit leaves it to the node" in capsys.readouterr().err


def test_what_the_kit_leaves_out_says_why_and_the_node_brings_no_duplicate():
    assert {"imageio-ffmpeg", "openimageio", "pandas"} <= set(gpu_kit.NOT_CARRIED)
    assert all(len(reason) > 20 for reason in gpu_kit.NOT_CARRIED.values())
    assert not set(gpu_kit.NOT_CARRIED) & set(gpu_kit.NODE_HAS)
    assert {"scipy", "pillow", "opencv-python-headless", "torch"} <= set(gpu_kit.NODE_HAS)


@pytest.mark.slow
def test_the_kit_carries_the_product_and_nothing_the_node_has():
    # traced for real: the CUDA checks, bench.gpu and bench.shot on the CPU, a small demo
    requirements = gpu_kit.kit_requirements()
    names = {line.split("==")[0] for line in requirements}
    assert {"openexr", "zarr", "numcodecs", "opencolorio", "pydantic", "fileseq"} <= names
    # the product's orchestration and catalog: svfx submit, demo and worker on the node
    assert {"prefect", "dask", "distributed", "sqlalchemy", "alembic", "typer"} <= names
    assert not names & {"torch", "numpy", "safetensors", "pytest", "scipy", "pillow"}
    assert "opencv-python-headless" not in names  # the node brings it: 61 MB of 64 MiB
    # what a local-disk node goes without, and what is imported only where installed here
    assert not names & {"imageio-ffmpeg", "s3fs", "botocore", "psycopg", "scikit-image"}
    assert not names & {"hypothesis", "moto", "playwright", "h2"}
    assert all("==" in line for line in requirements)  # pinned to what is tested here


def test_bench_gpu_on_the_cpu_writes_its_report(tmp_path):
    done = _run(
        "bench.gpu", "--device", "cpu", "--smoke", "--sections", "model,graphs,temporal",
        "--out", str(tmp_path), "--default-allocator",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "gpu.json").read_text())
    assert report["smoke"] and report["device"]["device"] == "cpu"
    assert set(report["sections"]) == {"model", "graphs", "temporal"}
    assert not any("error" in s for s in report["sections"].values())
    assert {f["device"] for f in report["figures"]} == {report["device"]["name"]}
    whats = [f["what"] for f in report["figures"]]
    assert any(w.endswith("images/s") for w in whats)
    assert any(w.endswith("host core-s per frame") for w in whats)  # the stabiliser's
    markdown = (tmp_path / "gpu.md").read_text()
    assert "| graphs | CUDA graphs | skipped | they need a CUDA device |" in markdown
    assert "UNTRAINED" in markdown


def test_a_distribution_the_build_left_to_the_node_is_named_when_it_lacks_it(tmp_path, capsys):
    kit = tmp_path / "gpu-kit"
    (kit / "wheels").mkdir(parents=True)
    (kit / "requirements.txt").write_text("")
    (kit / gpu_kit.NODE_BRINGS).write_text("pytest\nno-such-cuda-core-here\n")
    assert gpu_kit.node_lacks(kit) == ["no-such-cuda-core-here"]
    with pytest.raises(SystemExit) as refused:
        gpu_kit.install(kit, None)
    assert refused.value.code == 2
    assert "has no no-such-cuda-core-here" in capsys.readouterr().err


def test_run_steps_are_checked_before_anything_installs():
    done = _run("bench.gpu_kit", "run", "--steps", "checks,warp", "--kit", "/nonexistent")
    assert done.returncode == 2
    assert "--steps takes checks, gpu, stages, flow, flow-all" in done.stderr
