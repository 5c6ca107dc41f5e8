"""The deployment files under infra/: every YAML parses, and the facts that must agree between
them (and with the code) do: GPU resources, one image, compose services, Prefect entrypoints,
the Dockerfile's install order and user, the Slurm job options, a README in every folder.

Fast and offline: no Docker, no Kubernetes, no Slurm, no dask-jobqueue."""

from __future__ import annotations

import importlib.util
import json
import py_compile
import re
import shlex
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
INFRA = REPO / "infra"
K8S = INFRA / "kubernetes"
COMPOSE = INFRA / "compose" / "compose.yaml"
DOCKERFILE = INFRA / "docker" / "Dockerfile"
PREFECT_YAML = INFRA / "prefect" / "prefect.yaml"
SLURM_SCRIPT = INFRA / "slurm" / "slurm_cluster.py"

IMAGE_NAME = "sapiens-vfx"
INFRA_FOLDERS = {"docker", "kubernetes", "slurm", "compose", "prefect", "local"}
YAML_FILES = sorted([*INFRA.rglob("*.yaml"), *INFRA.rglob("*.yml")])


# ----------------------------------------------------------------------------- helpers


def yaml_docs(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def k8s_objects() -> list[dict[str, Any]]:
    objects = []
    for path in sorted(K8S.glob("*.yaml")):
        objects.extend(doc for doc in yaml_docs(path) if "kind" in doc)
    return objects


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [obj for obj in k8s_objects() if obj["kind"] == kind]


def containers(node: Any) -> Iterator[dict[str, Any]]:
    """Every container spec anywhere in a manifest (pods, CRDs, templates)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                yield from value
            else:
                yield from containers(value)
    elif isinstance(node, list):
        for item in node:
            yield from containers(item)


def flag_value(args: list[str], flag: str) -> str | None:
    """The value given to `flag` in an argv list (`--flag value` or `--flag=value`); last wins."""
    found = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(flag + "="):
            found = arg.split("=", 1)[1]
    return found


def compose_default(value: str) -> str:
    """Resolve `${VAR:-default}` / `${VAR-default}` / `${VAR}` to the default (or '')."""
    return re.sub(r"\$\{\w+(?::?-([^}]*))?\}", lambda m: m.group(1) or "", value)


def compose() -> dict[str, Any]:
    return yaml_docs(COMPOSE)[0]


def compose_env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: compose_default(str(value)) for key, value in env.items()}


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per logical line; comments dropped, continuations joined."""
    instructions: list[tuple[str, str]] = []
    buffer = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            buffer += line[:-1] + " "
            continue
        keyword, _, rest = (buffer + line).strip().partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        buffer = ""
    assert not buffer, "Dockerfile ends inside a line continuation"
    return instructions


def dockerfile_args() -> dict[str, str]:
    args = {}
    for keyword, rest in dockerfile():
        if keyword == "ARG":
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip()
    return args


def expand_args(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], m[0]), text)


