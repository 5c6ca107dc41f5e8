"""The GPU kit: what an air-gapped GPU node needs, beyond its own Python, torch, numpy, SciPy,
Pillow, safetensors, pytest and OpenCV, to run the whole product (``svfx submit``, ``svfx
demo``, ``svfx worker``, one Dask worker per GPU through the ``gpu`` extra's dask-cuda), the
CUDA checks and every GPU figure from this source tree (``pytest -m cuda tests/cuda``,
``python -m bench.gpu``, ``python -m bench.shot``), as CPython 3.12 manylinux x86_64 wheels in
``gpu-kit/wheels``, at most 64 MiB. One kit, this one: the bench's figures and the product
need the same wheels but for a few.

On a connected machine (the project's ``.venv``; ``make gpu-kit`` runs this)::

    python -m bench.gpu_kit build        # writes gpu-kit/requirements.txt and gpu-kit/wheels/

Copy the source tree with ``gpu-kit/`` onto the node; there, from the tree's root, with the
node's own Python (the one that has its CUDA torch)::

    python3 -m bench.gpu_kit run                   # install from gpu-kit/, then all three
    python3 -m bench.gpu_kit run --smoke --out /tmp/gpu   # small sizes, a quick check
    python3 -m bench.gpu_kit install               # only install (``svfx`` then works)

What goes in is derived, not listed: ``build`` runs, each in a child process whose every
Python process (Dask's workers and Prefect's server too) records the modules it loads, the
CUDA checks' imports, ``bench.gpu --device cpu --smoke``, a small ``svfx demo`` and ``svfx
worker --help``, and takes the distributions of the modules they loaded (not everything those
declare: the declared closure is about 140 MiB), less what the node brings (the closure of
``NODE_HAS``) and ``NOT_CARRIED`` (each with its reason); then the ``gpu`` extra's dask-cuda
and what it imports (no CUDA here to trace it), and this project's own wheel (the ``svfx``
command). Each is pinned to the version tested here. ``install`` needs only the standard
library and pip and installs exactly that list (``--no-deps``: ``pip check`` names what was
left out on purpose): a module the node must bring but lacks, or a wheel missing from the
folder, is named before pip runs (exit 2).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parent.parent
KIT = ROOT / "gpu-kit"
# What the node brings, with everything those require: distribution -> the module that shows
# it is there (any OpenCV build gives cv2). OpenCV (61 MB), SciPy (35 MB) and Pillow (7 MB) are
# among them because their wheels leave no room in 64 MiB, and CUDA images carry them (the lent
# nodes' image does: torchvision requires Pillow).
NODE_HAS = {
    "torch": "torch",
    "numpy": "numpy",
    "safetensors": "safetensors",
    "pytest": "pytest",
    "opencv-python-headless": "cv2",
    "scipy": "scipy",
    "pillow": "PIL",
}
# A CUDA build of torch brings these too (the CPU build here does not): dask-cuda's cuda-core
# imports cuda.bindings.
CUDA_TORCH_HAS = ("cuda-bindings", "cuda-pathfinder")
# Declared by what the kit carries, or loaded by the trace here, and left out on purpose.
NOT_CARRIED = {
    "imageio-ffmpeg": "its ffmpeg binary is 65 MiB: clips use the node's ffmpeg on PATH, or "
    "are skipped with one line",
    "openimageio": "8 MiB, read only for plates that are not EXR (DPX, TIFF, ...): a node "
    "reading those carries its wheel too",
    "pandas": "dask-cuda declares it for dask-cudf; LocalCUDACluster and its workers do not "
    "import it",
    "rapids-dask-dependency": "dask-cuda's pin of dask and bokeh (the dashboard's, 6 MiB); "
    "dask and distributed are carried at the release the platform pins",
}
PROJECT = "sapiens-vfx"
GPU_EXTRA = "gpu"
TARGET_PYTHON = "3.12"
PLATFORMS = (  # manylinux tags a CPython 3.12 x86_64 node with glibc >= 2.28 takes
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
MAX_BYTES = 64 * 2**20
NODE_BRINGS = "node-brings.txt"  # in the kit: what its build left to the node by name
CUDA_TESTS = "tests/cuda"

# Each traced command runs with this as its sitecustomize: every Python process it starts
# (Dask's workers, Prefect's server) appends the top-level name of each module it loads.
_RECORDER = """
import os, sys
class _Recorder:
    seen = {m.partition(".")[0] for m in sys.modules}
    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        if top not in self.seen:
            self.seen.add(top)
            with open(os.environ["SVFX_KIT_TRACE"], "a") as log:
                log.write(top + "\\n")
