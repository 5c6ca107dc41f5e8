"""The deployment files under infra/: every YAML parses and meets the schema of what it
declares (Kubernetes' own, the dask-kubernetes CRDs', the Compose Specification's, and the
fields kustomize and `prefect deploy` read; a planted typo shows each checker catches one),
and the facts that must agree between them (and with the code) do: GPU resources, one image,
compose services, Prefect entrypoints, the Dockerfile's install order and user, the Slurm job
options, a README in every folder.

Fast and offline: no Docker, no Kubernetes, no Slurm, no dask-jobqueue."""

from __future__ import annotations

import importlib.resources
import importlib.util
import inspect
import json
import py_compile
import re
import shlex
import shutil
import sys
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from referencing import Registry, Resource

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
        "SVFX_SLURM_GPUS_PER_JOB",
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


# ----------------------------------------------------------------------------- schemas
# Every document under infra/ against the schema of what it declares: Kubernetes' built-in
# kinds against Kubernetes' own JSON schemas (kubernetes-validate, strict: unknown fields
# fail, as `kubectl apply`'s server-side field validation does), the dask-kubernetes CRDs
# against their vendored openAPIV3Schema (tests/schemas/, with Kubernetes' PodSpec and
# ServiceSpec inside), the compose file against the Compose Specification's schema, and the
# Kustomization and prefect.yaml against the fields kustomize and `prefect deploy` read. Each
# checker returns problems as text (empty: valid), so a planted typo can be shown to fail.

# The Kubernetes release the manifests must be valid for (kubernetes-validate's schemas).
K8S_VERSION = "1.37.0"
K8S_DEFINITIONS = "https://kubernetes.io/api/_definitions.json"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
DASK_API = "kubernetes.dask.org/v1"
DASK_KINDS = ("DaskCluster", "DaskWorkerGroup")  # the CRDs in tests/schemas/
# The Kustomization fields kustomize (v5, kustomize.config.k8s.io/v1beta1) knows.
KUSTOMIZATION_FIELDS = frozenset(
    {
        "apiVersion", "kind", "metadata", "openapi", "namePrefix", "nameSuffix", "namespace",
        "commonLabels", "labels", "commonAnnotations", "patches", "patchesStrategicMerge",
        "patchesJson6902", "images", "replacements", "replicas", "vars", "sortOptions",
        "resources", "crds", "bases", "components", "configMapGenerator", "secretGenerator",
        "generatorOptions", "helmGlobals", "helmCharts", "configurations", "generators",
        "transformers", "validators", "buildMetadata",
    }
)  # fmt: skip
KUSTOMIZATION_IMAGE_FIELDS = frozenset({"name", "newName", "newTag", "digest", "tagSuffix"})
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
PORT_NAME = re.compile(r"^(?=.{1,15}$)(?=.*[a-z])[a-z0-9]+(-[a-z0-9]+)*$")  # IANA_SVC_NAME
COMPOSE_PORT = re.compile(
    r"^(?:(?:\[[0-9a-fA-F:]+\]|[0-9.]+):)?(?:(\d+(?:-\d+)?):)?(\d+(?:-\d+)?)(?:/(tcp|udp|sctp))?$"
)
COMPOSE_VOLUME_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")


def json_schema_problems(validator: jsonschema.protocols.Validator, doc: Any) -> list[str]:
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors]


def kubernetes_problems(doc: dict[str, Any]) -> list[str]:
    """A built-in kind against Kubernetes' schema (strict), then what the API server checks
    beyond the schema in its pods."""
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [exc.message]
    except kubernetes_validate.ValidationError as exc:  # it stops at the first: list them all
        where = ".".join(map(str, exc.absolute_path)) or "(top)"
        return json_schema_problems(kubernetes_validator(doc), doc) or [f"{where}: {exc.message}"]
    spec = doc.get("spec") or {}
    problems = []
    if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        labels = spec["template"].get("metadata", {}).get("labels", {})
        selector = spec.get("selector", {}).get("matchLabels", {})
        if doc["kind"] != "Job" and not selector.items() <= labels.items():
            problems.append(f"spec.selector {selector} does not match the template's labels")
        problems += pod_problems(spec["template"]["spec"], "spec.template.spec")
    return problems


