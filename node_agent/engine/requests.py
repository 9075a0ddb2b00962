"""Work the engine core accepts: prefill requests (with their peer fetch plan) and decode requests.

Page conventions (page size `p` tokens): `prompt_pages` are the chained hashes of the prompt's *full*
pages, so `len(prompt_pages) == prompt_tokens // p`; a partial last page has no hash and is never cached.
`generated_pages` (optional) are the hashes of the full pages that generation completes, continuing the
chain: `(prompt_tokens + output_tokens) // p - len(prompt_pages)` of them. When absent, the engine derives
stand-in hashes from the request id (emulation: the content of generated tokens is not known).

Boundary: immutable, self-validating values; validation that needs the page size is in `validate_pages`.
"""

from __future__ import annotations

from dataclasses import dataclass

from evolving_infra.core.fetch import FetchRun
from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import BranchId, NodeId, RequestId


def _check_common(request: RequestId, prompt_tokens: int, output_tokens: int, t_acc: float) -> None:
    if prompt_tokens < 1:
        raise ValueError(f"request {request}: prompt_tokens must be >= 1, got {prompt_tokens}")
    if output_tokens < 0:
        raise ValueError(f"request {request}: output_tokens must be >= 0, got {output_tokens}")
    if not t_acc > 0:
        raise ValueError(f"request {request}: t_acc must be > 0, got {t_acc}")


@dataclass(frozen=True, slots=True)
class PrefillRequest:
    """A prompt to prefill. `output_tokens` and `t_acc` matter only where the node also decodes it
    (collocated mode); `fetch` is the router's plan of prefix pages to pull from peers."""

    request: RequestId
    branch: BranchId
    prompt_pages: tuple[PageHash, ...]
    prompt_tokens: int
    output_tokens: int = 0
    t_acc: float = 1.0
    fetch: tuple[FetchRun, ...] = ()
    generated_pages: tuple[PageHash, ...] | None = None

    def __post_init__(self) -> None:
        _check_common(self.request, self.prompt_tokens, self.output_tokens, self.t_acc)
        if not self.fetch:
            return
        covered = 0
        for run in sorted(self.fetch, key=lambda r: r.start):
            where = f"request {self.request}: fetch run [{run.start}, {run.end})"
            if run.prompt is not self.prompt_pages and run.prompt != self.prompt_pages:
                raise ValueError(f"{where} is not bound to this request's prompt pages")
            if run.start < covered:
                raise ValueError(f"{where} overlaps another run: a page is planned twice")
            covered = run.end


@dataclass(frozen=True, slots=True)
class DecodeRequest:
    """A request whose prompt KV the prefill node transferred here; decode generates `output_tokens`."""

    request: RequestId
    branch: BranchId
    prompt_pages: tuple[PageHash, ...]
    prompt_tokens: int
    output_tokens: int
    t_acc: float = 1.0
    generated_pages: tuple[PageHash, ...] | None = None

    def __post_init__(self) -> None:
        _check_common(self.request, self.prompt_tokens, self.output_tokens, self.t_acc)
        if self.output_tokens < 1:
            raise ValueError(f"request {self.request}: a decode request needs output_tokens >= 1")


def validate_pages(req: PrefillRequest | DecodeRequest, page_tokens: int) -> None:
    """Raise ValueError unless the request's page lists agree with its token counts at this page size."""
    full = req.prompt_tokens // page_tokens
    if len(req.prompt_pages) != full:
        raise ValueError(
            f"request {req.request}: {req.prompt_tokens} prompt tokens make {full} full page(s) of {page_tokens} "
            f"tokens, but {len(req.prompt_pages)} page hash(es) were given"
        )
    prompt = set(req.prompt_pages)
    if len(prompt) != len(req.prompt_pages):
        raise ValueError(f"request {req.request}: prompt page hashes repeat")
    if req.generated_pages is not None:
        generated = set(req.generated_pages)
        if len(generated) != len(req.generated_pages) or not prompt.isdisjoint(generated):
            raise ValueError(f"request {req.request}: generated page hashes repeat or reuse prompt page hashes")
        want = generated_page_count(req.prompt_tokens, req.output_tokens, page_tokens)
        if len(req.generated_pages) != want:
            raise ValueError(
                f"request {req.request}: generation completes {want} full page(s), "
                f"but {len(req.generated_pages)} generated page hash(es) were given"
            )


def generated_page_count(prompt_tokens: int, output_tokens: int, page_tokens: int) -> int:
    return (prompt_tokens + output_tokens) // page_tokens - prompt_tokens // page_tokens


def generated_pages(req: PrefillRequest | DecodeRequest, page_tokens: int) -> tuple[PageHash, ...]:
    """The request's generated page hashes, or stand-ins chained from its last prompt page."""
    if req.generated_pages is not None:
        return req.generated_pages
    n = generated_page_count(req.prompt_tokens, req.output_tokens, page_tokens)
    parent = req.prompt_pages[-1] if req.prompt_pages else 0
    contents = (f"generated:{req.request}:{i}".encode() for i in range(n))
    return tuple(chain_hashes(contents, parent))


def pages_needed(tokens: int, page_tokens: int) -> int:
    """Page slots that `tokens` tokens occupy (a partial last page takes a whole slot)."""
    return -(-tokens // page_tokens)
