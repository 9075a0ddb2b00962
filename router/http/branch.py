"""Branch, parent and tenant of a request, resolved from headers and body with a fixed precedence.

Branch id (first match wins; docs/router-http.md has the table):
1. ours: body `evolving.branch_id` and header `x-evolving-branch-id` (both given and different: 400);
2. Dynamo `x-dynamo-trajectory-id`; 3. SGLang gateway `x-smg-routing-key`; 4. AIBrix
   `x-aibrix-session-key`; 5. Dynamo `x-dynamo-session-id`; 6. OpenAI body `prompt_cache_key`.
   Trajectory-level hints come before session-level ones, and `prompt_cache_key` is last because
   clients often share one key across many conversations.
7. none: the front end generates an ephemeral branch (`req-<request id>`), finished after the request.

Parent: body `evolving.parent_branch_id` / header `x-evolving-parent-branch-id` (different: 400), else
Dynamo `x-dynamo-parent-trajectory-id`. A branch cannot be its own parent.

Tenant: body `evolving.tenant`, header `x-evolving-tenant`, body `cache_salt` — all that are given
must agree. The tenant is a namespace: the same branch id under two tenants is two branches, and parent
and child share the request's tenant. No tenant means the shared default namespace.

Finished: body `evolving.branch_finished: true` or header `x-evolving-branch-finished: true` marks the
request as its branch's last; the front end finishes the branch once the request ends.

Ids are 1-256 printable ASCII characters without leading or trailing spaces (they are echoed in
response headers). Boundary: pure functions over a header mapping and the body hints.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass

from evolving_infra.router.http.api import BodyHints
from evolving_infra.router.http.backend import BranchRef
from evolving_infra.router.http.errors import ErrorCode, invalid

from evolving_infra.core.types import BranchId, RequestId

BRANCH_HEADER = "x-evolving-branch-id"
PARENT_HEADER = "x-evolving-parent-branch-id"
TENANT_HEADER = "x-evolving-tenant"
FINISHED_HEADER = "x-evolving-branch-finished"
SOURCE_HEADER = "x-evolving-branch-source"
"""Response header: where the resolved branch id came from (a `BranchSource` value)."""

MAX_ID_LENGTH = 256
_ID = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")
_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}


class BranchSource(enum.Enum):
    """Where a branch id came from; also a (bounded) metrics label."""

    BODY = "body:evolving.branch_id"
    HEADER = f"header:{BRANCH_HEADER}"
    DYNAMO_TRAJECTORY = "header:x-dynamo-trajectory-id"
    SGLANG_ROUTING_KEY = "header:x-smg-routing-key"
    AIBRIX_SESSION = "header:x-aibrix-session-key"
    DYNAMO_SESSION = "header:x-dynamo-session-id"
    PROMPT_CACHE_KEY = "body:prompt_cache_key"
    GENERATED = "generated"


ALIAS_HEADERS: tuple[tuple[str, BranchSource], ...] = (
    ("x-dynamo-trajectory-id", BranchSource.DYNAMO_TRAJECTORY),
    ("x-smg-routing-key", BranchSource.SGLANG_ROUTING_KEY),
    ("x-aibrix-session-key", BranchSource.AIBRIX_SESSION),
    ("x-dynamo-session-id", BranchSource.DYNAMO_SESSION),
)
PARENT_ALIAS_HEADER = "x-dynamo-parent-trajectory-id"


@dataclass(frozen=True, slots=True)
class ResolvedBranch:
    """The outcome of resolution, as passed to the backend and echoed to the client."""

    branch: BranchRef
    parent: BranchRef | None
    source: BranchSource
    finish_after: bool

    @property
    def ephemeral(self) -> bool:
        return self.source is BranchSource.GENERATED


def check_id(value: str, param: str) -> str:
    """Return `value` if it is a usable id, else raise a 400 naming `param`."""
    if len(value) > MAX_ID_LENGTH:
        raise invalid(f"{param}: at most {MAX_ID_LENGTH} characters are allowed, got {len(value)}", param)
    if not _ID.fullmatch(value):
        raise invalid(
            f"{param}: must be 1-{MAX_ID_LENGTH} printable ASCII characters without leading or trailing "
            f"spaces, got {value!r}",
            param,
        )
    return value


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def _agreeing(pairs: list[tuple[str, str | None]]) -> str | None:
    """The single value the given (param, value) pairs agree on; 400 naming the first disagreeing one."""
    chosen: tuple[str, str] | None = None
    for param, value in pairs:
        if value is None:
            continue
        check_id(value, param)
        if chosen is None:
            chosen = (param, value)
        elif value != chosen[1]:
            raise invalid(
                f"{param}: {value!r} conflicts with {chosen[0]} {chosen[1]!r}; send one value",
                param,
                ErrorCode.CONFLICT,
            )
    return chosen[1] if chosen else None


def resolve_tenant(
    headers: Mapping[str, str], body_tenant: str | None = None, cache_salt: str | None = None
) -> str | None:
    """The request's tenant (None: default namespace). Raises 400 on a bad or conflicting value."""
    h = _lower(headers)
    return _agreeing(
        [("evolving.tenant", body_tenant), (TENANT_HEADER, h.get(TENANT_HEADER)), ("cache_salt", cache_salt)]
    )


def parse_flag(value: str | None, param: str) -> bool:
    """A boolean header: true/false, 1/0, yes/no (any case); absent is false."""
    if value is None:
        return False
    word = value.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise invalid(f"{param}: must be true or false, got {value!r}", param)


def resolve_branch(headers: Mapping[str, str], hints: BodyHints, request_id: RequestId) -> ResolvedBranch:
    """Resolve branch, parent, tenant and the finished flag (module docstring). Raises ApiError (400)."""
    h = _lower(headers)
    tenant = resolve_tenant(headers, hints.tenant, hints.cache_salt)

    source: BranchSource | None = None
    branch_id = _agreeing([("evolving.branch_id", hints.branch_id), (BRANCH_HEADER, h.get(BRANCH_HEADER))])
    if branch_id is not None:
        source = BranchSource.BODY if hints.branch_id is not None else BranchSource.HEADER
    else:
        for name, alias in ALIAS_HEADERS:
            if h.get(name) is not None:
                branch_id, source = check_id(h[name], name), alias
                break
        else:
            if hints.prompt_cache_key is not None:
                branch_id = check_id(hints.prompt_cache_key, "prompt_cache_key")
                source = BranchSource.PROMPT_CACHE_KEY
    if branch_id is None or source is None:
        branch_id, source = f"req-{request_id}", BranchSource.GENERATED

    parent_id = _agreeing(
        [("evolving.parent_branch_id", hints.parent_branch_id), (PARENT_HEADER, h.get(PARENT_HEADER))]
    )
    if parent_id is None and h.get(PARENT_ALIAS_HEADER) is not None:
        parent_id = check_id(h[PARENT_ALIAS_HEADER], PARENT_ALIAS_HEADER)
    if parent_id is not None and parent_id == branch_id:
        param = "evolving.parent_branch_id" if hints.parent_branch_id is not None else PARENT_HEADER
        raise invalid(f"{param}: a branch cannot be its own parent ({parent_id!r})", param)

    finish_after = hints.branch_finished or parse_flag(h.get(FINISHED_HEADER), FINISHED_HEADER)
    return ResolvedBranch(
        branch=BranchRef(BranchId(branch_id), tenant),
        parent=BranchRef(BranchId(parent_id), tenant) if parent_id is not None else None,
        source=source,
        finish_after=finish_after,
    )