with open(os.environ["SVFX_KIT_TRACE"], "a") as log:
    log.write("\\n".join(sorted(_Recorder.seen)) + "\\n")
sys.meta_path.insert(0, _Recorder())
"""
# The CUDA checks' modules as pytest imports them, then bench.gpu's sections on the CPU, small.
_CHECKS = """
import importlib, pathlib, sys
sys.path.insert(0, {root!r})
for path in sorted(pathlib.Path({tests!r}).glob("*.py")):
    importlib.import_module("tests.cuda." + path.stem if path.stem != "__init__" else "tests.cuda")
import bench.gpu
bench.gpu.main(["--device", "cpu", "--smoke", "--default-allocator", "--out", {out!r},
                "--sections", "model,4k,attention,graphs,shot,temporal"])
"""


def _name(dist: str) -> str:
    """A distribution's normalised name (PEP 503)."""
    return re.sub(r"[-_.]+", "-", dist).lower()


# ----------------------------------------------------------------------------- build


def _traced_commands(out: str) -> list[list[str]]:
    code = _CHECKS.format(root=str(ROOT), tests=str(ROOT / CUDA_TESTS), out=out)
    svfx = [sys.executable, "-m", "cli"]
    return [
        [sys.executable, "-c", code],
        [*svfx, "demo", "--frames", "3", "--size", "96x64"],  # the whole flow, every pass
        [*svfx, "worker", "--help"],
        [sys.executable, "-m", "bench.shot", "--frames", "2", "--size", "96x64", "--workers",
         "1", "--chunk-frames", "1", "--passes", "normal"],
    ]  # fmt: skip


def traced_modules() -> list[str]:
    """Top-level names of every module the traced commands' processes load."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "site").mkdir()
        (Path(tmp) / "site" / "sitecustomize.py").write_text(_RECORDER)
        log = Path(tmp) / "modules.txt"
        env = {**os.environ, "SVFX_KIT_TRACE": str(log), "SVFX_HOME": str(Path(tmp) / "home"),
               "PYTHONPATH": os.pathsep.join([str(Path(tmp) / "site"), str(ROOT)])}  # fmt: skip
        for command in _traced_commands(tmp):
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                                  check=False)  # fmt: skip
            if done.returncode != 0:
                print(done.stdout[-3000:], done.stderr[-3000:], sep="\n", file=sys.stderr)
                _refuse(f"tracing `{' '.join(command[1:3])}` failed (its output above)")
        return sorted(set(log.read_text().split()))


def _requires(dist: str) -> list[str]:
    """What an installed distribution requires on the node (CPython 3.12, Linux x86_64),
    extras left out."""
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    environment = {
        "python_version": TARGET_PYTHON,
        "python_full_version": platform.python_version()  # this one's, when it is that
        if platform.python_version().startswith(f"{TARGET_PYTHON}.")
        else f"{TARGET_PYTHON}.0",
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


def node_closure() -> set[str]:
    """What the node brings: ``NODE_HAS`` with all they require, and a CUDA torch's own."""
    return closure(set(NODE_HAS)) | set(CUDA_TORCH_HAS)


def kit_requirements() -> list[str]:
    """``name==version`` of every distribution the traced commands loaded that the kit must
    carry, sorted (this project and the ``gpu`` extra are added by ``build``)."""
    from importlib.metadata import packages_distributions, version

    owners = packages_distributions()
    loaded = {_name(d) for module in traced_modules() for d in owners.get(module, [])}
    # only what the product requires: a package imported because it happens to be installed
    # here (httpx's HTTP/2, a test library) stays out
    declared = closure(set(_requires(PROJECT)) - set(NOT_CARRIED))
    needed = (loaded & declared) - node_closure() - set(NOT_CARRIED)
    return sorted(f"{dist}=={version(dist)}" for dist in needed)


def gpu_extra(carried: set[str]) -> list[str]:
    """The ``gpu`` extra's requirements (dask-cuda) and those of theirs that nothing else
    brings, as pip requirements: not installed here (no CUDA), so resolved by pip."""
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    extra = [Requirement(t) for t in requires(PROJECT) or [] if f'extra == "{GPU_EXTRA}"' in t]
    done = carried | node_closure() | set(NOT_CARRIED)
    wanted = [str(r).split(";")[0] for r in extra]
    for requirement in extra:
        for text in _wheel_requires(requirement.name, str(requirement.specifier)):
            dependency = Requirement(text)
            if _name(dependency.name) not in done and dependency.marker is None:
                wanted.append(str(dependency))
    return wanted


