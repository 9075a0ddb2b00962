"""The partitions of a fleet, read from AgentServingCluster objects (YAML files or directories, or the API).

A fleet is a set of AgentServingClusters, one per partition, with pairwise disjoint node selectors. The
gateway, `fleet status` and the fleet simulator all read the same objects a user applies.

- `load_partitions(paths)`: every AgentServingCluster in the files, and in the `*.yaml`/`*.yml` files of
  the directories (sorted by name; other kinds, such as a Namespace or a kustomization.yaml, are skipped).
  A directory's kustomization.yaml `namespace:` is the default namespace of its objects.
- `partitions_from_objects(objects)`: the same checks for objects listed from the API (source = a name).
- `selectors_overlap(a, b)`: whether some node's labels could satisfy both node selectors.

Each object is parsed with the operator's own spec model and checked against the hardware profiles; the
set is then checked as a fleet (unique namespace/name, pairwise disjoint selectors). Every problem is
collected and `FleetFileError` names the file, the object and the field of each
(`partitions/p1.yaml: fleet-p1: spec.engine.profile: ...`).

A partition's binding labels are its metadata labels, plus `evolving-infra.io/profile` (the hardware
profile) unless set; its binding weight is its GPUs (nodeCount x gpusPerNode). Its router URL is the
annotation `evolving-infra.io/router-url` if set (local runs), else the router Service the operator
creates: `http://NAME-router.NAMESPACE.svc:PORT`; its router's metrics, the annotation
`evolving-infra.io/router-metrics-url`, else `http://NAME-router-admin.NAMESPACE.svc:9091/metrics`.

Boundary: reading and checking; no network (the API listing is the caller's).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from evolving_infra.fleet.binding import Partition
from evolving_infra.node_agent.profile import HardwareProfile
from evolving_infra.operator import meta
from evolving_infra.operator.rendered import ROUTER_METRICS_PORT
from evolving_infra.operator.semantics import validate_spec_semantics
from evolving_infra.operator.spec import AgentServingClusterSpec, NodeSelector, SelectorOperator
from evolving_infra.settings import NoAliasLoader

ROUTER_URL_ANNOTATION = "evolving-infra.io/router-url"
ROUTER_METRICS_URL_ANNOTATION = "evolving-infra.io/router-metrics-url"
PROFILE_LABEL = "evolving-infra.io/profile"
MAX_FILE_BYTES = 4 * 1024 * 1024
YAML_SUFFIXES = (".yaml", ".yml")
KUSTOMIZATION_NAMES = ("kustomization.yaml", "kustomization.yml", "Kustomization")


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a fleet file: where (file, object, field) and what."""

    source: str
    obj: str
    field: str
    message: str

    def __str__(self) -> str:
        where = ": ".join(part for part in (self.source, self.obj, self.field) if part)
        return f"{where}: {self.message}"


class FleetFileError(ValueError):
    """Fleet files that cannot be used (permanent until the files are fixed); lists every problem."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


@dataclass(frozen=True)
class FleetPartition:
    """One partition: its AgentServingCluster's identity, labels, parsed spec, and where it came from."""

    name: str
    namespace: str
    labels: Mapping[str, str]
    spec: AgentServingClusterSpec
    source: str
    annotations: Mapping[str, str] = field(default_factory=dict)
    status: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """`namespace/name`: unique within a fleet."""
        return f"{self.namespace}/{self.name}"

    @property
    def node_count(self) -> int:
        return self.spec.node_count

    @property
    def gpus(self) -> int:
        return self.spec.node_count * self.spec.gpus_per_node

    @property
    def router_url(self) -> str:
        url = self.annotations.get(ROUTER_URL_ANNOTATION)
        if url:
            return url.rstrip("/")
        return f"http://{self.name}-router.{self.namespace}.svc:{self.spec.router.port}"

    @property
    def metrics_url(self) -> str:
        url = self.annotations.get(ROUTER_METRICS_URL_ANNOTATION)
        if url:
            return url
        return f"http://{self.name}-router-admin.{self.namespace}.svc:{ROUTER_METRICS_PORT}/metrics"

    def binding_labels(self) -> dict[str, str]:
        out = dict(self.labels)
        if self.spec.engine.profile is not None:
            out.setdefault(PROFILE_LABEL, self.spec.engine.profile)
        return out

    def to_binding(self) -> Partition:
        """The binding's view: named by `key`, weighted by GPUs."""
        return Partition(self.key, self.binding_labels(), float(self.gpus))


