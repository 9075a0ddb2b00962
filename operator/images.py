"""Which image routers and node agents run when their spec names none: the operator's own.

The operator's image is set once, by the install's kustomize `images:` entry (or `kustomize edit set image
evolving-infra=REGISTRY/evolving-infra:TAG`); the operator reads it back from its own pod at start
(`EVOLVING_OPERATOR_POD_NAME` and `EVOLVING_OPERATOR_NAMESPACE`, set from the downward API), so retagging
the install retags every workload it creates. `EVOLVING_OPERATOR_DEFAULT_IMAGE` overrides that, and
`spec.images` overrides both for one cluster. Outside a pod (a workstation) the fallback is this release's
image; in a pod whose image cannot be read the operator stops rather than guess. References are registry-qualified (`docker.io/library/evolving-infra:0.1.0`, not
`evolving-infra:0.1.0`), so runtimes that refuse short names (CRI-O's enforcing short-name mode) pull
the same image Docker would.

Boundary: `qualify` and `image_of_pod` are pure; `resolve_default_image` reads one pod.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from evolving_infra import __version__
from evolving_infra.operator import kube
from evolving_infra.operator.kube import KubeApi, KubeError

log = logging.getLogger(__name__)

OPERATOR_CONTAINER = "operator"
"""Name of the operator's container in its Deployment (manifests/base/deployment.yaml)."""
DEFAULT_REGISTRY = "docker.io"
FALLBACK_IMAGE = f"{DEFAULT_REGISTRY}/library/evolving-infra:{__version__}"
"""Image of children when neither the settings nor the operator's pod name one (the operator runs outside a pod)."""


def qualify(reference: str) -> str:
    """`reference` with its registry spelled out, as Docker resolves a short name.

    `evolving-infra:1` -> `docker.io/library/evolving-infra:1`; `team/x` -> `docker.io/team/x`; a first
    component with a dot or a port, or `localhost`, is a registry and is kept.
    """
    ref = reference.strip()
    if not ref:
        raise ValueError("an image reference must not be empty")
    first, _, rest = ref.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return ref
    if not rest:
        return f"{DEFAULT_REGISTRY}/library/{ref}"
    return f"{DEFAULT_REGISTRY}/{ref}"


def image_of_pod(pod: Mapping[str, Any], container: str = OPERATOR_CONTAINER) -> str | None:
    """The image of `container` in `pod` (the only container when none has that name), or None."""
    containers = list((pod.get("spec") or {}).get("containers") or ())
    named = [c for c in containers if c.get("name") == container]
    chosen = named or (containers if len(containers) == 1 else [])
    image = chosen[0].get("image") if chosen else None
    return str(image) if image else None


class ImageUnknown(RuntimeError):
    """The operator runs in a pod but cannot read that pod's image."""


async def resolve_default_image(api: KubeApi, explicit: str | None, namespace: str, pod_name: str | None) -> tuple[str, str]:
    """(image of children, where it came from): the explicit setting, else the operator's own pod, else (outside a
    pod) the fallback.

    In a pod whose image cannot be read this raises `ImageUnknown` rather than guess: a wrong default would
    roll every router and node agent to another image. The operator stops and its pod is restarted."""
    if explicit:
        return qualify(explicit), "EVOLVING_OPERATOR_DEFAULT_IMAGE"
    if not pod_name:
        log.warning("not in a pod (EVOLVING_OPERATOR_POD_NAME unset): routers and node agents default to %s", FALLBACK_IMAGE)
        return FALLBACK_IMAGE, "fallback"
    try:
        pod = await api.get(kube.POD, namespace, pod_name)
    except KubeError as exc:
        raise ImageUnknown(f"cannot read the operator's pod {namespace}/{pod_name} for its image: {exc}") from exc
    image = image_of_pod(pod) if pod is not None else None
    if not image:
        what = "does not exist" if pod is None else f"has no {OPERATOR_CONTAINER!r} container image"
        raise ImageUnknown(
            f"the operator's pod {namespace}/{pod_name} {what}; set EVOLVING_OPERATOR_DEFAULT_IMAGE or fix "
            "EVOLVING_OPERATOR_POD_NAME / EVOLVING_OPERATOR_NAMESPACE"
        )
    return qualify(image), f"pod {namespace}/{pod_name}"