def _download(requirements: list[str], dest: Path, python: str) -> None:
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--python-version", python, "--implementation", "cp", "--dest", str(dest),
        "--disable-pip-version-check", "--quiet",
        *(arg for platform in PLATFORMS for arg in ("--platform", platform)),
        *requirements,
    ]  # fmt: skip
    if subprocess.run(command, check=False).returncode != 0:
        _refuse("pip could not download the kit's wheels (its message above names which)")


def _wheel_requires(dist: str, specifier: str) -> list[str]:
    """What the newest wheel of ``dist`` matching ``specifier`` requires, extras left out."""
    import zipfile

    with tempfile.TemporaryDirectory() as tmp:
        _download([f"{dist}{specifier}"], Path(tmp), TARGET_PYTHON)
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            lines = archive.read(name).decode().splitlines()
    texts = [
        x.removeprefix("Requires-Dist:").strip() for x in lines if x.startswith("Requires-Dist:")
    ]
    return [t for t in texts if "extra ==" not in t]


def _pinned(wheels: Path) -> dict[str, str]:
    """``name==version`` of each wheel in the folder, by normalised name."""
    pins = {}
    for wheel in wheels.glob("*.whl"):
        dist, version = wheel.name.split("-")[:2]
        pins[_name(dist)] = f"{_name(dist)}=={version}"
    return pins


def build(kit: Path, python: str = TARGET_PYTHON, node_brings: tuple[str, ...] = ()) -> None:
    """``node_brings``: distributions the node is known to have besides ``NODE_HAS`` (a CUDA
    image's cuda-core), left out and checked for by ``install``."""
    left = {_name(d) for d in node_brings}
    traced = [line for line in kit_requirements() if _name(line.split("==")[0]) not in left]
    extra = gpu_extra({line.split("==")[0] for line in traced} | left)
    extra = [r for r in extra if _name(re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0]) not in left]
    wheels = kit / "wheels"
    if wheels.exists():
        for old in wheels.glob("*.whl"):
            old.unlink()
    wheels.mkdir(parents=True, exist_ok=True)
    (kit / NODE_BRINGS).write_text("".join(f"{d}\n" for d in sorted(left)))
    _download(traced, wheels, python)
    if extra:
        _download(extra, wheels, python)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
               "--quiet", "--wheel-dir", str(wheels), str(ROOT)]  # fmt: skip
    if subprocess.run(command, check=False).returncode != 0:
        _refuse("pip could not build this project's wheel (its message above says why)")
    requirements = sorted(_pinned(wheels).values())
    (kit / "requirements.txt").write_text("\n".join(requirements) + "\n")
    sizes = {w.name: w.stat().st_size for w in wheels.glob("*.whl")}
    print(f"gpu-kit: {len(sizes)} wheels, {sum(sizes.values()) / 2**20:.1f} MiB in {wheels}")
    for name, size in sorted(sizes.items(), key=lambda item: -item[1]):
        print(f"  {size / 2**20:6.2f} MiB  {name}")
    if sum(sizes.values()) > MAX_BYTES:
        _refuse(f"the kit is {sum(sizes.values()) / 2**20:.1f} MiB, over 64 MiB")


# ----------------------------------------------------------------------------- on the node


def node_lacks(kit: Path) -> list[str]:
    """The distributions the kit leaves to the node that this Python cannot import (and
    those its build was told the node brings that are not installed)."""
    from importlib.metadata import PackageNotFoundError, version
    from importlib.util import find_spec

    brought = kit / NODE_BRINGS
    told = brought.read_text().split() if brought.is_file() else []
    absent = []
    for dist in told:
        try:
            version(dist)
        except PackageNotFoundError:
            absent.append(dist)

    return [d for d, module in NODE_HAS.items() if find_spec(module) is None] + absent


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
    lacks = node_lacks(kit)
    if lacks:
        _refuse(f"this Python ({sys.executable}) has no {', '.join(lacks)}: the kit leaves "
                "it to the node; install it there (pip install "
                f"{' '.join(lacks)}) or carry its wheel")  # fmt: skip
    missing = missing_wheels(kit)
    if missing:
        _refuse(f"{kit / 'wheels'} has no wheel for {', '.join(missing)}: run `make gpu-kit` "
                "on a connected machine and copy gpu-kit/ again")  # fmt: skip
    command = [
        sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--find-links",
        str(kit / "wheels"), "--requirement", str(kit / "requirements.txt"),
        "--disable-pip-version-check", "--quiet",
    ]  # fmt: skip
    if target is not None:  # a folder of its own: the node's packages are not seen there
        command += ["--target", str(target)]
    if subprocess.run(command, check=False).returncode != 0:
        _refuse("pip could not install the kit (its message above names the requirement)")
    print(f"gpu-kit: installed from {kit}{f' into {target}' if target else ''}")


