"""Every manifest and every overlay rendering validates offline: Kubernetes schemas (strict) and KServe's classes."""

from __future__ import annotations

import copy

import pytest

from tests.deploy.manifests import (
    DEPLOY,
    KSERVE,
    KSERVE_GPU_MODES,
    KSERVE_GROUP,
    KSERVE_MODES,
    OVERLAYS,
    KServeSchemaError,
    documents,
    manifest_files,
    one,
    render,
    render_kserve,
    validate,
)

FILES = manifest_files()


def test_the_deploy_tree_has_what_the_issue_asks_for():
    kinds = {(path.relative_to(DEPLOY).parts[0], doc["kind"]) for path in FILES for doc in documents(path)}
    assert {
        ("kserve", "ServingRuntime"),
        ("kserve", "InferenceService"),
        ("kubernetes", "Deployment"),
        ("kubernetes", "Service"),
        ("kubernetes", "PodDisruptionBudget"),
        ("kubernetes", "NetworkPolicy"),
        ("kubernetes", "HorizontalPodAutoscaler"),
    } <= kinds
    # One InferenceService answers both protocols (the handler reads each request's route).
    [isvc] = _inference_services()
    [runtime] = [doc for path in FILES for doc in documents(path) if doc["kind"] == "ServingRuntime"]
    assert isvc["metadata"]["name"] == "bert"
    assert isvc["spec"]["predictor"]["model"]["runtime"] == runtime["metadata"]["name"]
    assert set(runtime["spec"]["protocolVersions"]) == {"v1", "v2"}


@pytest.mark.parametrize("mode", KSERVE_MODES)
def test_each_kserve_mode_renders_and_every_rendered_object_validates(mode):
    docs = render_kserve(mode)
    kinds = {doc["kind"] for doc in docs}
    assert {"ServingRuntime", "InferenceService"} <= kinds
    for doc in docs:
        validate(doc)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_each_manifest_validates(path):
    docs = documents(path)
    assert docs, f"{path} holds no document"
    for doc in docs:
        validate(doc)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_renders_and_every_rendered_object_validates(overlay):
    docs = render(overlay)
    assert {doc["kind"] for doc in docs} == {
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "HorizontalPodAutoscaler",
    }
    for doc in docs:
        assert not doc["apiVersion"].startswith(KSERVE_GROUP)
        validate(doc)


def test_the_kserve_check_is_strict():
    """The KServe validator is only worth something if it refuses what the cluster would refuse."""
    [runtime] = documents(KSERVE / "serverless" / "servingruntime.yaml")
    broken = []
    misspelt = copy.deepcopy(runtime)
    misspelt["spec"]["containers"][0]["readinessProbe"]["exec"]["cmd"] = ["true"]
    broken.append(misspelt)
    nameless = copy.deepcopy(runtime)
    del nameless["spec"]["containers"][0]["name"]
    broken.append(nameless)
    wrong_type = copy.deepcopy(_inference_services()[0])
    wrong_type["spec"]["predictor"]["minReplicas"] = "1"
    broken.append(wrong_type)
    for doc in broken:
        with pytest.raises(KServeSchemaError):
            validate(doc)


@pytest.mark.parametrize("mode", KSERVE_GPU_MODES)
def test_the_kserve_check_refuses_a_broken_gpu_variant(mode):
    """What the GPU variants add (GPU resources, the concurrency target, tolerations) is checked as strictly."""
    docs = render_kserve(mode)
    misspelt = copy.deepcopy(one(docs, "ServingRuntime"))
    resources = misspelt["spec"]["containers"][0]["resources"]
    resources["limit"] = resources.pop("limits")
    wrong_type = copy.deepcopy(one(docs, "InferenceService"))
    wrong_type["spec"]["predictor"]["scaleTarget"] = "1024"
    bad_toleration = copy.deepcopy(one(docs, "InferenceService"))
    bad_toleration["spec"]["predictor"]["tolerations"] = [{"key": "nvidia.com/gpu", "efect": "NoSchedule"}]
    for doc in (misspelt, wrong_type, bad_toleration):
        with pytest.raises(KServeSchemaError):
            validate(doc)


def test_the_kubernetes_check_is_strict():
    import kubernetes_validate

    [deployment] = documents(DEPLOY / "kubernetes" / "base" / "deployment.yaml")
    misspelt = copy.deepcopy(deployment)
    misspelt["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(misspelt)
    unknown_kind = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        validate(unknown_kind)


def _inference_services() -> list[dict]:
    return [doc for path in FILES for doc in documents(path) if doc["kind"] == "InferenceService"]
