"""The GPU kit: what an air-gapped GPU node needs, beyond its own Python, torch, numpy,
safetensors, pytest and OpenCV, to run the CUDA checks and every GPU figure from this source tree
(``pytest -m cuda tests/cuda`` and ``python -m bench.gpu``), as CPython 3.12 manylinux x86_64
wheels in ``gpu-kit/wheels``, at most 64 MiB.

On a connected machine (the project's ``.venv``; ``make gpu-kit`` runs this)::

    python -m bench.gpu_kit build        # writes gpu-kit/requirements.txt and gpu-kit/wheels/

Copy the source tree with ``gpu-kit/`` onto the node; there, from the tree's root, with the
node's own Python (the one that has its CUDA torch)::

    python3 -m bench.gpu_kit run                   # install from gpu-kit/, then both
    python3 -m bench.gpu_kit run --smoke --out /tmp/gpu   # small sizes, a quick check
    python3 -m bench.gpu_kit install               # only install

What goes in is derived, not listed: ``build`` runs the CUDA checks' imports and
``bench.gpu --device cpu --smoke`` in a child process and takes the distributions of every
module they loaded, with what those distributions require, less what the node brings (the
closure of ``NODE_HAS``) and this project itself, each pinned to the version tested here.
``install`` needs only the standard library and pip: a module the node must bring but lacks,
or a wheel missing from the folder, is named before pip runs (exit 2), and pip itself names a
requirement the node does not meet.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parent.parent
KIT = ROOT / "gpu-kit"
# What the node brings, with everything those require: distribution -> the module that shows
# it is there (any OpenCV build gives cv2). OpenCV is one of them because its wheel (61 MB)
# would leave no room in 64 MiB, and GPU images carry it (the lent nodes' image does).
NODE_HAS = {
    "torch": "torch",
    "numpy": "numpy",
    "safetensors": "safetensors",
    "pytest": "pytest",
    "opencv-python-headless": "cv2",
}
PROJECT = "sapiens-vfx"
TARGET_PYTHON = "3.12"
PLATFORMS = (  # manylinux tags a CPython 3.12 x86_64 node with glibc >= 2.28 takes
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
MAX_BYTES = 64 * 2**20
CUDA_TESTS = "tests/cuda"

# Run in a child process (a fresh interpreter: only what these need is imported): the CUDA
# checks' modules as pytest imports them, then bench.gpu's sections on the CPU, small.
_TRACE = """
import importlib, json, pathlib, sys
sys.path.insert(0, {root!r})
for path in sorted(pathlib.Path({tests!r}).glob("*.py")):
    importlib.import_module("tests.cuda." + path.stem if path.stem != "__init__" else "tests.cuda")
import bench.gpu
bench.gpu.main(["--device", "cpu", "--smoke", "--default-allocator", "--out", {out!r},
                "--sections", "model,4k,attention,graphs,shot,temporal"])
print("MODULES=" + json.dumps(sorted({{m.split(".")[0] for m in sys.modules}})))
"""


def _name(dist: str) -> str:
    """A distribution's normalised name (PEP 503)."""
    return re.sub(r"[-_.]+", "-", dist).lower()


# ----------------------------------------------------------------------------- build


def traced_modules() -> list[str]:
    """Top-level names of every module the CUDA checks and a small bench.gpu run load."""
    with tempfile.TemporaryDirectory() as out:
        code = _TRACE.format(root=str(ROOT), tests=str(ROOT / CUDA_TESTS), out=out)
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
        )
    if done.returncode != 0:
        print(done.stdout, done.stderr, sep="\n", file=sys.stderr)
        _refuse("tracing what the CUDA checks and bench.gpu import failed (its output above)")
    line = next(x for x in done.stdout.splitlines() if x.startswith("MODULES="))
    return json.loads(line.removeprefix("MODULES="))


def _requires(dist: str) -> list[str]:
    """What an installed distribution requires on the node (CPython 3.12, Linux x86_64),
    extras left out."""
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    environment = {
        "python_version": TARGET_PYTHON,
        "python_full_version": f"{TARGET_PYTHON}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "os_name": "posix",
        "extra": "",
    }
    names = []
    for text in requires(dist) or []:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate(environment):
            names.append(_name(requirement.name))
    return names


def closure(dists: set[str]) -> set[str]:
    from importlib.metadata import PackageNotFoundError

    seen: set[str] = set()
    todo = [_name(d) for d in dists]
    while todo:
        dist = todo.pop()
        if dist in seen:
            continue
        seen.add(dist)
        try:
            todo.extend(_requires(dist))
        except PackageNotFoundError:
            _refuse(f"{dist} is required but not installed here: `make venv` first")
    return seen


