"""Reading and validating the deploy/ tree offline: YAML documents, kustomize renderings, schemas.

Kubernetes kinds are validated with kubernetes-validate (strict: no unknown fields) against the
oldest and the newest Kubernetes release it bundles; KServe kinds against the `kserve` package's
model classes, walked strictly (unknown fields, wrong types and missing required fields fail).
"""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tooling.paths import REPO

DEPLOY = REPO / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
KSERVE = DEPLOY / "kserve"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
OVERLAYS = ("cpu", "gpu")
# KServe: Serverless (Knative) and RawDeployment, each a kustomization under deploy/kserve, on CPUs and on GPUs.
KSERVE_CPU_MODES = ("serverless", "raw-deployment")
KSERVE_GPU_MODES = ("serverless-gpu", "raw-deployment-gpu")
KSERVE_MODES = KSERVE_CPU_MODES + KSERVE_GPU_MODES
# The committed GPU measurement (scripts.benchmark --device cuda, docs/benchmarks.md#gpu): every GPU figure
# in deploy/, tooling/ and the docs is read from it by the tests.
GPU_BENCHMARK = REPO / "docs" / "bench-gpu" / "benchmark.json"
KSERVE_GROUP = "serving.kserve.io"
# The oldest and newest Kubernetes releases kubernetes-validate bundles schemas for.
KUBERNETES_VERSIONS = ("1.25", "1.37")


def documents(path: Path) -> list[dict]:
    """The YAML documents of a manifest file (empty ones skipped)."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def manifest_files() -> list[Path]:
    """Every complete manifest: the kustomize base, the components and the KServe resources.

    The overlays hold partial patches, validated through their kustomize renderings (render()).
    """
    roots = (KUBERNETES / "base", KUBERNETES / "components", KSERVE / "serverless")
    return sorted(path for root in roots for path in root.rglob("*.yaml") if path.name != "kustomization.yaml")


def kubectl() -> str:
    return str(Path(sys.executable).with_name("kubectl"))


@cache
def render(overlay: str) -> tuple[dict, ...]:
    """`kubectl kustomize` of an overlay (offline: kustomize needs no cluster)."""
    return kustomize(KUBERNETES / "overlays" / overlay)


@cache
def render_kserve(mode: str) -> tuple[dict, ...]:
    """`kubectl kustomize` of a KServe mode (KSERVE_MODES)."""
    return kustomize(KSERVE / mode)


def kustomize(directory: Path) -> tuple[dict, ...]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60, check=True
    )
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def queue_proxy(mode: str) -> bool:
    """Knative's queue-proxy sits beside TorchServe in Serverless pods, never in RawDeployment's."""
    return mode.startswith("serverless")


@cache
def gpu_cells() -> tuple[dict, ...]:
    """The served cells of the committed GPU measurement (fails while it is not committed)."""
    import json

    assert GPU_BENCHMARK.is_file(), f"{GPU_BENCHMARK.relative_to(REPO)} is not committed: no GPU figure is backed"
    cells = tuple(cell for cell in json.loads(GPU_BENCHMARK.read_text())["served"] if cell["device"] == "cuda")
    assert cells, f"{GPU_BENCHMARK.relative_to(REPO)} holds no cell served on cuda"
    return cells


def by_kind(docs, kind: str) -> list[dict]:
    return [doc for doc in docs if doc.get("kind") == kind]


def one(docs, kind: str) -> dict:
    [doc] = by_kind(docs, kind)
    return doc


# ---- Kubernetes ----------------------------------------------------------------------------------


def validate_kubernetes(doc: dict) -> None:
    """Strict schema validation at every version in KUBERNETES_VERSIONS; raises on any problem.

    A kind without a bundled schema raises SchemaNotFoundError: every kind validated here is a core one.
    """
    import kubernetes_validate

    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


# ---- KServe --------------------------------------------------------------------------------------


class KServeSchemaError(ValueError):
    pass


_LIST = re.compile(r"^[Ll]ist\[(.*)\]$")
_DICT = re.compile(r"^[Dd]ict[(\[]([^,]*), (.*)[)\]]$")  # dict(str, T) (kserve) or Dict[str, T] (kubernetes)
_PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float)}


def _model_class(name: str):
    import kserve
    import kubernetes.client

    for module in (kserve, kubernetes.client):
        if hasattr(module, name):
            return getattr(module, name)
    raise KServeSchemaError(f"no model class {name}")


def _build(type_name: str, value: Any, where: str) -> Any:
    """Turn a YAML value into an instance of `type_name`, strictly."""
    if match := _LIST.match(type_name):
        if not isinstance(value, list):
            raise KServeSchemaError(f"{where}: expected a list, got {value!r}")
        return [_build(match[1], item, f"{where}[{i}]") for i, item in enumerate(value)]
    if match := _DICT.match(type_name):
        if not isinstance(value, dict):
            raise KServeSchemaError(f"{where}: expected a mapping, got {value!r}")
        return {key: _build(match[2], item, f"{where}.{key}") for key, item in value.items()}
    if type_name == "object":  # IntOrString and free-form fields
        return value
    if type_name in _PRIMITIVES:
        if (isinstance(value, bool) and type_name != "bool") or not isinstance(value, _PRIMITIVES[type_name]):
            raise KServeSchemaError(f"{where}: expected {type_name}, got {value!r}")
        return value
    cls = _model_class(type_name)
    if not isinstance(value, dict):
        raise KServeSchemaError(f"{where}: expected a {type_name} mapping, got {value!r}")
    by_json_name = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    unknown = sorted(set(value) - set(by_json_name))
    if unknown:
        raise KServeSchemaError(f"{where}: unknown field(s) {unknown} for {type_name}")
    kwargs = {
        by_json_name[key]: _build(cls.openapi_types[by_json_name[key]], item, f"{where}.{key}")
        for key, item in value.items()
    }
    try:
        return cls(**kwargs)  # the generated setters check required fields and enumerations
    except (TypeError, ValueError) as exc:
        raise KServeSchemaError(f"{where}: {exc}") from exc


KSERVE_KINDS = {
    ("serving.kserve.io/v1beta1", "InferenceService"): "V1beta1InferenceService",
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "V1alpha1ServingRuntime",
    ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): "V1alpha1ClusterServingRuntime",
}


def validate_kserve(doc: dict) -> Any:
    """Build the kserve SDK object for a KServe manifest, strictly; raises KServeSchemaError."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key not in KSERVE_KINDS:
        raise KServeSchemaError(f"not a KServe kind this check knows: {key}")
    return _build(KSERVE_KINDS[key], doc, doc["kind"])


