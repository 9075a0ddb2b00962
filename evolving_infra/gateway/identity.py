"""Who a request is, for binding: the user key, its branch and parent, and its requirements.

User key, first of (docs/gateway.md):
1. the API key's name (`key:<name>`), when the gateway checks API keys (an unchecked bearer token is
   not an identity: SDKs send placeholders such as `unused`);
2. the user header (`x-evolving-user` by default), then the body's OpenAI `user` field (`user:<value>`);
3. the branch: its parent's id when the request names a parent (a sub-agent follows its parent even
   after a gateway restart), else its own id (`branch:<scoped id>`); the branch id is resolved exactly as
   the partition router resolves it (ours, then the ecosystem's aliases, then `prompt_cache_key`);
4. none of these: the request id (an ephemeral user, bound for this request only).

Requirements: the API key's (from the key requirements file) merged with the request's requirements
header; the request may only narrow them.

Boundary: pure functions over headers and the JSON body; nothing is changed in the forwarded request.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from evolving_infra.fleet.binding import BindingError, Requirements
from evolving_infra.gateway.errors import bad_request
from evolving_infra.router.http.api import BodyHints
from evolving_infra.router.http.branch import BranchSource, check_id, resolve_branch
from evolving_infra.router.http.errors import ApiError

from evolving_infra.core.types import RequestId


class UserSource(enum.Enum):
    """Where the user key came from (a bounded metrics label)."""

    API_KEY = "api_key"
    USER_HEADER = "user_header"
    BODY_USER = "body_user"
    PARENT_BRANCH = "parent_branch"
    BRANCH = "branch"
    REQUEST = "request"


@dataclass(frozen=True)
class Identity:
    user_key: str
    source: UserSource
    branch: str | None
    """Scoped branch id (tenant-safe), None for an ephemeral branch."""
    parent: str | None
    finish_after: bool
    requirements: Requirements


def _s(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def body_hints(body: Mapping[str, Any] | None) -> tuple[BodyHints, str | None]:
    """Branch hints and the OpenAI `user` field from a JSON body; values of a wrong type are ignored here
    (the partition router, which validates the body, answers them)."""
    if not body:
        return BodyHints(), None
    ours = body.get("evolving")
    ours = ours if isinstance(ours, Mapping) else {}
    return (
        BodyHints(
            branch_id=_s(ours.get("branch_id")),
            parent_branch_id=_s(ours.get("parent_branch_id")),
            tenant=_s(ours.get("tenant")),
            branch_finished=ours.get("branch_finished") is True,
            prompt_cache_key=_s(body.get("prompt_cache_key")),
            cache_salt=_s(body.get("cache_salt")),
        ),
        _s(body.get("user")),
    )


def parse_requirements(text: str | None, param: str) -> Requirements:
    if text is None:
        return Requirements()
    try:
        return Requirements.parse(text)
    except BindingError as exc:
        raise bad_request(f"{param}: {exc}", param) from None


def resolve_identity(
    headers: Mapping[str, str],
    body: Mapping[str, Any] | None,
    request_id: str,
    *,
    key_name: str | None,
    key_requirements: Requirements,
    user_header: str,
    requirements_header: str,
) -> Identity:
    """The request's identity (module docstring). Raises `GatewayError` (400) on bad input."""
    lower = {k.lower(): v for k, v in headers.items()}
    hints, body_user = body_hints(body)
    try:
        resolved = resolve_branch(lower, hints, RequestId(request_id))
    except ApiError as exc:
        raise bad_request(exc.message, exc.param) from None
    ephemeral = resolved.source is BranchSource.GENERATED
    branch = None if ephemeral else str(resolved.branch.scoped_id())
    parent = str(resolved.parent.scoped_id()) if resolved.parent is not None else None
    requested = parse_requirements(lower.get(requirements_header.lower()), requirements_header)
    try:
        requirements = key_requirements.merged(requested)
    except BindingError as exc:
        raise bad_request(f"{requirements_header}: {exc} (the API key's requirements are fixed)", requirements_header) from None

    header_user = lower.get(user_header.lower())
    if key_name is not None:
        user, source = f"key:{key_name}", UserSource.API_KEY
    elif header_user is not None:
        user, source = f"user:{_checked_id(header_user, user_header)}", UserSource.USER_HEADER
    elif body_user:
        user, source = f"user:{_checked_id(body_user, 'user')}", UserSource.BODY_USER
    elif parent is not None:
        user, source = f"branch:{parent}", UserSource.PARENT_BRANCH
    elif branch is not None:
        user, source = f"branch:{branch}", UserSource.BRANCH
    else:
        user, source = f"request:{request_id}", UserSource.REQUEST
    return Identity(user, source, branch, parent, resolved.finish_after, requirements)


def _checked_id(value: str, param: str) -> str:
    try:
        return check_id(value, param)
    except ApiError as exc:
        raise bad_request(exc.message, param) from None