def pod_problems(pod: dict[str, Any], where: str) -> list[str]:
    """Cross-references inside a PodSpec that its schema cannot express."""
    problems = []
    volumes = {volume["name"] for volume in pod.get("volumes", [])}
    all_containers = [*pod.get("initContainers", []), *pod.get("containers", [])]
    names = [container["name"] for container in all_containers]
    if len(names) != len(set(names)):
        problems.append(f"{where}: container names repeat: {names}")
    for container in all_containers:
        at = f"{where}.containers[{container['name']}]"
        for mount in container.get("volumeMounts", []):
            if mount["name"] not in volumes:
                problems.append(f"{at}: volumeMount {mount['name']!r} names no volume")
        ports = {port.get("name") for port in container.get("ports", [])} - {None}
        for name in sorted(ports):
            if not PORT_NAME.match(name):
                problems.append(f"{at}: port name {name!r} is not an IANA service name")
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            check = container.get(probe, {})
            action = check.get("httpGet") or check.get("tcpSocket")
            if action and isinstance(action["port"], str) and action["port"] not in ports:
                problems.append(f"{at}: {probe} port {action['port']!r} is not a named port")
    return problems


def kubernetes_schema(name: str) -> Any:
    """One of the strict schema files kubernetes-validate ships for K8S_VERSION."""
    folder = f"v{'.'.join(K8S_VERSION.split('.')[:2])}.0-local-strict"
    files = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema" / folder
    return json.loads((files / name).read_text())


@cache
def kubernetes_registry() -> Registry:
    """Kubernetes' definitions, found by their $id (https://kubernetes.io/api/...)."""
    return Resource.from_contents(kubernetes_schema("_definitions.json")) @ Registry()


def kubernetes_validator(doc: dict[str, Any]) -> jsonschema.protocols.Validator:
    """The schema kubernetes_validate.validate picks for a document (named as it names
    them: apps/v1 Deployment -> deployment-apps-v1.json), to list every error, not the first."""
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", doc["apiVersion"])
    schema = kubernetes_schema(f"{doc['kind'].lower()}-{group_version}.json")
    return jsonschema.Draft202012Validator(schema, registry=kubernetes_registry())


@cache
def dask_crd_validator(kind: str) -> jsonschema.protocols.Validator:
    """The vendored CRD schema made strict (as the API server's Strict field validation:
    unknown fields are errors, not pruned), with apiVersion/kind/metadata, which the API
    server checks for every custom resource, and Kubernetes' definitions for its $refs."""

    def strict(node: Any) -> Any:
        if isinstance(node, list):
            return [strict(item) for item in node]
        if not isinstance(node, dict):
            return node
        out = {key: strict(value) for key, value in node.items()}
        if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
        return out

    schema = strict(yaml_docs(SCHEMAS / "dask-kubernetes-crds.yaml")[0][kind])
    schema["properties"].update(
        apiVersion={"const": DASK_API},
        kind={"const": kind},
        metadata={
            "$ref": f"{K8S_DEFINITIONS}#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
        },
    )
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
    return jsonschema.Draft202012Validator(schema, registry=kubernetes_registry())


def dask_problems(doc: dict[str, Any]) -> list[str]:
    """A DaskCluster / DaskWorkerGroup against the operator's CRD, and its pods' references."""
    if doc.get("apiVersion") != DASK_API or doc.get("kind") not in DASK_KINDS:
        return [f"no CRD schema for {doc.get('kind')} {doc.get('apiVersion')}"]
    problems = json_schema_problems(dask_crd_validator(doc["kind"]), doc)
    if problems:
        return problems
    spec = doc["spec"]
    problems += pod_problems(spec["worker"]["spec"], "spec.worker.spec")
    if doc["kind"] == "DaskCluster":
        scheduler = spec["scheduler"]
        problems += pod_problems(scheduler["spec"], "spec.scheduler.spec")
        ports = {p.get("name") for c in scheduler["spec"]["containers"] for p in c.get("ports", [])}
        for port in scheduler["service"].get("ports", []):
            target = port.get("targetPort")
            if isinstance(target, str) and target not in ports:
                problems.append(
                    f"spec.scheduler.service: targetPort {target!r} is no scheduler port"
                )
    return problems


