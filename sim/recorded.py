"""What-if replay of recorded traffic: a hardware profile whose iteration-time coefficients are the ones a live
router fitted (`router serve --record-models FILE`), so the simulator's nodes run as fast as the recorded
cluster's did.

The models file (`router.recording.models_document`) holds per node the prefill coefficients c0..c3 (eq. 1)
and the decode coefficients d0..d2 with the MoE shape (eq. 2). Nodes are one hardware type, so each
coefficient is the median over the nodes that fitted it; sizes, bandwidths and t_acc stay the base profile's.
A file with no fitted node (the router ran on the profile's models) is refused: it holds nothing to replay.

Boundary: pure conversion (plus reading the JSON file in `load_models`).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from evolving_infra.node_agent.profile import DecodeModel, HardwareProfile, PrefillModel

MODELS_KIND = "evolving-infra-node-models"


class ModelsFileError(ValueError):
    """The models file cannot be used (message names the file and what is wrong)."""


def load_models(path: str | Path) -> dict[str, Any]:
    """Read and check a models file."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelsFileError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    if not isinstance(doc, dict) or doc.get("kind") != MODELS_KIND or doc.get("version") != 1:
        raise ModelsFileError(f"{path}: not a node-models file (kind {MODELS_KIND!r}, version 1)")
    if not isinstance(doc.get("nodes"), dict):
        raise ModelsFileError(f"{path}: 'nodes' must be an object")
    return doc


def profile_with_models(base: HardwareProfile, doc: dict[str, Any], source: str = "recorded models") -> HardwareProfile:
    """`base` with the recorded coefficients (median over nodes) in place of its own."""
    nodes = [n for n in doc["nodes"].values() if isinstance(n, dict)]
    prefill = [n["prefill"] for n in nodes if isinstance(n.get("prefill"), dict)]
    decode = [n["decode"] for n in nodes if isinstance(n.get("decode"), dict)]
    if not prefill or not decode:
        missing = "prefill" if not prefill else "decode"
        raise ModelsFileError(f"{source}: no node has a fitted {missing} model (the router kept the profile's models?)")
    try:
        p = PrefillModel(**{k: statistics.median(float(m[k]) for m in prefill) for k in ("c0", "c1", "c2", "c3")})
        d_values: dict[str, Any] = {k: statistics.median(float(m[k]) for m in decode) for k in ("d0", "d1", "d2")}
        first = decode[0]
        d = DecodeModel(**d_values, k=int(first["k"]), experts=int(first["experts"]),
                        t_fwd=float(first["t_fwd"]), t_acc=min(base.decode.t_acc, float(first["t_fwd"])))  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelsFileError(f"{source}: bad coefficients: {exc}") from None
    fitted = [f"prefill.{k}" for k in ("c0", "c1", "c2", "c3")] + [f"decode.{k}" for k in ("d0", "d1", "d2")]
    sources = {**base.sources, **{k: source for k in fitted}}
    return base.model_copy(update={"name": f"{base.name}+recorded", "prefill": p, "decode": d, "sources": sources})