# -- selectors --------------------------------------------------------------------------------------------------
def _key_constraints(selector: NodeSelector) -> dict[str, list[tuple[SelectorOperator, frozenset[str]]]]:
    out: dict[str, list[tuple[SelectorOperator, frozenset[str]]]] = {}
    for key, value in (selector.match_labels or {}).items():
        out.setdefault(key, []).append((SelectorOperator.IN, frozenset([value])))
    for req in selector.match_expressions or ():
        out.setdefault(req.key, []).append((req.operator, frozenset(req.values or ())))
    return out


def _key_satisfiable(constraints: Iterable[tuple[SelectorOperator, frozenset[str]]]) -> bool:
    allowed: frozenset[str] | None = None
    banned: set[str] = set()
    present = absent = False
    for op, values in constraints:
        if op is SelectorOperator.IN:
            present = True
            allowed = values if allowed is None else allowed & values
        elif op is SelectorOperator.NOT_IN:
            banned |= values
        elif op is SelectorOperator.EXISTS:
            present = True
        else:
            absent = True
    if present and absent:
        return False
    if allowed is not None:
        return bool(allowed - banned)
    return True  # NotIn/Exists alone: some value outside the banned ones; DoesNotExist: the key absent


def selectors_overlap(a: NodeSelector, b: NodeSelector) -> bool:
    """Whether some set of node labels satisfies both selectors (requirements on different keys are
    independent, so the selectors overlap exactly when every key's combined requirements can hold)."""
    ca, cb = _key_constraints(a), _key_constraints(b)
    return all(_key_satisfiable([*ca.get(k, []), *cb.get(k, [])]) for k in set(ca) | set(cb))


# -- reading ----------------------------------------------------------------------------------------------------
def _yaml_documents(path: Path) -> list[Any]:
    with path.open("rb") as handle:
        raw = handle.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 (byte {exc.start})") from None
    try:
        return [d for d in yaml.load_all(text, Loader=NoAliasLoader) if d is not None]  # noqa: S506
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"not valid YAML: {exc}") from None


def _default_namespace(directory: Path) -> str | None:
    for name in KUSTOMIZATION_NAMES:
        path = directory / name
        if path.is_file():
            try:
                docs = _yaml_documents(path)
            except (OSError, ValueError):
                return None
            if docs and isinstance(docs[0], dict) and isinstance(docs[0].get("namespace"), str):
                return str(docs[0]["namespace"])
    return None


def _files(paths: Iterable[str | Path], problems: list[Problem]) -> list[tuple[Path, str | None]]:
    out: list[tuple[Path, str | None]] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            namespace = _default_namespace(path)
            for child in sorted(path.iterdir()):
                if child.is_file() and child.suffix in YAML_SUFFIXES and child.name not in KUSTOMIZATION_NAMES:
                    out.append((child, namespace))
        elif path.is_file():
            out.append((path, None))
        else:
            problems.append(Problem(str(path), "", "", "no such file or directory"))
    return out