def kustomization_problems(doc: dict[str, Any], folder: Path) -> list[str]:
    """The fields `kubectl apply -k` reads: known keys only, resources that exist, a namespace
    that is a valid name (and the Namespace listed, if one is), image overrides that match
    the images the manifests use."""
    problems = [
        f"unknown Kustomization field {key!r}" for key in doc if key not in KUSTOMIZATION_FIELDS
    ]
    if doc.get("kind") != "Kustomization":
        problems.append(f"kind is {doc.get('kind')!r}, not Kustomization")
    resources = doc.get("resources")
    if not isinstance(resources, list) or not resources:
        return [*problems, "no resources listed"]
    if len(resources) != len(set(resources)):
        problems.append("a resource is listed twice")
    objects = []
    for resource in resources:
        path = folder / resource
        if path.is_file():
            objects += yaml_docs(path)
        elif not (path / "kustomization.yaml").is_file():
            problems.append(f"resource {resource!r} is not a file or a kustomization folder")
    namespace = doc.get("namespace")
    if namespace is not None and not DNS_LABEL.match(str(namespace)):
        problems.append(f"namespace {namespace!r} is not a DNS label")
    declared = {o["metadata"]["name"] for o in objects if o.get("kind") == "Namespace"}
    if declared and namespace not in declared:
        problems.append(f"namespace {namespace!r} is not the Namespace listed ({declared})")
    used = {c["image"].rsplit(":", 1)[0] for c in containers(objects) if "image" in c}
    for image in doc.get("images", []):
        problems += [
            f"unknown images field {key!r}"
            for key in image
            if key not in KUSTOMIZATION_IMAGE_FIELDS
        ]
        if image.get("name") not in used:
            problems.append(f"image override {image.get('name')!r} matches no container image")
    return problems


@cache
def compose_validator() -> jsonschema.protocols.Validator:
    return jsonschema.Draft202012Validator(json.loads((SCHEMAS / "compose-spec.json").read_text()))


def interpolated(node: Any) -> Any:
    """The compose file as `docker compose` validates it: variables replaced (by their
    defaults here)."""
    if isinstance(node, dict):
        return {key: interpolated(value) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolated(item) for item in node]
    return compose_default(node) if isinstance(node, str) else node


def compose_problems(raw: dict[str, Any], folder: Path) -> list[str]:
    """The Compose Specification's schema, then what the recipe relies on that the schema
    cannot say: each service has an image or a build whose Dockerfile exists, env files
    exist (or, optional ones, their .example), depends_on names services, named volumes are
    declared, literal bind sources exist, and ports are well formed."""
    doc = interpolated(raw)
    problems = json_schema_problems(compose_validator(), doc)
    if problems:
        return problems
    services = doc["services"]
    volumes = set(doc.get("volumes") or {})
    for name, service in services.items():
        at = f"services.{name}"
        if "image" not in service and "build" not in service:
            problems.append(f"{at}: neither image nor build")
        build = service.get("build")
        if isinstance(build, dict):
            context = folder / build.get("context", ".")
            if not (context / build.get("dockerfile", "Dockerfile")).is_file():
                problems.append(f"{at}.build: no {build.get('dockerfile')} under {context}")
        env_files = service.get("env_file") or []
        for entry in [env_files] if isinstance(env_files, str | dict) else env_files:
            path, required = (
                (entry, True)
                if isinstance(entry, str)
                else (entry["path"], entry.get("required", True))
            )
            file = folder / path
            if not file.is_file() and (
                required or not file.with_name(file.name + ".example").is_file()
            ):
                problems.append(f"{at}.env_file: {path} does not exist")
        for target in service.get("depends_on") or []:
            if target not in services:
                problems.append(f"{at}.depends_on: no service {target!r}")
        for index, volume in enumerate(service.get("volumes") or []):
            raw_volume = (raw["services"][name].get("volumes") or [])[index]
            if isinstance(volume, dict):
                source = volume.get("source", "") if volume.get("type") == "volume" else ""
                if source and source not in volumes:
                    problems.append(f"{at}.volumes: named volume {source!r} is not declared")
                continue
            source = volume.split(":")[0]
            if COMPOSE_VOLUME_NAME.match(source):  # a named volume
                if source not in volumes:
                    problems.append(f"{at}.volumes: named volume {source!r} is not declared")
            elif "$" not in raw_volume.split(":")[0] and not (folder / source).exists():
                problems.append(f"{at}.volumes: bind source {source} does not exist")
        for port in service.get("ports") or []:
            if isinstance(port, dict):
                continue  # the long syntax: the schema checks it
            match = COMPOSE_PORT.match(str(port))
            numbers = [
                int(n) for g in (match.groups()[:2] if match else ()) if g for n in g.split("-")
            ]
            if not match or not all(0 < n < 65536 for n in numbers):
                problems.append(f"{at}.ports: {port!r} is not [IP:]HOST:CONTAINER[/PROTOCOL]")
    return problems


