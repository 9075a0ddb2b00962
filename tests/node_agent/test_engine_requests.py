"""`validate_pages`: page lists must agree with token counts, and no page hash may repeat or be reused."""

from __future__ import annotations

import pytest

from evolving_infra.core.types import BranchId, RequestId
from evolving_infra.node_agent.engine import DecodeRequest
from evolving_infra.node_agent.engine.requests import validate_pages

PAGE = 4


def _req(prompt: tuple[int, ...], tokens: int, out: int, generated: tuple[int, ...] | None) -> DecodeRequest:
    return DecodeRequest(RequestId("r"), BranchId("b"), prompt, tokens, out, 1.0, generated)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("req", "match"),
    [
        (_req((1, 2), 13, 3, None), "make 3 full page"),
        (_req((1, 1), 9, 3, None), "prompt page hashes repeat"),
        (_req((1, 2), 9, 7, (3, 3)), "generated page hashes repeat or reuse"),
        (_req((1, 2), 9, 7, (2, 3)), "generated page hashes repeat or reuse"),
        (_req((1, 2), 9, 7, (3,)), "completes 2 full page"),
    ],
)
def test_bad_page_lists_are_refused(req: DecodeRequest, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        validate_pages(req, PAGE)


def test_consistent_page_lists_pass() -> None:
    validate_pages(_req((1, 2), 9, 7, (3, 4)), PAGE)
    validate_pages(_req((1, 2), 9, 7, None), PAGE)