def load_partitions(
    paths: str | Path | Iterable[str | Path],
    *,
    default_namespace: str = "default",
    profiles: Mapping[str, HardwareProfile] | None = None,
) -> list[FleetPartition]:
    """The partitions in the files and directories (one path or several), checked one by one and as a fleet
    (see module doc)."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    paths = list(paths)
    problems: list[Problem] = []
    objects: list[tuple[str, Mapping[str, Any], str]] = []
    for path, namespace in _files(paths, problems):
        try:
            docs = _yaml_documents(path)
        except (OSError, ValueError) as exc:
            problems.append(Problem(str(path), "", "", str(exc)))
            continue
        found = [d for d in docs if isinstance(d, dict) and d.get("kind") == meta.KIND]
        objects.extend((str(path), obj, namespace or default_namespace) for obj in found)
    if not objects and not problems:
        problems.append(Problem(", ".join(str(p) for p in paths), "", "", f"no {meta.KIND} object found"))
    return _check(objects, problems, profiles)


def partitions_from_objects(
    objects: Iterable[tuple[str, Mapping[str, Any]]],
    *,
    default_namespace: str = "default",
    profiles: Mapping[str, HardwareProfile] | None = None,
) -> list[FleetPartition]:
    """The partitions of objects listed from the API, as `(source, object)` pairs; same checks."""
    return _check([(src, obj, default_namespace) for src, obj in objects], [], profiles)


def _str_map(value: Any) -> dict[str, str] | None:
    if value is None:
        return {}
    if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        return dict(value)
    return None


def _parse(
    source: str, obj: Mapping[str, Any], namespace: str, profiles: Mapping[str, HardwareProfile] | None
) -> tuple[FleetPartition | None, list[Problem]]:
    md = obj.get("metadata")
    md = md if isinstance(md, dict) else {}
    name = str(md.get("name", ""))
    problems: list[Problem] = []

    def problem(where: str, message: str) -> None:
        problems.append(Problem(source, name or "?", where, message))

    if not isinstance(obj.get("metadata"), dict):
        problem("metadata", "must be a mapping with a name")
    if obj.get("apiVersion") != meta.API_VERSION:
        problem("apiVersion", f"must be {meta.API_VERSION}, got {obj.get('apiVersion')!r}")
    if not meta.cluster_name_ok(name):
        problem("metadata.name", f"{meta.NAME_RULE_MESSAGE} (got {name!r})")
    labels, annotations = _str_map(md.get("labels")), _str_map(md.get("annotations"))
    if labels is None:
        problem("metadata.labels", "must map strings to strings")
    if annotations is None:
        problem("metadata.annotations", "must map strings to strings")
    spec: AgentServingClusterSpec | None = None
    try:
        spec = AgentServingClusterSpec.from_kube(obj.get("spec") or {})
    except ValidationError as exc:
        for err in exc.errors():
            problem(".".join(["spec", *(str(p) for p in err["loc"])]), str(err["msg"]).removeprefix("Value error, "))
    if spec is not None:
        for message in validate_spec_semantics(spec, profiles):
            where = "spec.engine.profile" if message.startswith("engine.profile") else "spec"
            problem(where, message)
    if problems or spec is None or labels is None or annotations is None:
        return None, problems
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    ns = md.get("namespace") if isinstance(md.get("namespace"), str) and md.get("namespace") else namespace
    return FleetPartition(name, str(ns), labels, spec, source, annotations, status or {}), []


def _check(
    objects: Sequence[tuple[str, Mapping[str, Any], str]],
    problems: list[Problem],
    profiles: Mapping[str, HardwareProfile] | None,
) -> list[FleetPartition]:
    parsed: list[FleetPartition] = []
    for source, obj, namespace in objects:
        partition, found = _parse(source, obj, namespace, profiles)
        problems.extend(found)
        if partition is not None:
            parsed.append(partition)
    seen: dict[str, FleetPartition] = {}
    for p in parsed:
        if p.key in seen:
            problems.append(Problem(p.source, p.name, "metadata.name", f"{p.key} is also defined in {seen[p.key].source}"))
        else:
            seen[p.key] = p
    for a, b in itertools.combinations(parsed, 2):
        if a.key != b.key and selectors_overlap(a.spec.node_selector, b.spec.node_selector):
            problems.append(
                Problem(
                    b.source,
                    b.name,
                    "spec.nodeSelector",
                    f"overlaps the node selector of {a.key} ({a.source}): a node could belong to both; "
                    "make the selectors disjoint (e.g. a distinct partition label value each)",
                )
            )
    if problems:
        raise FleetFileError(problems)
    return parsed
