"""Bounds on what a node agent accepts over gRPC, checked at the edge before anything reaches the engine.

Every check raises ValueError naming the message field and the bound (answered with INVALID_ARGUMENT):
- ids (request, branch, subscriber) are non-empty printable ASCII without control characters, bounded in
  length; node ids follow the settings' node id rule;
- counts of pages, fetch runs and tokens are bounded, so one message cannot make the node allocate or loop
  without limit; `t_acc` is a finite positive number;
- switch generations are in [0, MAX_GENERATION] (the node's own rule, `service.switching`, also bounds
  how far one call may advance them).

Boundary: pure checks over plain values; no gRPC.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

MAX_REQUEST_ID_CHARS = 256
MAX_BRANCH_ID_CHARS = 1024
"""A branch id on the wire is the router's scoped id (tenant and branch, each up to 256 characters)."""
MAX_SUBSCRIBER_CHARS = 256
MAX_CANCEL_REASON_CHARS = 256
"""A Cancel's reason is logged up to this many characters (the rest is dropped)."""
MAX_PEER_ADDRESS_CHARS = 300
MAX_TOKENS = 1 << 24
"""Most prompt or output tokens of one request (16.7 M; far above any model's context)."""
MAX_PROMPT_PAGES = 1 << 20
MAX_FETCH_RUNS = 4096
MAX_COUNT_PAGES = 1 << 20
"""Most pages one CountUpdate may name."""
MAX_T_ACC = 3600.0
MAX_GENERATION = (1 << 53) - 1
"""Largest switch generation: exact in JSON/float64 (the operator writes it to a CR's status), and far
below the wire's uint64, so `generation + 1` never overflows anywhere."""
_NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


def check_id(value: str, field: str, limit: int) -> str:
    """`value` if it is 1-`limit` printable ASCII characters (no control characters)."""
    if not value:
        raise ValueError(f"{field}: must not be empty")
    if len(value) > limit:
        raise ValueError(f"{field}: {len(value)} characters, at most {limit}")
    if not value.isascii() or not value.isprintable():
        raise ValueError(f"{field}: must be printable ASCII (no control characters)")
    return value


def check_node_id(value: str, field: str) -> str:
    if not _NODE_ID.match(value):
        raise ValueError(f"{field}: node id {value[:64]!r} must be 1-253 letters, digits, '.', '_' or '-'")
    return value


def check_count(value: int, field: str, low: int, high: int) -> int:
    if not low <= value <= high:
        raise ValueError(f"{field}: {value} is outside [{low}, {high}]")
    return value


def check_t_acc(value: float, field: str) -> float:
    if not math.isfinite(value) or not 0 < value <= MAX_T_ACC:
        raise ValueError(f"{field}: {value} must be a finite number in (0, {MAX_T_ACC:g}]")
    return value


def check_generation(value: int, field: str = "generation") -> int:
    return check_count(value, field, 0, MAX_GENERATION)


def check_request_fields(
    where: str,
    request_id: str,
    branch_id: str,
    prompt_pages: int,
    prompt_tokens: int,
    output_tokens: int,
    t_acc: float,
    fetch: Sequence[tuple[str, int, str]],
) -> None:
    """The shared fields of SubmitPrefill and SubmitDecode; `fetch` is (peer, page count, peer_address)
    per run."""
    check_id(request_id, f"{where}.request_id", MAX_REQUEST_ID_CHARS)
    check_id(branch_id, f"{where}.branch_id", MAX_BRANCH_ID_CHARS)
    check_count(prompt_pages, f"{where}.prompt_pages (count)", 0, MAX_PROMPT_PAGES)
    check_count(prompt_tokens, f"{where}.prompt_tokens", 1, MAX_TOKENS)
    check_count(output_tokens, f"{where}.output_tokens", 0, MAX_TOKENS)
    check_t_acc(t_acc, f"{where}.t_acc")
    check_count(len(fetch), f"{where}.fetch (runs)", 0, MAX_FETCH_RUNS)
    for i, (peer, pages, address) in enumerate(fetch):
        check_node_id(peer, f"{where}.fetch[{i}].peer")
        check_count(pages, f"{where}.fetch[{i}].pages (count)", 1, MAX_PROMPT_PAGES)
        if address:
            check_id(address, f"{where}.fetch[{i}].peer_address", MAX_PEER_ADDRESS_CHARS)