def load_slurm_module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    # dask-jobqueue must not be needed to import the module or build the kwargs
    monkeypatch.setitem(sys.modules, "dask_jobqueue", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no __pycache__ under infra/
    spec = importlib.util.spec_from_file_location("svfx_infra_slurm_cluster", SLURM_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def slurm(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    for name in (
        "SVFX_SLURM_QUEUE",
        "SVFX_SLURM_ACCOUNT",
        "SVFX_SLURM_CORES",
        "SVFX_SLURM_MEMORY",
        "SVFX_SLURM_WALLTIME",
        "SVFX_SLURM_GRES",
        "SVFX_SLURM_JOBS",
        "SVFX_SLURM_INTERFACE",
        "SVFX_SLURM_LOG_DIRECTORY",
        "SVFX_SLURM_LOCAL_DIRECTORY",
        "SVFX_SLURM_JOB_NAME",
        "SVFX_VENV",
        "VIRTUAL_ENV",
    ):
        monkeypatch.delenv(name, raising=False)
    return load_slurm_module(monkeypatch)


# ----------------------------------------------------------------------------- layout


def test_every_infra_folder_has_a_readme() -> None:
    folders = {p.name for p in INFRA.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert folders >= INFRA_FOLDERS, f"missing infra folders: {INFRA_FOLDERS - folders}"
    overview = (INFRA / "README.md").read_text()
    for name in sorted(folders):
        readme = INFRA / name / "README.md"
        assert readme.is_file(), f"infra/{name}/ has no README.md"
        text = readme.read_text()
        assert text.startswith("# ") and len(text) > 400, f"infra/{name}/README.md is a stub"
        assert f"{name}/README.md" in overview, f"infra/README.md does not link infra/{name}/"


def test_yaml_files_are_found() -> None:
    names = {p.relative_to(INFRA).as_posix() for p in YAML_FILES}
    assert {
        "compose/compose.yaml",
        "prefect/prefect.yaml",
        "kubernetes/kustomization.yaml",
        "kubernetes/daskcluster.yaml",
        "kubernetes/gpu-workergroup.yaml",
        "kubernetes/configmap.yaml",
        "kubernetes/secret.example.yaml",
    } <= names


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: p.relative_to(INFRA).as_posix())
def test_every_yaml_file_parses(path: Path) -> None:
    docs = yaml_docs(path)
    assert docs, f"{path} holds no YAML document"
    for doc in docs:
        assert isinstance(doc, dict), f"{path}: a document is not a mapping"
        if path.parent == K8S and path.name != "kustomization.yaml":
            assert doc.get("apiVersion") and doc.get("kind"), f"{path}: not a manifest"
            assert doc.get("metadata", {}).get("name"), f"{path}: unnamed {doc['kind']}"


# ----------------------------------------------------------------------------- kubernetes


def test_kustomization_lists_every_manifest_but_the_secret_example() -> None:
    kustomization = yaml_docs(K8S / "kustomization.yaml")[0]
    resources = kustomization["resources"]
    for resource in resources:
        assert (K8S / resource).is_file(), f"kustomization lists missing {resource}"
    manifests = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert "secret.example.yaml" not in resources, "placeholder secrets must never be applied"
    assert set(resources) == manifests - {"secret.example.yaml"}
    assert kustomization["namespace"]
    assert [image["name"] for image in kustomization["images"]] == [IMAGE_NAME]


def test_dask_cluster_scheduler_service_and_cpu_group() -> None:
    (cluster,) = by_kind("DaskCluster")
    assert cluster["apiVersion"] == "kubernetes.dask.org/v1"
    name = cluster["metadata"]["name"]
    service = cluster["spec"]["scheduler"]["service"]
    assert service["selector"] == {
        "dask.org/cluster-name": name,
        "dask.org/component": "scheduler",
    }
    assert {port["port"] for port in service["ports"]} == {8786, 8787}
    (scheduler,) = cluster["spec"]["scheduler"]["spec"]["containers"]
    assert [*scheduler["command"], *scheduler["args"]][:2] == ["dask", "scheduler"]
    assert scheduler["readinessProbe"]["httpGet"]["path"] == "/health"

    # the default group is the CPU group: no GPU asked for, no GPU resource advertised
    (cpu,) = cluster["spec"]["worker"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in json.dumps(cpu["resources"])
    assert flag_value(cpu["args"], "--resources") is None
    assert flag_value(cpu["args"], "--name") == "$(DASK_WORKER_NAME)"


def test_gpu_worker_group_asks_for_one_gpu_and_advertises_it() -> None:
    (cluster,) = by_kind("DaskCluster")
    groups = by_kind("DaskWorkerGroup")
    assert len(groups) == 1
    group = groups[0]
    assert group["apiVersion"] == "kubernetes.dask.org/v1"
    assert group["spec"]["cluster"] == cluster["metadata"]["name"]
    pod = group["spec"]["worker"]["spec"]
    (worker,) = pod["containers"]

    for section in ("limits", "requests"):
        assert int(worker["resources"][section]["nvidia.com/gpu"]) == 1, section
    args = [*worker.get("command", []), *worker["args"]]
    assert args[:2] == ["dask", "worker"]
    assert flag_value(args, "--resources") == "GPU=1"
    assert flag_value(args, "--nthreads") == "1"
    assert flag_value(args, "--name") == "$(DASK_WORKER_NAME)"

    assert pod["nodeSelector"], "GPU workers need a GPU node selector"
    assert any(t.get("key") == "nvidia.com/gpu" for t in pod["tolerations"])
    assert pod["securityContext"]["runAsNonRoot"] is True

    (pvc,) = by_kind("PersistentVolumeClaim")
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: mount for mount in worker["volumeMounts"]}
    checkpoints = mounts["/checkpoints"]
    assert checkpoints["readOnly"] is True
    claim = volumes[checkpoints["name"]]["persistentVolumeClaim"]
    assert claim == {"claimName": pvc["metadata"]["name"], "readOnly": True}


def test_env_sources_exist_and_point_at_the_scheduler_service() -> None:
    (configmap,) = by_kind("ConfigMap")
    (secret,) = by_kind("Secret")
    (cluster,) = by_kind("DaskCluster")
    refs = [ref for container in containers(k8s_objects()) for ref in container.get("envFrom", [])]
    assert refs, "no container takes its settings from the ConfigMap/Secret"
    settings = {configmap["metadata"]["name"], secret["metadata"]["name"]}
    for container in containers(k8s_objects()):
        names = {next(iter(ref.values()))["name"] for ref in container.get("envFrom", [])}
        if container["name"] == "scheduler":  # the scheduler needs no platform settings
            assert not names
        else:
            assert names == settings, container["name"]

    data = configmap["data"]
    namespace = yaml_docs(K8S / "kustomization.yaml")[0]["namespace"]
    assert data["SVFX_DASK_ADDRESS"] == (
        f"tcp://{cluster['metadata']['name']}-scheduler.{namespace}.svc.cluster.local:8786"
    )
    assert data["SVFX_CHECKPOINT_ROOT"] == "/checkpoints"
    assert data["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    assert all(isinstance(value, str) for value in data.values()), "ConfigMap values: strings"


def test_secrets_are_placeholders_and_stay_out_of_the_configmap() -> None:
    (secret,) = by_kind("Secret")
    values = secret["stringData"]
    assert {"SVFX_CATALOG_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(values)
    for key, value in values.items():
        assert "CHANGE_ME" in value, f"{key} in secret.example.yaml is not a placeholder"
    assert values["SVFX_CATALOG_URL"].startswith("postgresql+psycopg://")
    (configmap,) = by_kind("ConfigMap")
    for key in configmap["data"]:
        assert not re.search(r"SECRET|PASSWORD|TOKEN|CATALOG_URL", key), key


# ----------------------------------------------------------------------------- one image


def test_one_image_for_every_sapiens_vfx_container() -> None:
    kustomization = yaml_docs(K8S / "kustomization.yaml")[0]
    (override,) = kustomization["images"]
    k8s_images = {c["image"] for c in containers(k8s_objects())}
    assert len(list(containers(k8s_objects()))) >= 4
    assert k8s_images == {f"{IMAGE_NAME}:{override['newTag']}"}

    services = compose()["services"]
    built = {
        name: compose_default(service["image"])
        for name, service in services.items()
        if "build" in service
    }
    assert set(built) >= {"prefect-server", "scheduler", "gpu-worker", "serve"}
    assert set(built.values()) == k8s_images
    for name, service in services.items():
        image = compose_default(service["image"])
        if image.split(":")[0] == IMAGE_NAME:
            assert name in built, f"compose service {name} uses the image but cannot build it"
        else:  # third-party images are pinned
            tag = image.rsplit(":", 1)[-1]
            assert ":" in image and tag != "latest", f"{name}: unpinned image {image}"

    for service in built.values():
        assert service.startswith(IMAGE_NAME)
    build = services["gpu-worker"]["build"]
    context = (COMPOSE.parent / build["context"]).resolve()
    assert context == REPO
    assert (context / build["dockerfile"]).resolve() == DOCKERFILE


# ----------------------------------------------------------------------------- compose


def test_compose_services_and_gpu_reservation() -> None:
    services = compose()["services"]
    assert {"prefect-server", "postgres", "scheduler", "gpu-worker", "serve"} <= set(services)

    gpu = services["gpu-worker"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert len(devices) == 1
    assert devices[0]["driver"] == "nvidia"
    assert devices[0]["count"] == 1
    assert "gpu" in devices[0]["capabilities"]
    assert gpu["command"][:2] == ["worker", "tcp://scheduler:8786"]
    assert "entrypoint" not in gpu, "gpu-worker runs the image's `svfx` entrypoint"
    mounts = {compose_default(v).split(":")[1]: v for v in gpu["volumes"]}
    assert mounts["/checkpoints"].endswith(":ro")

    scheduler = services["scheduler"]
    assert scheduler["entrypoint"] == ["dask"]
    assert scheduler["command"][0] == "scheduler"
    assert flag_value(scheduler["command"], "--port") == "8786"

    serve = services["serve"]
    assert serve["command"] == ["serve"]
    for name in ("serve", "gpu-worker"):
        env = compose_env(services[name])
        assert env["PREFECT_API_URL"] == "http://prefect-server:4200/api"
        assert env["SVFX_DASK_ADDRESS"] == "tcp://scheduler:8786"
        assert env["SVFX_HOME"] == "/data"
        assert env["SVFX_CATALOG_URL"].startswith("postgresql+psycopg://")
        assert env["SVFX_CATALOG_URL"].endswith("@postgres:5432/catalog")


def test_compose_databases_prefect_and_catalog() -> None:
    services = compose()["services"]
    postgres = services["postgres"]
    major_minor = postgres["image"].split(":")[1].split("-")[0].split(".")
    version = (int(major_minor[0]), int(major_minor[1]) if len(major_minor) > 1 else 99)
    assert version >= (14, 9), "Prefect needs PostgreSQL >= 14.9"
    pg_env = compose_env(postgres)
    assert pg_env["POSTGRES_DB"] == "prefect"

    server_env = compose_env(services["prefect-server"])
    url = server_env["PREFECT_SERVER_DATABASE_CONNECTION_URL"]
    assert url.startswith("postgresql+asyncpg://") and url.endswith("@postgres:5432/prefect")
    assert server_env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"

    init = [v for v in postgres["volumes"] if "/docker-entrypoint-initdb.d/" in v]
    assert len(init) == 1
    sql = (COMPOSE.parent / compose_default(init[0]).split(":")[0]).read_text()
    assert "CREATE EXTENSION IF NOT EXISTS pg_trgm" in sql
    assert "CREATE DATABASE catalog" in sql
    # Prefect's and the catalog's databases are separate
    catalog_url = compose_env(services["serve"])["SVFX_CATALOG_URL"]
    assert catalog_url.rsplit("/", 1)[1] != url.rsplit("/", 1)[1]


def test_compose_healthchecks_and_dependencies() -> None:
    services = compose()["services"]
    for name in ("postgres", "prefect-server", "scheduler"):
        assert services[name]["healthcheck"]["test"], f"{name} has no healthcheck"
    for name, service in services.items():
        depends = service.get("depends_on", {})
        for target, rule in depends.items():
            assert target in services, f"{name} depends on unknown {target}"
            if rule.get("condition") == "service_healthy":
                assert "healthcheck" in services[target], f"{target} has no healthcheck"
            if not service.get("profiles"):
                assert not services[target].get("profiles"), (
                    f"{name} (always on) depends on {target}, which is behind a profile"
                )
    assert "s3" in services["minio"]["profiles"]


# ----------------------------------------------------------------------------- prefect


def test_prefect_deployments_entrypoints_schedule_and_pool() -> None:
    config = yaml_docs(PREFECT_YAML)[0]
    deployments = {d["name"]: d for d in config["deployments"]}
    assert set(deployments) == {"process-shot", "scan-plates"}

    expected = {
        "process-shot": ("flows/process_shot.py", "process_shot"),
        "scan-plates": ("flows/scheduled.py", "scan_plates"),
    }
    for name, (path, function) in expected.items():
        file, _, flow = deployments[name]["entrypoint"].partition(":")
        assert (file, flow) == (path, function)
        source = REPO / file
        if source.is_file():  # the flows are written alongside; check them once they exist
            assert re.search(rf"^(async )?def {function}\(", source.read_text(), re.M), (
                f"{file} has no flow function {function}"
            )

    scan = deployments["scan-plates"]
    assert [s["cron"] for s in scan["schedules"]] == ["*/15 * * * *"]
    # every parameter is one the flow takes, and the required ones are given
    import inspect

    from flows.scheduled import scan_plates

    signature = inspect.signature(scan_plates.fn)
    assert set(scan["parameters"]) <= set(signature.parameters)
    required = {n for n, p in signature.parameters.items() if p.default is inspect.Parameter.empty}
    assert required <= set(scan["parameters"])
    assert isinstance(scan["parameters"]["prefixes"], list)
    assert scan["concurrency_limit"] == 1
    assert not deployments["process-shot"].get("schedules")

    # the pull step enters the directory where the image keeps the source
    (step,) = config["pull"]
    directory = step["prefect.deployments.steps.set_working_directory"]["directory"]
    copy_dirs = {
        expand_args(rest, dockerfile_args())
        for keyword, rest in dockerfile()
        if keyword == "WORKDIR"
    }
    assert directory in copy_dirs
    assert any(
        keyword == "COPY" and rest.split()[-1] == "./flows" for keyword, rest in dockerfile()
    )

    # the same pool as the compose pool worker, and no secrets in job variables
    pool_cmd = compose()["services"]["pool-worker"]["command"]
    for deployment in deployments.values():
        pool = deployment["work_pool"]
        assert pool["name"] == flag_value(pool_cmd, "--pool")
        env = pool["job_variables"]["env"]
        assert env["SVFX_DASK_ADDRESS"] == "tcp://scheduler:8786"
        assert not {"SVFX_CATALOG_URL", "AWS_SECRET_ACCESS_KEY"} & set(env)


# ----------------------------------------------------------------------------- dockerfile


def test_dockerfile_installs_cuda_torch_before_the_project() -> None:
    instructions = dockerfile()
    args = dockerfile_args()
    assert instructions[0] == ("ARG", "BASE_IMAGE=" + args["BASE_IMAGE"])
    assert args["BASE_IMAGE"].startswith("nvidia/cuda:")
    assert [kw for kw, _ in instructions].count("FROM") == 1

    runs = [(i, rest) for i, (kw, rest) in enumerate(instructions) if kw == "RUN"]
    torch = [i for i, rest in runs if "torch==${TORCH_VERSION}" in rest]
    project = [i for i, rest in runs if re.search(r"pip install \"?/app\[", rest)]
    assert len(torch) == 1 and len(project) == 1
    assert torch[0] < project[0], "torch's CUDA build must be installed before the project"
    torch_run = instructions[torch[0]][1]
    assert "--index-url" in torch_run and "${TORCH_INDEX_URL}" in torch_run
    assert args["TORCH_INDEX_URL"].startswith("https://download.pytorch.org/whl/cu")
    assert args["TORCH_VERSION"]
    assert "[gpu]" in expand_args(instructions[project[0]][1], args)


def test_dockerfile_user_entrypoint_and_copied_packages() -> None:
    instructions = dockerfile()
    args = dockerfile_args()
    users = [expand_args(rest, args) for kw, rest in instructions if kw == "USER"]
    assert users, "the image must not run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0") and "$" not in user
    assert [kw for kw, _ in instructions].index("USER") > max(
        i for i, (kw, _) in enumerate(instructions) if kw == "RUN"
    ), "USER must come after the last RUN"

    (entrypoint,) = [json.loads(rest) for kw, rest in instructions if kw == "ENTRYPOINT"]
    assert entrypoint[-1] == "svfx"
    env = " ".join(rest for kw, rest in instructions if kw == "ENV")
    assert "SVFX_HOME=/data" in env

    copied = set()
    for keyword, rest in instructions:
        if keyword == "COPY":
            parts = [p for p in shlex.split(rest) if not p.startswith("--")]
            for source in parts[:-1]:
                assert (REPO / source).exists(), f"COPY {source}: not in the repository"
                copied.add(source)
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = {
        p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    assert packages <= copied, f"packages not copied into the image: {packages - copied}"
    assert "pyproject.toml" in copied


# ----------------------------------------------------------------------------- slurm


def test_slurm_script_compiles(tmp_path: Path) -> None:
    py_compile.compile(str(SLURM_SCRIPT), cfile=str(tmp_path / "slurm_cluster.pyc"), doraise=True)


def test_slurm_cluster_kwargs(slurm: ModuleType) -> None:
    options = slurm.parse_args(
        [
            "--queue=gpu",
            "--account=vfx",
            "--venv=/shared/venvs/svfx/",
            "--directive=--constraint=a100",
            "--prologue=module load cuda/12.8",
        ]
    )
    environ = {
        "SVFX_CHECKPOINT_ROOT": "/shared/sapiens2 weights",
        "SVFX_OUTPUT_ROOT": "s3://svfx-outputs",
        "AWS_SECRET_ACCESS_KEY": "do-not-copy",
        "SVFX_CATALOG_URL": "postgresql+psycopg://svfx:pw@db/catalog",
    }
    kwargs = slurm.cluster_kwargs(options, environ)
    assert kwargs["queue"] == "gpu" and kwargs["account"] == "vfx"
    assert kwargs["processes"] == 1
    assert kwargs["cores"] == 8
    assert kwargs["job_extra_directives"] == ["--gres=gpu:1", "--constraint=a100"]
    extra = kwargs["worker_extra_args"]
    assert flag_value(extra, "--resources") == "GPU=1"
    assert flag_value(extra, "--nthreads") == "1"
    assert "TMPDIR" in kwargs["local_directory"]
    assert kwargs["python"] == "/shared/venvs/svfx/bin/python"
    prologue = kwargs["job_script_prologue"]
    assert prologue[0] == "module load cuda/12.8"
    assert "source /shared/venvs/svfx/bin/activate" in prologue
    assert "export SVFX_CHECKPOINT_ROOT='/shared/sapiens2 weights'" in prologue
    assert "export SVFX_OUTPUT_ROOT=s3://svfx-outputs" in prologue
    script = "\n".join(prologue)
    assert "do-not-copy" not in script and "SVFX_CATALOG_URL" not in script
    assert kwargs["scheduler_options"]["port"] == 8786
    json.dumps(kwargs)  # --dry-run prints it


def test_slurm_options_from_environment_and_validation(
    slurm: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SVFX_SLURM_QUEUE", "farm")
    monkeypatch.setenv("SVFX_SLURM_GRES", "gpu:a100:1")
    monkeypatch.setenv("SVFX_SLURM_CORES", "12")
    kwargs = slurm.cluster_kwargs(slurm.parse_args([]), {})
    assert kwargs["queue"] == "farm"
    assert kwargs["cores"] == 12
    assert kwargs["job_extra_directives"] == ["--gres=gpu:a100:1"]

    with pytest.raises(SystemExit):
        slurm.parse_args(["--gres=gpu:2"])
    with pytest.raises(ValueError, match="secrets"):
        slurm.cluster_kwargs(slurm.parse_args(["--env=AWS_SECRET_ACCESS_KEY=x"]), {})


def test_slurm_main_without_dask_jobqueue(
    slurm: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert slurm.main(["--queue=gpu", "--jobs=4", "--dry-run"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["job_extra_directives"] == ["--gres=gpu:1"]
    with pytest.raises(SystemExit, match="dask-jobqueue"):
        slurm.main(["--queue=gpu", "--jobs=4"])


def test_sbatch_worker_script() -> None:
    text = (INFRA / "slurm" / "gpu-worker.sbatch").read_text()
    assert text.startswith("#!/bin/bash")
    assert re.search(r"^#SBATCH --gres=gpu:1$", text, re.M)
    assert re.search(r'^exec svfx worker "\$SVFX_DASK_ADDRESS"', text, re.M)


def test_local_readme_shows_the_plain_dask_equivalents() -> None:
    text = (INFRA / "local" / "README.md").read_text()
    for needle in ("svfx cluster", "svfx worker", "dask scheduler", "dask worker"):
        assert needle in text, needle
    assert text.count("--resources GPU=1") >= 2
