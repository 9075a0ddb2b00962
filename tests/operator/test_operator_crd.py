"""The generated CRD: current on disk, structural, documented, and it accepts and refuses what the model does.

Schema checks run with jsonschema on the openAPIV3Schema; CEL rules run with cel-python on the defaulted
object. A hypothesis property checks that the settings model (pydantic) and the CRD (schema + CEL) accept
exactly the same specs.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from evolving_infra.core.eviction import EvictionPolicyName, eviction_policy
from evolving_infra.operator import crdgen, meta
from evolving_infra.operator.schema import apply_defaults, structural_problems, to_structural
from evolving_infra.operator.spec import AgentServingClusterSpec, AgentServingClusterStatus

REPO = Path(__file__).resolve().parents[2]


def test_generated_files_are_current() -> None:
    stale = crdgen.stale_files(REPO)
    assert stale == [], f"regenerate with: python -m evolving_infra.operator.crdgen --write . (stale: {stale})"


def test_committed_crd_equals_generator_output_byte_for_byte() -> None:
    for path in crdgen.CRD_PATHS:
        assert (REPO / path).read_text(encoding="utf-8") == crdgen.render_crd(), path


def test_docs_reference_lists_every_spec_field(apiserver: Any) -> None:
    doc = (REPO / crdgen.DOCS_PATH).read_text(encoding="utf-8")

    def walk(node: dict[str, Any], path: str) -> None:
        target = node.get("items", node)
        for name, sub in target.get("properties", {}).items():
            assert f"| `{name}` |" in doc, f"{path}.{name} missing from docs/operator.md"
            walk(sub, f"{path}.{name}")

    walk(apiserver.schema["properties"]["spec"], "spec")
    walk(apiserver.schema["properties"]["status"], "status")


def test_crd_identity_and_printer_columns() -> None:
    crd = yaml.safe_load((REPO / "crds/agentservingclusters.yaml").read_text(encoding="utf-8"))
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "agentservingclusters.serving.evolving-infra.io"
    assert spec["group"] == "serving.evolving-infra.io" and spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "AgentServingCluster"
    assert spec["names"]["plural"] == "agentservingclusters"
    assert spec["names"]["shortNames"] == ["asc"]
    assert spec["names"]["categories"] == ["evolving-infra"]
    [version] = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Split"] == ".status.split"
    assert columns["Prefill"] == ".status.prefill"
    assert columns["Decode"] == ".status.decode"
    assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Nodes"] == ".status.readyNodes"
    assert columns["Adapting"] == ".status.adapting"
    assert columns["Age"] == ".metadata.creationTimestamp"


def test_schema_is_structural_and_every_field_is_described(apiserver: Any) -> None:
    assert structural_problems(apiserver.schema) == []
    text = yaml.safe_dump(apiserver.schema)
    assert "$ref" not in text and "title:" not in text


def test_structural_check_finds_what_the_api_server_refuses() -> None:
    bad = {
        "type": "object",
        "properties": {
            "a": {"type": "string"},  # no description
            "b": {"description": "x", "anyOf": [{"type": "string"}, {"type": "integer"}]},
            "c": {"description": "x", "type": "object", "additionalProperties": False},
            "d": {"description": "x", "type": "integer", "exclusiveMinimum": 0},
            "e": {"description": "x", "type": "object", "propertyNames": {"maxLength": 3}},
        },
    }
    problems = "\n".join(structural_problems(bad))
    for expected in (".a: no description", ".b: no type", "additionalProperties false", "must be a boolean", "propertyNames"):
        assert expected in problems


def test_conversion_rewrites_exclusive_bounds_and_optionals() -> None:
    out = to_structural(
        {
            "type": "object",
            "properties": {
                "x": {"anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "null"}], "default": None, "description": "d"}
            },
        }
    )
    assert out["properties"]["x"] == {"description": "d", "type": "number", "minimum": 0, "exclusiveMinimum": True}


def test_enums_are_the_router_and_core_names(apiserver: Any) -> None:
    from evolving_infra.router.planner.base import PlannerName
    from evolving_infra.router.routing.base import DecodePolicyName, PrefillPolicyName

    spec = apiserver.schema["properties"]["spec"]["properties"]
    assert spec["planner"]["properties"]["policy"]["enum"] == [p.value for p in PlannerName]
    assert spec["routing"]["properties"]["prefillPolicy"]["enum"] == [p.value for p in PrefillPolicyName]
    assert spec["routing"]["properties"]["decodePolicy"]["enum"] == [p.value for p in DecodePolicyName]
    assert spec["eviction"]["properties"]["policy"]["enum"] == [p.value for p in EvictionPolicyName]
    for name in spec["eviction"]["properties"]["policy"]["enum"]:
        assert eviction_policy(name).name.value == name


@pytest.mark.parametrize(
    "path", ["cluster-9-nodes.yaml", *(f"fleet-3072-gpus/partition-{i}.yaml" for i in range(8))]
)
def test_examples_pass_schema_cel_and_model(apiserver: Any, path: str) -> None:
    obj = apiserver.load_example(path)
    assert apiserver.errors(obj) == []
    AgentServingClusterSpec.from_kube(obj["spec"])


def test_defaulting_fills_nested_settings(apiserver: Any, nine_nodes: dict[str, Any]) -> None:
    del nine_nodes["spec"]["planner"]
    spec = apply_defaults(apiserver.schema, nine_nodes)["spec"]
    assert spec["planner"] == {
        "mode": "adaptive", "windowSeconds": 600, "slices": 10, "warmupSeconds": 1800,
        "cooldownSeconds": 120, "minPrefill": 1, "minDecode": 1,
    }  # fmt: skip
    assert spec["resources"]["nodeAgent"]["requests"] == {"cpu": "2", "memory": "4Gi"}
    assert spec["router"]["replicas"] == 1
    # The API server's defaults are the model's defaults.
    assert AgentServingClusterSpec.from_kube(nine_nodes["spec"]).to_kube() == spec


def _set(obj: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        obj = obj.setdefault(key, {})
    if value is _DELETE:
        obj.pop(last, None)
    else:
        obj[last] = value


_DELETE = object()

# (description, edits of the 9-node example, CEL message expected)
CEL_CASES = [
    ("split short of nodes", {"spec.initialSplit": {"prefill": 6, "decode": 2}}, "initialSplit.prefill + initialSplit.decode must equal nodeCount"),
    ("split beyond nodes", {"spec.initialSplit": {"prefill": 7, "decode": 3}}, "initialSplit.prefill + initialSplit.decode must equal nodeCount"),
    ("minimums exceed nodes", {"spec.planner.minPrefill": 5, "spec.planner.minDecode": 5}, "planner.minPrefill + planner.minDecode must not exceed nodeCount"),
    ("split below minimum", {"spec.initialSplit": {"prefill": 9, "decode": 0}}, "initialSplit must respect planner.minPrefill and planner.minDecode"),
    ("static mode, adaptive planner", {"spec.planner.mode": "static"}, "planner.policy must be static or unset when planner.mode is static"),
    ("static planner, adaptive mode", {"spec.planner.policy": "static"}, "planner.policy static needs planner.mode static"),
    ("slices shorter than a second", {"spec.planner.windowSeconds": 10, "spec.planner.slices": 20}, "planner.windowSeconds must be at least planner.slices"),
    ("empty selector", {"spec.nodeSelector": {}}, "nodeSelector must contain at least one label or expression"),
    ("In without values", {"spec.nodeSelector.matchExpressions": [{"key": "pool", "operator": "In"}]}, "values must be non-empty for In and NotIn"),
    ("Exists with values", {"spec.nodeSelector.matchExpressions": [{"key": "pool", "operator": "Exists", "values": ["x"]}]}, "values must be non-empty for In and NotIn, and empty for Exists"),
    ("emulated without profile", {"spec.engine.profile": _DELETE}, "engine.profile is required with the emulated backend"),
    ("sglang without model", {"spec.engine.backend": "sglang"}, "engine.model is required with the sglang backend"),
    ("L1 below a page", {"spec.kvCache": {"pageTokens": 64, "l1Tokens": 10}}, "kvCache.l1Tokens must hold at least one page"),
    ("L2 below a page", {"spec.kvCache": {"pageTokens": 64, "l2Tokens": 63}}, "kvCache.l2Tokens must hold at least one page"),
]


@pytest.mark.parametrize("what,edits,message", CEL_CASES, ids=[c[0] for c in CEL_CASES])
def test_cel_rule_rejects_nonsense_and_the_model_agrees(
    apiserver: Any, nine_nodes: dict[str, Any], what: str, edits: dict[str, Any], message: str
) -> None:
    for dotted, value in edits.items():
        _set(nine_nodes, dotted, value)
    errors = apiserver.errors(nine_nodes)
    assert any(message in e for e in errors), errors
    with pytest.raises(ValidationError, match=message.split(" (")[0].replace("+", r"\+").replace(".", r"\.")):
        AgentServingClusterSpec.from_kube(nine_nodes["spec"])


@pytest.mark.parametrize("name", ["a" * 51, "Glm-9", "9glm", "glm_9", "glm-"])
def test_cluster_name_rule(apiserver: Any, nine_nodes: dict[str, Any], name: str) -> None:
    nine_nodes["metadata"]["name"] = name
    assert apiserver.errors(nine_nodes) == [meta.NAME_RULE_MESSAGE]
    assert not meta.cluster_name_ok(name)


def test_cluster_name_rule_accepts_the_longest_name(apiserver: Any, nine_nodes: dict[str, Any]) -> None:
    nine_nodes["metadata"]["name"] = "g" + "-9" * 24 + "x"
    assert len(nine_nodes["metadata"]["name"]) == 50
    assert apiserver.errors(nine_nodes) == [] and meta.cluster_name_ok(nine_nodes["metadata"]["name"])


# (description, edits, (path, keyword) the schema reports)
SCHEMA_CASES = [
    ("no slices", {"spec.planner.slices": 0}, ("spec.planner.slices", "minimum")),
    ("two routers", {"spec.router.replicas": 2}, ("spec.router.replicas", "maximum")),
    ("unknown prefill policy", {"spec.routing.prefillPolicy": "fastest"}, ("spec.routing.prefillPolicy", "enum")),
    ("unknown eviction policy", {"spec.eviction.policy": "fifo"}, ("spec.eviction.policy", "enum")),
    ("unknown backend", {"spec.engine.backend": "vllm"}, ("spec.engine.backend", "enum")),
    ("no node count", {"spec.nodeCount": _DELETE}, ("spec", "required")),
    ("window as text", {"spec.planner.windowSeconds": "600"}, ("spec.planner.windowSeconds", "type")),
    ("host memory not a quantity", {"spec.resources.nodeAgent.hostMemory.size": "lots"}, ("spec.resources.nodeAgent.hostMemory.size", "pattern")),
    ("negative fetch cost", {"spec.routing.fetch.fixedSeconds": -1}, ("spec.routing.fetch.fixedSeconds", "minimum")),
    ("bad profile name", {"spec.engine.profile": "GLM 5"}, ("spec.engine.profile", "pattern")),
    ("too many GPUs", {"spec.gpusPerNode": 17}, ("spec.gpusPerNode", "maximum")),
    ("bad service type", {"spec.router.serviceType": "ExternalName"}, ("spec.router.serviceType", "enum")),
]


@pytest.mark.parametrize("what,edits,expected", SCHEMA_CASES, ids=[c[0] for c in SCHEMA_CASES])
def test_schema_rejects_bad_values_and_the_model_agrees(
    apiserver: Any, nine_nodes: dict[str, Any], what: str, edits: dict[str, Any], expected: tuple[str, str]
) -> None:
    for dotted, value in edits.items():
        _set(nine_nodes, dotted, value)
    assert f"{expected[0]}: {expected[1]}" in apiserver.errors(nine_nodes)
    with pytest.raises(ValidationError) as info:
        AgentServingClusterSpec.from_kube(nine_nodes["spec"])
    field = expected[0].removeprefix("spec").lstrip(".").split(".")[0] or "nodeCount"
    assert field in str(info.value)


def test_status_schema_checks_what_writers_send(apiserver: Any, nine_nodes: dict[str, Any]) -> None:
    status = {
        "observedGeneration": 3,
        "split": "4P5D",
        "prefill": 4,
        "decode": 5,
        "readyNodes": 9,
        "adapting": True,
        "targetSplit": {
            "prefill": 5, "decode": 4, "split": "5P4D", "switchGeneration": 2, "moving": ["n7"],
            "decision": {
                "decidedAt": "2026-01-01T00:10:00Z", "planner": "ours", "outcome": "switch", "reason": "gain",
                "candidates": [{"prefill": 5, "split": "5P4D", "meanGain": 0.3, "stderr": 0.05, "qualified": True, "verdict": "qualified"}],
            },
        },
        "nodes": [{"name": "n7", "pod": "glm-9-node-agent-x", "address": "10.0.0.7:50051", "phase": "decode", "state": "draining", "switchGeneration": 1}],
        "fittedModels": [{"node": "n7", "prefill": {"c0": 0.01, "c1": 1e-5, "c2": 1e-9, "c3": 1e-7, "heldOutError": 0.04, "samples": 900}}],
        "conditions": [{"type": "Ready", "status": "True", "reason": "Serving", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 3}],
    }  # fmt: skip
    nine_nodes["status"] = status
    assert apiserver.errors(nine_nodes) == []
    AgentServingClusterStatus.from_kube(status)
    bad = copy.deepcopy(status)
    bad["split"] = "4p5d"
    bad["conditions"][0]["reason"] = "not camel case"
    bad["nodes"][0]["state"] = "asleep"
    nine_nodes["status"] = bad
    assert set(apiserver.errors(nine_nodes)) >= {
        "status.split: pattern", "status.conditions.0.reason: pattern", "status.nodes.0.state: enum",
    }  # fmt: skip
    with pytest.raises(ValidationError):
        AgentServingClusterStatus.from_kube(bad)


# ---- the model and the CRD accept exactly the same specs -------------------------------------------

def _mostly(draw: st.DrawFn, good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any], one_in: int = 10) -> Any:
    """A value from `bad` one time in `one_in`, else from `good`, so both verdicts are common."""
    return draw(bad) if draw(st.integers(1, one_in)) == 1 else draw(good)


def _maybe(draw: st.DrawFn, target: dict[str, Any], key: str, strategy: st.SearchStrategy[Any]) -> None:
    if draw(st.booleans()):
        target[key] = draw(strategy)


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    """Specs near every rule's boundary: each part valid most of the time, so all-valid specs are common."""
    nodes = draw(st.integers(1, 12))
    prefill = _mostly(draw, st.integers(1, max(1, nodes - 1)), st.integers(-1, 13))
    decode = _mostly(draw, st.just(nodes - prefill), st.integers(-2, 2).map(lambda d: max(0, nodes - prefill + d)), 4)
    selector = _mostly(
        draw,
        st.sampled_from(
            [
                {"matchLabels": {"pool": "a"}},
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
                {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
                {"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist", "values": []}]},
            ]
        ),
        st.sampled_from(
            [
                {},
                {"matchLabels": {}, "matchExpressions": []},
                {"matchExpressions": [{"key": "pool", "operator": "NotIn"}]},
                {"matchExpressions": [{"key": "gpu", "operator": "Exists", "values": ["x"]}]},
            ]
        ),
    )
    backend = draw(st.sampled_from(["emulated", "sglang"]))
    engine: dict[str, Any] = {"backend": backend}
    if _mostly(draw, st.just(True), st.just(False)):
        engine["profile" if backend == "emulated" else "model"] = "glm-5.2-4xgb300-tp4" if backend == "emulated" else "zai/GLM-5.2"
    _maybe(draw, engine, "profile", st.sampled_from(["glm-5.2-4xgb300-tp4", "kimi-k2.6-4xgb300-tp4"]))
    planner: dict[str, Any] = {}
    mode = draw(st.sampled_from(["adaptive", "static"]))
    planner["mode"] = mode
    ok_policies = ["ours", "dynamo", "arrow"] if mode == "adaptive" else ["static"]
    _maybe(draw, planner, "policy", st.sampled_from(ok_policies) if draw(st.integers(0, 4)) else st.sampled_from(["ours", "static"]))
    _maybe(draw, planner, "windowSeconds", st.integers(10, 40))
    _maybe(draw, planner, "slices", st.integers(1, 10) if draw(st.integers(0, 9)) else st.integers(0, 50))
    _maybe(draw, planner, "minPrefill", st.integers(0, 3))
    _maybe(draw, planner, "minDecode", st.integers(0, 3))
    kv: dict[str, Any] = {}
    _maybe(draw, kv, "pageTokens", st.integers(1, 64))
    _maybe(draw, kv, "l1Tokens", st.integers(1, 100))
    _maybe(draw, kv, "l2Tokens", st.integers(0, 100))
    return {
        "nodeSelector": selector,
        "nodeCount": nodes,
        "engine": engine,
        "initialSplit": {"prefill": prefill, "decode": decode},
        "planner": planner,
        "kvCache": kv,
    }


@settings(max_examples=300)
@given(spec=specs())
def test_model_and_crd_accept_the_same_specs(apiserver: Any, spec: dict[str, Any]) -> None:
    obj = {"apiVersion": meta.API_VERSION, "kind": meta.KIND, "metadata": {"name": "c"}, "spec": spec}
    crd_errors = apiserver.errors(obj)
    try:
        AgentServingClusterSpec.from_kube(spec)
        model_ok = True
    except ValidationError:
        model_ok = False
    assert model_ok == (crd_errors == []), crd_errors
