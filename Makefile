# `make test` and `make demo` create .venv themselves. Torch is installed first from
# `pip install torch==2.13.0` (a local CPU wheel on the project machines); on a GPU host
# install your own CUDA build of torch into .venv before running make.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# `make test` runs the suite on pytest-xdist workers, whole modules each (their module-scoped
# servers and clusters are built once), the modules with `slow` tests first (tests/conftest.py);
# TEST_WORKERS=0 runs it in this one process, as plain pytest does.
TEST_WORKERS ?= 2

.PHONY: venv test lint format docs demo bench gpu-kit kitsu-venv clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev]"
	touch $@

venv: $(VENV)/.installed

test: venv docs
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: venv
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

# The documentation site from docs/ (Sphinx + MyST), strict: a broken link or anchor, a
# reference with no target or a page in no toctree fails it. The CLI, API and pass reference
# pages are generated from the code at build time. Open docs/_build/html/index.html.
docs: venv
	$(PY) -m sphinx -W --keep-going -n -q -b html docs docs/_build/html

# A sample shot (an astronaut's portrait) through every pass on the embedded default:
# ephemeral Prefect, a LocalCluster, SQLite and local disk under SVFX_HOME (default ~/.svfx).
demo: venv
	$(VENV)/bin/svfx demo

bench: venv
	$(PY) -m bench.model

# The GPU kit (bench/gpu_kit.py): CPython 3.12 wheels of the product (svfx, dask-cuda), the
# CUDA checks and the benches beyond a GPU node's own torch, numpy, SciPy, Pillow, OpenCV,
# safetensors and pytest, into gpu-kit/ (ignored), at most 64 MiB.
# On the node: python3 -m bench.gpu_kit run
gpu-kit: venv
	$(PY) -m bench.gpu_kit build

# Kitsu's server (zou) for `pytest -m kitsu`, in a venv of its own (never a dependency of the
# project): made once under ~/.cache/svfx-tests/zou-venv (or $SVFX_ZOU_VENV). The test's
# fixture makes it too when it is missing; this target does it ahead of time.
kitsu-venv: venv
	$(PY) -c "from tests.kitsu_server import ensure_zou, zou_venv; print(ensure_zou(zou_venv()))"

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