# ---- Prometheus Operator -------------------------------------------------------------------------

OPERATOR_GROUP = "monitoring.coreos.com"
# The Operator's own CustomResourceDefinitions (prometheus-operator v0.93.0,
# example/prometheus-operator-crd/), for the kinds deploy/ uses.
CRDS = Path(__file__).resolve().parent / "crds"


def _strict(schema: Any) -> Any:
    """An OpenAPI schema in which an object with declared properties admits no other field (what the
    API server's field validation does with `kubectl apply --validate=strict`)."""
    if isinstance(schema, dict):
        schema = {key: _strict(value) for key, value in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


@cache
def crd_schema(api_version: str, kind: str) -> dict:
    group, _, version = api_version.partition("/")
    for path in CRDS.glob("*.yaml"):
        [crd] = documents(path)
        if crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind:
            [served] = [v for v in crd["spec"]["versions"] if v["name"] == version]
            return _strict(served["schema"]["openAPIV3Schema"])
    raise LookupError(f"no CRD for {api_version} {kind} in {CRDS}")


def validate_operator(doc: dict) -> None:
    """Strict validation against the Operator's CRD schema; raises jsonschema's ValidationError."""
    import jsonschema

    # The schema itself is not checked against the meta-schema: its patterns are Go's RE2 syntax.
    jsonschema.Draft202012Validator(crd_schema(doc["apiVersion"], doc["kind"])).validate(doc)


def validate(doc: dict) -> None:
    """Route a document to its validator: KServe's model classes, the Operator's CRDs or the Kubernetes schemas."""
    api_version = str(doc.get("apiVersion", ""))
    if api_version.startswith(KSERVE_GROUP + "/"):
        validate_kserve(doc)
    elif api_version.startswith(OPERATOR_GROUP + "/"):
        validate_operator(doc)
    else:
        validate_kubernetes(doc)


# ---- Dockerfile ----------------------------------------------------------------------------------


def dockerfile_instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, arguments = line.partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
    return instructions


def dockerfile_stages(path: Path = DOCKERFILE) -> dict[str, list[tuple[str, str]]]:
    """Stage name -> its instructions (FROM included)."""
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for keyword, arguments in dockerfile_instructions(path):
        if keyword == "FROM":
            name = arguments.split()[-1] if " AS " in arguments.upper() else arguments
            current = stages.setdefault(name, [])
        if current is not None:
            current.append((keyword, arguments))
    return stages


def exec_form(arguments: str) -> list[str]:
    """The JSON (exec) form of CMD/ENTRYPOINT, which the manifests can be compared with."""
    import json

    value = json.loads(arguments)
    assert isinstance(value, list), f"not the exec form: {arguments}"
    return value


def dockerfile_env(stage: list[tuple[str, str]]) -> dict[str, str]:
    """ENV KEY=VALUE pairs of a stage (the KEY=VALUE form only)."""
    import shlex

    env: dict[str, str] = {}
    for keyword, arguments in stage:
        if keyword == "ENV":
            for pair in shlex.split(arguments):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


def fake_archive(path: Path, version: str = "1.0") -> Path:
    """A .mar with only its manifest: enough for the layout, which copies it and reads its version."""
    import json
    import zipfile

    manifest = {"runtime": "python", "model": {"modelName": "anything", "modelVersion": version}}
    with zipfile.ZipFile(path, "w") as mar:
        mar.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
    return path


def archive_with_handler_options(path: Path, handler: dict | None, name: str = "bert", version: str = "1.0") -> Path:
    """A .mar with its manifest (`name`, `version`) and a model-config.yaml holding `handler` (none at all for None):
    what the layout, and an update's choice of workers, read of an archive."""
    import json
    import zipfile

    model = {"modelName": name, "modelVersion": version}
    with zipfile.ZipFile(path, "w") as mar:
        if handler is not None:
            model["configFile"] = "model-config.yaml"
            mar.writestr("model-config.yaml", yaml.safe_dump({"responseTimeout": 60, "handler": handler}))
        mar.writestr("MAR-INF/MANIFEST.json", json.dumps({"runtime": "python", "model": model}))
    return path