def prefect_problems(doc: dict[str, Any]) -> list[str]:
    """What `prefect deploy` and a work-pool worker read: Prefect's own prefect.yaml models
    (their fields only: Prefect ignores unknown keys silently), pull steps that import and take
    the arguments given, the process pool's job variables, and per deployment: the same name
    and flow as one `svfx serve` serves, an entrypoint naming that flow, parameters the flow
    takes (with its types), and every required one given when the deployment is scheduled."""
    from prefect.cli.deploy._models import (
        DeploymentConfig,
        PrefectYamlModel,
        RawScheduleConfig,
        WorkPoolConfig,
    )
    from prefect.flows import Flow, load_flow_from_entrypoint
    from prefect.utilities.schema_tools import ValidationError as ParameterError
    from prefect.utilities.schema_tools import validate as validate_parameters
    from prefect.workers.process import ProcessWorker
    from pydantic import ValidationError

    from flows.scheduled import deployments as served_deployments
    from schemas.settings import Settings

    def fields(model: type[Any]) -> set[str]:
        return {f.alias or name for name, f in model.model_fields.items()}

    problems = [
        f"unknown prefect.yaml field {k!r}"
        for k in doc
        if k not in fields(PrefectYamlModel) | {"definitions"}
    ]
    try:
        PrefectYamlModel.model_validate(doc)
    except ValidationError as exc:
        return [*problems, f"prefect.yaml: {exc}"]
    for section in ("build", "push", "pull"):
        for step in doc.get(section) or []:
            ((target, arguments),) = step.items()
            module, _, function = target.rpartition(".")
            try:
                step_fn = getattr(importlib.import_module(module), function)
            except (ImportError, AttributeError):
                problems.append(f"{section}: step {target} does not import")
                continue
            try:
                inspect.signature(step_fn).bind(**(arguments or {}))
            except TypeError as exc:
                problems.append(f"{section}: {target}{tuple(arguments or {})}: {exc}")

    served = {d.name: d for d in served_deployments(Settings(scan_prefixes=["s3://bucket/prefix"]))}
    names = [d.get("name") for d in doc.get("deployments", [])]
    if sorted(map(str, names)) != sorted(served):
        problems.append(
            f"deployments {names} are not the ones `svfx serve` serves: {sorted(served)}"
        )
    for deployment in doc.get("deployments", []):
        at = f"deployments.{deployment.get('name')}"
        problems += [
            f"{at}: unknown field {k!r}" for k in deployment if k not in fields(DeploymentConfig)
        ]
        pool = deployment.get("work_pool") or {}
        problems += [
            f"{at}.work_pool: unknown field {k!r}" for k in pool if k not in fields(WorkPoolConfig)
        ]
        variables = ProcessWorker.job_configuration_variables
        job_variables = pool.get("job_variables") or {}
        problems += [
            f"{at}.work_pool.job_variables: unknown {k!r}"
            for k in job_variables
            if k not in fields(variables)
        ]
        try:
            variables.model_validate(job_variables)
        except ValidationError as exc:
            problems.append(f"{at}.work_pool.job_variables: {exc}")
        for schedule in deployment.get("schedules") or []:
            problems += [
                f"{at}.schedules: unknown field {k!r}"
                for k in schedule
                if k not in fields(RawScheduleConfig)
            ]

        file, _, function = str(deployment.get("entrypoint", "")).partition(":")
        if not (REPO / file).is_file() or not function:
            problems.append(f"{at}: entrypoint {deployment.get('entrypoint')!r} is not FILE:FLOW")
            continue
        try:
            flow = load_flow_from_entrypoint(f"{REPO / file}:{function}")
        except Exception as exc:  # whatever importing the entrypoint raises
            problems.append(f"{at}: entrypoint {file}:{function} does not load: {exc!r}")
            continue
        if not isinstance(flow, Flow):
            problems.append(f"{at}: {file}:{function} is not a flow")
            continue
        twin = served.get(deployment.get("name"))
        if twin is not None and twin.flow_name != flow.name:
            problems.append(f"{at}: runs flow {flow.name!r}, `svfx serve` runs {twin.flow_name!r}")
        schema = flow.parameters.model_dump(mode="json")
        parameters = deployment.get("parameters") or {}
        unknown = set(parameters) - set(schema["properties"])
        problems += [
            f"{at}.parameters: {function} takes no parameter {k!r}" for k in sorted(unknown)
        ]
        if deployment.get("schedules"):
            missing = set(schema.get("required", [])) - set(parameters)
            problems += [f"{at}.parameters: scheduled runs need {k!r}" for k in sorted(missing)]
        try:
            validate_parameters(parameters, schema, raise_on_error=True, ignore_required=True)
        except ParameterError as exc:
            problems.append(f"{at}.parameters: {exc}")
    return problems