def kit_requirements() -> list[str]:
    """``name==version`` of every distribution the kit must carry, sorted."""
    from importlib.metadata import packages_distributions, version

    owners = packages_distributions()
    loaded = {_name(d) for module in traced_modules() for d in owners.get(module, [])}
    # this project's own modules run from the source tree: not its whole dependency list
    needed = closure(loaded - {_name(PROJECT)}) - closure(set(NODE_HAS))
    return sorted(f"{dist}=={version(dist)}" for dist in needed)


def build(kit: Path) -> None:
    requirements = kit_requirements()
    wheels = kit / "wheels"
    if wheels.exists():
        for old in wheels.glob("*.whl"):
            old.unlink()
    wheels.mkdir(parents=True, exist_ok=True)
    (kit / "requirements.txt").write_text("\n".join(requirements) + "\n")
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--python-version", TARGET_PYTHON, "--implementation", "cp", "--dest", str(wheels),
        *(arg for platform in PLATFORMS for arg in ("--platform", platform)),
        *requirements,
    ]  # fmt: skip
    if subprocess.run(command, check=False).returncode != 0:
        _refuse("pip could not download the kit's wheels (its message above names which)")
    size = sum(p.stat().st_size for p in wheels.glob("*.whl"))
    print(f"gpu-kit: {len(requirements)} wheels, {size / 2**20:.1f} MiB in {wheels}")
    for line in requirements:
        print(f"  {line}")
    if size > MAX_BYTES:
        _refuse(f"the kit is {size / 2**20:.1f} MiB, over 64 MiB")


# ----------------------------------------------------------------------------- on the node


def node_lacks() -> list[str]:
    """The distributions the kit leaves to the node that this Python cannot import."""
    from importlib.util import find_spec

    return [dist for dist, module in NODE_HAS.items() if find_spec(module) is None]


def missing_wheels(kit: Path) -> list[str]:
    """The requirements of the kit with no wheel of that name and version in its folder."""
    present = set()
    for wheel in (kit / "wheels").glob("*.whl"):
        dist, version = wheel.name.split("-")[:2]
        present.add((_name(dist), version))
    missing = []
    for line in (kit / "requirements.txt").read_text().split():
        dist, version = line.split("==")
        if (_name(dist), version) not in present:
            missing.append(line)
    return missing


def install(kit: Path, target: Path | None) -> None:
    if not (kit / "requirements.txt").is_file():
        _refuse(f"{kit / 'requirements.txt'} is not there: run `make gpu-kit` on a connected "
                "machine and copy gpu-kit/ with the source tree")  # fmt: skip
    lacks = node_lacks()
    if lacks:
        _refuse(f"this Python ({sys.executable}) has no {', '.join(lacks)}: the kit leaves "
                "it to the node; install it there (pip install "
                f"{' '.join(lacks)}) or carry its wheel")  # fmt: skip
    missing = missing_wheels(kit)
    if missing:
        _refuse(f"{kit / 'wheels'} has no wheel for {', '.join(missing)}: run `make gpu-kit` "
                "on a connected machine and copy gpu-kit/ again")  # fmt: skip
    command = [
        sys.executable, "-m", "pip", "install", "--no-index", "--find-links",
        str(kit / "wheels"), "--requirement", str(kit / "requirements.txt"),
        "--disable-pip-version-check", "--quiet",
    ]  # fmt: skip
    if target is not None:  # a folder of its own: the node's packages are not seen there
        command += ["--target", str(target), "--no-deps"]
    if subprocess.run(command, check=False).returncode != 0:
        _refuse("pip could not install the kit (its message above names the requirement)")
    print(f"gpu-kit: installed from {kit}{f' into {target}' if target else ''}")


def run(kit: Path, target: Path | None, out: Path, smoke: bool) -> int:
    install(kit, target)
    env = dict(os.environ)
    if target is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), env.get("PYTHONPATH")]))
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "cuda", CUDA_TESTS, "-q", "-rs", "-s",
         "-p", "no:cacheprovider"],
        cwd=ROOT, env=env, check=False,
    )  # fmt: skip
    bench = [sys.executable, "-m", "bench.gpu", "--out", str(out), *(["--smoke"] if smoke else [])]
    figures = subprocess.run(bench, cwd=ROOT, env=env, check=False)
    if figures.returncode == 2:
        return 2
    return 0 if tests.returncode == 0 and figures.returncode == 0 else 1


def _refuse(message: str) -> NoReturn:
    print(f"gpu_kit: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("command", choices=("build", "install", "run"))
    p.add_argument("--kit", type=Path, default=KIT, help="the kit's folder (default gpu-kit/)")
    here = "install into this folder instead of the running Python's environment"
    p.add_argument("--target", type=Path, default=None, help=here)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gpu")
    p.add_argument("--smoke", action="store_true", help="bench.gpu at small sizes")
    args = p.parse_args(argv)
    if args.command == "build":
        build(args.kit)
        return 0
    if args.command == "install":
        install(args.kit, args.target)
        return 0
    return run(args.kit, args.target, args.out, args.smoke)


if __name__ == "__main__":
    raise SystemExit(main())