# The main job through the real flow (Prefect, the Dask cluster's GPU workers, SQLite): the
# five dense passes at Sapiens2-1B on a 48-frame 4K plate; ``--smoke``: tiny models, small.
SHOT = ["--frames", "48", "--size", "4096x2160", "--model-size", "1b"]
SHOT_SMOKE = ["--frames", "4", "--size", "320x180", "--model-size", "tiny", "--chunk-frames", "2"]
SHOT_PASSES = "normal,albedo,pointmap,seg,matte"


# What ``run`` may do, in this order (``--steps``): the CUDA checks; every bench.gpu section, or
# only its worker-stage shot (the figure the flow is compared with); the flow with the person
# gate, then with every tile. A lent machine's call is limited: run them in two calls.
STEPS = ("checks", "gpu", "stages", "flow", "flow-all")
DEFAULT_STEPS = ("checks", "gpu", "flow", "flow-all")


def run(kit: Path, target: Path | None, out: Path, smoke: bool, steps: tuple[str, ...]) -> int:
    install(kit, target)
    env = dict(os.environ)
    if target is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), env.get("PYTHONPATH")]))
    small = ["--smoke"] if smoke else []
    commands = {
        "checks": ["pytest", "-m", "cuda", CUDA_TESTS, "-q", "-rs", "-s", "-p", "no:cacheprovider"],
        "gpu": ["bench.gpu", "--out", str(out), *small],
        "stages": ["bench.gpu", "--out", str(out), "--sections", "shot", *small],
    }
    codes = []
    for step in (s for s in STEPS if s in steps):
        if step.startswith("flow"):
            tiles = "all" if step == "flow-all" else "people"
            codes.append(_flow(env, out, smoke, tiles))
            continue
        done = subprocess.run([sys.executable, "-m", *commands[step]], cwd=ROOT, env=env)
        if step != "checks" and done.returncode == 2:
            return 2
        codes.append(done.returncode)
    return 0 if all(code == 0 for code in codes) else 1


def _flow(env: dict[str, str], out: Path, smoke: bool, tiles: str) -> int:
    """bench.shot through the real flow; its report into ``out/shot-<tiles>.json``."""
    shot = [sys.executable, "-m", "bench.shot", *(SHOT_SMOKE if smoke else SHOT),
            "--passes", SHOT_PASSES, "--tiles", tiles]  # fmt: skip
    flow = subprocess.run(shot, cwd=ROOT, env=env, check=False, capture_output=True, text=True)
    sys.stderr.write(flow.stderr[-4000:])
    out.mkdir(parents=True, exist_ok=True)
    report = out / f"shot-{tiles}.json"
    report.write_text(flow.stdout.strip().splitlines()[-1] if flow.stdout else "{}")
    print(f"gpu-kit: bench.shot --tiles {tiles} -> {report} (exit {flow.returncode})")
    return flow.returncode


def _refuse(message: str) -> NoReturn:
    print(f"gpu_kit: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    global TARGET_PYTHON
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("command", choices=("build", "install", "run"))
    p.add_argument("--kit", type=Path, default=KIT, help="the kit's folder (default gpu-kit/)")
    here = "install into this folder instead of the running Python's environment"
    p.add_argument("--target", type=Path, default=None, help=here)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gpu")
    p.add_argument("--smoke", action="store_true", help="bench.gpu and bench.shot, small")
    here = "build: the wheels' CPython version (3.12 for GPU nodes; another to try it here)"
    p.add_argument("--python-version", default=TARGET_PYTHON, help=here)
    here = "build: a distribution the node has besides torch & co. (cuda-core), left out"
    p.add_argument("--node-brings", action="append", default=[], help=here)
    here = f"run: comma-separated, of {', '.join(STEPS)} (default {','.join(DEFAULT_STEPS)})"
    p.add_argument("--steps", default=",".join(DEFAULT_STEPS), help=here)
    args = p.parse_args(argv)
    steps = tuple(s.strip() for s in args.steps.split(",") if s.strip())
    if set(steps) - set(STEPS):
        p.error(f"--steps takes {', '.join(STEPS)}; got {args.steps}")
    if args.command == "build":
        TARGET_PYTHON = args.python_version  # requirements' markers are read for it
        build(args.kit, args.python_version, tuple(args.node_brings))
        return 0
    if args.command == "install":
        install(args.kit, args.target)
        return 0
    return run(args.kit, args.target, args.out, args.smoke, steps)


if __name__ == "__main__":
    raise SystemExit(main())