def infra_problems(path: Path) -> list[str]:
    """Every problem in every document of an infra YAML file, each naming the document; a
    document no checker recognises is a problem too (a new kind of file needs a checker)."""
    problems = []
    for number, doc in enumerate(yaml_docs(path), 1):
        if not isinstance(doc, dict):
            problems.append(f"{path.name} #{number}: not a mapping")
            continue
        api = str(doc.get("apiVersion", ""))
        label = f"{path.name} #{number} {doc.get('kind', '')}".rstrip()
        if api.startswith("kustomize.config.k8s.io/"):
            found = kustomization_problems(doc, path.parent)
        elif api.startswith("kubernetes.dask.org/"):
            found = dask_problems(doc)
        elif api and "kind" in doc:
            found = kubernetes_problems(doc)
        elif "services" in doc:
            found = compose_problems(doc, path.parent)
        elif "deployments" in doc and "prefect-version" in doc:
            found = prefect_problems(doc)
        else:
            found = ["no checker knows what this document declares"]
        problems += [f"{label}: {problem}" for problem in found]
    return problems


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: p.relative_to(INFRA).as_posix())
def test_every_infra_yaml_meets_the_schema_of_what_it_declares(path: Path) -> None:
    assert infra_problems(path) == []


# (file, text in it, what a copy of infra/ gets instead, a word the checker must report)
PLANTED = [
    ("kubernetes/serve.yaml", "containers:", "contianers:", "contianers"),
    ("kubernetes/configmap.yaml", "\ndata:", "\ndta:", "'dta'"),
    ("kubernetes/checkpoints-pvc.yaml", "accessModes:", "accesModes:", "accesModes"),
    ("kubernetes/daskcluster.yaml", "readinessProbe:", "readinesProbe:", "readinesProbe"),
    ("kubernetes/daskcluster.yaml", "  worker:", "  workers:", "workers"),
    ("kubernetes/gpu-workergroup.yaml", "containers:", "contianers:", "contianers"),
    ("kubernetes/gpu-workergroup.yaml", "mountPath: /dev", "mountpath: /dev", "mountpath"),
    ("kubernetes/gpu-workergroup.yaml", "name: dshm", "name: shm", "'shm'"),
    ("kubernetes/kustomization.yaml", "  - serve.yaml", "  - serve.yml", "serve.yml"),
    ("kubernetes/kustomization.yaml", "images:", "image:", "image"),
    ("compose/compose.yaml", "    depends_on:", "    depend_on:", "depend_on"),
    ("compose/compose.yaml", "      postgres:\n", "      postgre:\n", "postgre"),
    ("compose/compose.yaml", "- svfx-data:/data", "- svfx-dat:/data", "svfx-dat"),
    ("prefect/prefect.yaml", "py:scan_plates", "py:scan_plate", "scan_plate"),
    ("prefect/prefect.yaml", "      settle_s:", "      settle:", "settle"),
    ("prefect/prefect.yaml", "    work_pool: *farm", "    workpool: *farm", "workpool"),
    ("prefect/prefect.yaml", "work_queue_name:", "work_queue:", "work_queue"),
]


@pytest.mark.parametrize(
    ("name", "text", "planted", "reported"), PLANTED, ids=[f"{c[0]}:{c[3]}" for c in PLANTED]
)
def test_a_planted_mistake_is_reported(
    name: str, text: str, planted: str, reported: str, tmp_path: Path
) -> None:
    """The check of the checker: the same file with one field misspelt (or one reference
    broken) in a copy of infra/ has problems, and they name it."""
    copy = tmp_path / "infra"
    shutil.copytree(INFRA, copy)
    path = copy / name
    original = path.read_text()
    assert text in original, f"{name} no longer contains {text!r}: update the case"
    path.write_text(original.replace(text, planted, 1))
    problems = infra_problems(path)
    assert problems, f"{name}: {planted!r} went unnoticed"
    assert any(reported in problem for problem in problems), problems


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


