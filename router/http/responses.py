"""OpenAI response bodies and server-sent-event framing for both completion endpoints.

Shapes follow the OpenAI API: `chat.completion` / `chat.completion.chunk` and `text_completion`
objects; a stream is a sequence of `data: <json>` events ending with `data: [DONE]`. With
`stream_options.include_usage`, every chunk carries `"usage": null` and one last chunk before `[DONE]`
has `"choices": []` and the usage, including `prompt_tokens_details.cached_tokens` (and, when the backend
names the serving nodes, the extension `evolving: {prefill_node, decode_node, queue_s}`). A chat stream opens
with a chunk whose delta carries the role, and its finish reason comes in a chunk with an empty delta.

Boundary: pure builders of JSON-ready dicts and bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from evolving_infra.router.http.api import Endpoint
from evolving_infra.router.http.backend import FinishReason, ServingNodes

DONE = b"data: [DONE]\n\n"


def sse(obj: dict[str, Any]) -> bytes:
    """One server-sent event carrying `obj` as compact JSON."""
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


PREFILL_NODE_HEADER = "x-evolving-prefill-node"
DECODE_NODE_HEADER = "x-evolving-decode-node"


def usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int, serving: ServingNodes | None = None
) -> dict[str, Any]:
    """The OpenAI usage object; with `serving`, plus the extension `evolving` naming the serving nodes."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }
    if serving is not None:
        out["evolving"] = {
            "prefill_node": serving.prefill_node, "decode_node": serving.decode_node, "queue_s": serving.queue_s,
        }  # fmt: skip
    return out


def serving_headers(serving: ServingNodes | None) -> dict[str, str]:
    """Response headers naming the serving nodes known now."""
    if serving is None:
        return {}
    out = {PREFILL_NODE_HEADER: serving.prefill_node}
    if serving.decode_node is not None:
        out[DECODE_NODE_HEADER] = serving.decode_node
    return out


@dataclass(frozen=True, slots=True)
class ResponseHead:
    """What every object of one answer shares."""

    endpoint: Endpoint
    request_id: str
    created: int
    model: str

    @property
    def id(self) -> str:
        prefix = "chatcmpl" if self.endpoint is Endpoint.CHAT_COMPLETIONS else "cmpl"
        return f"{prefix}-{self.request_id}"

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    @property
    def _chat(self) -> bool:
        return self.endpoint is Endpoint.CHAT_COMPLETIONS

    def full(self, text: str, finish_reason: FinishReason, used: dict[str, Any]) -> dict[str, Any]:
        """The non-streaming answer."""
        if self._chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason.value,
            }
            out = self._base("chat.completion")
        else:
            choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason.value}
            out = self._base("text_completion")
        out["choices"] = [choice]
        out["usage"] = used
        return out

    def chunk(
        self,
        *,
        text: str | None = None,
        role: bool = False,
        finish_reason: FinishReason | None = None,
        include_usage: bool = False,
    ) -> dict[str, Any]:
        """One streamed chunk: a role opener (chat), a text delta, or the finish reason."""
        reason = finish_reason.value if finish_reason is not None else None
        if self._chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
                delta["content"] = text or ""
            elif text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            out = self._base("chat.completion.chunk")
        else:
            choice = {"text": text or "", "index": 0, "logprobs": None, "finish_reason": reason}
            out = self._base("text_completion")
        out["choices"] = [choice]
        if include_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, used: dict[str, Any]) -> dict[str, Any]:
        """The last chunk of a stream with `include_usage`: no choices, the usage."""
        out = self._base("chat.completion.chunk" if self._chat else "text_completion")
        out["choices"] = []
        out["usage"] = used
        return out
