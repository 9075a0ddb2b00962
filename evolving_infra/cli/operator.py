"""`evolving-infra operator ...`: generate the CRD, check AgentServingCluster files, render their children.

- `operator crd [--docs | --write ROOT | --check ROOT]`: print the CRD (or the field reference), or rewrite /
  check the generated files of a checkout;
- `operator validate FILE...`: parse each AgentServingCluster in the files as the operator will (schema,
  rules, and the checks that need the hardware profiles); exit 2 naming each problem;
- `operator render FILE [--image IMAGE]`: print the child objects the operator would create for it;
- `operator run [--all-namespaces | --namespace NS ...] [--liveness URL] [--verbose]`: run the operator
  (kopf) with in-cluster credentials or the kubeconfig; operator-wide settings come from
  `EVOLVING_OPERATOR_*` environment variables (`evolving_infra.operator.settings`).

Boundary: argument parsing and terminal output; the work is in `evolving_infra.operator`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from rich.console import Console

from evolving_infra.cli.errors import USAGE_ERROR, CliError
from evolving_infra.operator import crdgen, meta
from evolving_infra.operator.builders import BuildContext, build_children
from evolving_infra.operator.images import FALLBACK_IMAGE
from evolving_infra.operator.semantics import builtin_profile_table, resolve_profile, validate_spec_semantics
from evolving_infra.operator.spec import AgentServingClusterSpec
from evolving_infra.settings import NoAliasLoader


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("operator", help="the Kubernetes operator: CRD, validation of cluster files, rendering")
    actions = parser.add_subparsers(dest="operator_command", metavar="ACTION", required=True)

    crd = actions.add_parser("crd", help="print the AgentServingCluster CRD generated from the settings model")
    group = crd.add_mutually_exclusive_group()
    group.add_argument("--docs", action="store_true", help="print the field reference (Markdown) instead")
    group.add_argument("--write", metavar="ROOT", help="rewrite the generated files of the checkout at ROOT")
    group.add_argument("--check", metavar="ROOT", help="exit 1 if a generated file under ROOT is stale")
    crd.set_defaults(handler=_crd)

    validate = actions.add_parser("validate", help="check AgentServingCluster YAML files; exit 2 naming each problem")
    validate.add_argument("files", nargs="+", metavar="FILE", help="YAML files (several documents each allowed)")
    validate.set_defaults(handler=_validate)

    render = actions.add_parser("render", help="print the child objects the operator would create")
    render.add_argument("file", metavar="FILE", help="a YAML file with one AgentServingCluster")
    render.add_argument("--image", default=FALLBACK_IMAGE, help="image used where the spec sets none (the operator's own)")
    render.add_argument("--namespace", default="default", help="namespace if the object names none")
    render.set_defaults(handler=_render)

    run = actions.add_parser("run", help="run the operator against the cluster of the kubeconfig or the pod's service account")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch clusters in every namespace (the default)")
    scope.add_argument(
        "--namespace", "-n", action="append", metavar="NS", help="watch clusters in this namespace only (repeatable; globs allowed)"
    )
    run.add_argument("--liveness", metavar="URL", help="serve a liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    run.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig to use instead of the service account or KUBECONFIG")
    run.add_argument("--context", metavar="NAME", help="kubeconfig context to use")
    run.add_argument("--verbose", "-v", action="store_true", help="log debug messages")
    run.set_defaults(handler=_run)


def _crd(args: argparse.Namespace) -> int:
    argv = ["--docs"] if args.docs else ["--write", args.write] if args.write else ["--check", args.check] if args.check else []
    return crdgen.main(argv)


MAX_CR_FILE_BYTES = 4 * 1024 * 1024


def _load_clusters(path: str) -> list[dict[str, Any]]:
    """The AgentServingCluster objects in a YAML file: at most 4 MiB of UTF-8, safe YAML without aliases (an
    alias bomb is refused at its first alias); every failure is a CliError (exit 2) naming the file and
    position."""
    try:
        with Path(path).open("rb") as handle:
            raw = handle.read(MAX_CR_FILE_BYTES + 1)
        if len(raw) > MAX_CR_FILE_BYTES:
            raise CliError(f"{path}: larger than {MAX_CR_FILE_BYTES} bytes", USAGE_ERROR)
        docs = [d for d in yaml.load_all(raw.decode("utf-8"), Loader=NoAliasLoader) if d is not None]  # noqa: S506
    except UnicodeDecodeError as exc:
        raise CliError(f"{path}: not UTF-8 (byte {exc.start})", USAGE_ERROR) from None
    except RecursionError:
        raise CliError(f"{path}: nested too deeply", USAGE_ERROR) from None
    except (OSError, yaml.YAMLError) as exc:
        raise CliError(f"{path}: {exc}", USAGE_ERROR) from exc
    clusters = [d for d in docs if isinstance(d, dict) and d.get("kind") == meta.KIND]
    if not clusters:
        raise CliError(f"{path}: no {meta.KIND} object found", USAGE_ERROR)
    return clusters


def _metadata(obj: dict[str, Any]) -> dict[str, Any]:
    md = obj.get("metadata")
    return md if isinstance(md, dict) else {}


def _problems(obj: dict[str, Any]) -> tuple[AgentServingClusterSpec | None, list[str]]:
    problems: list[str] = []
    if obj.get("metadata") is not None and not isinstance(obj.get("metadata"), dict):
        problems.append(f"metadata must be a mapping, got {type(obj.get('metadata')).__name__}")
    name = str(_metadata(obj).get("name", ""))
    if obj.get("apiVersion") != meta.API_VERSION:
        problems.append(f"apiVersion must be {meta.API_VERSION}, got {obj.get('apiVersion')!r}")
    if not meta.cluster_name_ok(name):
        problems.append(meta.NAME_RULE_MESSAGE + f" (got {name!r})")
    try:
        spec = AgentServingClusterSpec.from_kube(obj.get("spec") or {})
    except ValidationError as exc:
        for err in exc.errors():
            where = ".".join(["spec", *(str(p) for p in err["loc"])])
            problems.append(f"{where}: {str(err['msg']).removeprefix('Value error, ')}")
        return None, problems
    problems.extend(f"spec: {p}" for p in validate_spec_semantics(spec))
    return spec, problems


def _validate(args: argparse.Namespace) -> int:
    console = Console(soft_wrap=True, highlight=False)
    failed = False
    for path in args.files:
        for obj in _load_clusters(path):
            name = _metadata(obj).get("name", "?")
            _, problems = _problems(obj)
            if problems:
                failed = True
                for problem in problems:
                    console.print(f"[red]{path}[/red] {name}: {problem}", highlight=False)
            else:
                console.print(f"{path} {name}: ok", highlight=False)
    if failed:
        raise CliError("invalid AgentServingCluster object(s); see above", USAGE_ERROR)
    return 0


def _render(args: argparse.Namespace) -> int:
    clusters = _load_clusters(args.file)
    if len(clusters) != 1:
        raise CliError(f"{args.file}: expected one {meta.KIND}, found {len(clusters)}", USAGE_ERROR)
    obj = clusters[0]
    spec, problems = _problems(obj)
    if spec is None or problems:
        raise CliError(f"{args.file}: " + "; ".join(problems), USAGE_ERROR)
    md = _metadata(obj)
    cluster = meta.ClusterRef(md["name"], md.get("namespace") or args.namespace, md.get("uid") or "00000000-0000-0000-0000-000000000000")
    ctx = BuildContext(cluster, spec, resolve_profile(spec, builtin_profile_table()), args.image)
    sys.stdout.write(yaml.safe_dump_all(build_children(ctx), sort_keys=False))
    return 0


def _run(args: argparse.Namespace) -> int:
    import logging

    from evolving_infra.operator.images import ImageUnknown
    from evolving_infra.operator.kube import NoCredentials
    from evolving_infra.operator.runner import run_operator
    from evolving_infra.operator.settings import OperatorSettings

    if args.liveness and not args.liveness.startswith(("http://", "https://")):
        raise CliError(f"--liveness must be an http(s) URL such as http://0.0.0.0:8080/healthz, got {args.liveness!r}", USAGE_ERROR)
    try:
        settings = OperatorSettings()
    except ValidationError as exc:
        raise CliError(f"invalid EVOLVING_OPERATOR_* settings: {exc}", USAGE_ERROR) from exc
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        run_operator(
            settings, namespaces=tuple(args.namespace or ()), liveness=args.liveness, kubeconfig=args.kubeconfig, context=args.context
        )
    except (NoCredentials, ImageUnknown) as exc:
        raise CliError(str(exc)) from exc
    except KeyboardInterrupt:
        return 130
    return 0