def test_slurm_cpu_only_workers_have_no_gres_and_no_gpu_resource(slurm: ModuleType) -> None:
    options = slurm.parse_args(["--queue=cpu", "--gpus-per-job=0", "--directive=--exclusive"])
    kwargs = slurm.cluster_kwargs(options, {})
    assert kwargs["job_extra_directives"] == ["--exclusive"]
    extra = kwargs["worker_extra_args"]
    assert flag_value(extra, "--resources") is None and flag_value(extra, "--nthreads") == "1"
    with pytest.raises(SystemExit):
        slurm.parse_args(["--gpus-per-job=2"])


def test_slurm_cpu_jobs_carry_the_node_thread_plan(
    slurm: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--gpus-per-job 0: each job's --cores are shared as tasks/node_threads.py plans them
    (workers per job, torch threads, a core for reading and encoding), in the job script
    dask-jobqueue writes; more threads than --cores is refused in one line, exit 2."""
    for name in ("SVFX_CPU_WORKERS", "SVFX_TORCH_THREADS", "SVFX_EXR_THREADS"):
        monkeypatch.delenv(name, raising=False)
    options = slurm.parse_args(["--queue=cpu", "--gpus-per-job=0", "--cores=32", "--memory=128GB"])
    kwargs = slurm.cluster_kwargs(options, {})
    assert kwargs["processes"] == 2 and kwargs["cores"] == 32
    monkeypatch.delitem(sys.modules, "dask_jobqueue")  # the fixture's block, for the script
    slurm_job = pytest.importorskip("dask_jobqueue.slurm").SLURMJob
    del kwargs["scheduler_options"]  # the cluster's, not the job's
    script = slurm_job(scheduler="tcp://head:8786", name="w", **kwargs).job_script()
    assert re.search(r"^#SBATCH --cpus-per-task=32$", script, re.M), script
    line = (
        "CPU node: 32 cores (--cores per Slurm job): 2 workers x 15 torch threads, 1 core "
        "each for reading and encoding"
    )
    assert f"echo '{line}'" in script
    for export in ("SVFX_CPU_WORKERS=2", "SVFX_TORCH_THREADS=15", "SVFX_EXR_THREADS=1"):
        assert re.search(rf"^export {export}$", script, re.M), export
    (command,) = [row for row in script.splitlines() if "distributed.cli.dask_worker" in row]
    args = command.split()
    assert flag_value(args, "--nworkers") == "2"
    assert flag_value(args, "--nthreads") == "1"  # after jobqueue's cores/processes: it wins
    assert "--resources" not in args

    # an override from --env or the environment (Slurm passes it to the job) is kept
    options = slurm.parse_args(["--gpus-per-job=0", "--cores=16", "--env=SVFX_TORCH_THREADS=8"])
    prologue = slurm.cluster_kwargs(options, {"SVFX_CPU_WORKERS": "2"})["job_script_prologue"]
    assert "export SVFX_CPU_WORKERS=2" in prologue and "export SVFX_TORCH_THREADS=8" in prologue
    assert prologue.count("export SVFX_TORCH_THREADS=8") == 1

    # and a GPU job has none of it
    gpu = slurm.cluster_kwargs(slurm.parse_args(["--cores=32"]), {})
    assert gpu["processes"] == 1
    assert not [row for row in gpu["job_script_prologue"] if "SVFX_TORCH_THREADS" in row]


def test_slurm_cpu_jobs_with_more_threads_than_cores_are_refused(
    slurm: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--gpus-per-job=0", "--cores=8", "--env=SVFX_TORCH_THREADS=12", "--dry-run"]
    assert slurm.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "error: 1 CPU worker x 12 torch threads = 12 threads, more than 8 cores "
        "(--cores per Slurm job)\n"
    )


def test_slurm_refused_submission_is_one_line_naming_the_partition(
    slurm: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What Slurm 22.05's `sbatch --test-only` prints for a partition that does not exist
    (tests/test_slurm.py checks it against a real one)."""
    fake = tmp_path / "sbatch"
    fake.write_text(
        "#!/bin/sh\necho 'sbatch: error: invalid partition specified: nosuch' >&2\n"
        "echo 'allocation failure: Invalid partition name specified' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")

    class Cluster:
        def job_script(self) -> str:
            return "#!/usr/bin/env bash\n#SBATCH -p nosuch\n"

    with pytest.raises(slurm.SubmitError) as raised:
        slurm.check_submission(Cluster(), "nosuch")
    assert str(raised.value) == (
        "Slurm refuses the worker job for partition 'nosuch': invalid partition specified: "
        "nosuch; allocation failure: Invalid partition name specified"
    )


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
