"""Tokenizers for the front end: the `Tokenizer` Protocol, a deterministic built-in one, optional
Hugging Face ones, and incremental detokenization for streaming.

`BuiltinTokenizer` (for the emulated engine; no vocabulary files):
- `encode` splits text into pieces (runs of word characters, or single other non-space characters;
  whitespace only separates) and maps each piece to a 31-bit id. Invariant: the ids of a piece depend on
  the piece alone, so `encode(a + " " + b) == encode(a) + encode(b)` and equal prefixes (cut at piece
  boundaries) give equal token prefixes — what prefix caching needs.
- Pieces that are "syllable words" in canonical form (consonant-vowel pairs, see `syllable_word`) map
  to the number they spell; every other piece maps to `xxh3_64(piece) & 0x7FFFFFFF`.
- `decode` writes every id as its syllable word, each preceded by a space. So generated tokens decode
  to readable stand-in words that encode back to the same ids: a conversation that feeds the emulated
  model's output back as the next prompt reuses its prefix exactly. Text typed by people does not
  round-trip (it comes back as stand-in words).
- The chat template renders `<|role|>` headers (and a `<|tools|>` block), each message followed by a
  newline, and ends with the `<|assistant|>` generation prompt; a conversation's next turn therefore
  starts with the previous prompt and the previous reply.

`TokenizersTokenizer` (a `tokenizer.json`, needs the `tokenizers` package) and `TransformersTokenizer`
(a model folder, needs `transformers`) are loaded only when configured; neither package is a
dependency of this project.

Boundary: pure text <-> id functions; loading a configured tokenizer reads local files only.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import xxhash
from evolving_infra.router.http.settings import TokenizerKind

ID_SPACE = 1 << 31
_PIECE = re.compile(r"\w+|[^\w\s]")
_CONSONANTS = "bdfghjklmnprstvz"
_VOWELS = "aeiou"
_BASE = len(_CONSONANTS) * len(_VOWELS)
_SYLLABLE_WORD = re.compile(rf"(?:[{_CONSONANTS}][{_VOWELS}])+")

Message = Mapping[str, Any]
"""A chat message as a mapping: `role`, `content` (text or None), optional `name`, `tool_calls`."""


class Tokenizer(Protocol):
    """What the front end needs from a tokenizer."""

    @property
    def name(self) -> str: ...

    @property
    def vocab_size(self) -> int:
        """Token ids are in `[0, vocab_size)`."""
        ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def apply_chat_template(
        self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        """Prompt token ids for a chat, ending with the assistant generation prompt."""
        ...


def syllable_word(token_id: int) -> str:
    """The canonical syllable word of an id: its base-80 digits, most significant first, each written
    as consonant + vowel (no leading zero digit; 0 is "ba")."""
    if not 0 <= token_id < ID_SPACE:
        raise ValueError(f"token id must be in [0, {ID_SPACE}), got {token_id}")
    digits: list[str] = []
    value = token_id
    while True:
        value, digit = divmod(value, _BASE)
        c, v = divmod(digit, len(_VOWELS))
        digits.append(_CONSONANTS[c] + _VOWELS[v])
        if value == 0:
            break
    return "".join(reversed(digits))


def _syllable_value(piece: str) -> int | None:
    """The id a canonical syllable word spells, or None for any other piece."""
    if not _SYLLABLE_WORD.fullmatch(piece) or (len(piece) > 2 and piece.startswith("ba")):
        return None
    value = 0
    for i in range(0, len(piece), 2):
        value = value * _BASE + _CONSONANTS.index(piece[i]) * len(_VOWELS) + _VOWELS.index(piece[i + 1])
        if value >= ID_SPACE:
            return None
    return value


def piece_id(piece: str) -> int:
    """The id of one piece (see the module docstring)."""
    spelled = _syllable_value(piece)
    if spelled is not None:
        return spelled
    return xxhash.xxh3_64_intdigest(piece.encode("utf-8")) & (ID_SPACE - 1)


def render_chat(messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None) -> str:
    """The built-in chat template as text, ending with the assistant generation prompt."""
    parts: list[str] = []
    if tools:
        parts.append(f"<|tools|>\n{json.dumps(list(tools), sort_keys=True)}\n")
    for message in messages:
        role = str(message["role"])
        name = message.get("name")
        header = f"<|{role}:{name}|>" if name else f"<|{role}|>"
        content = message.get("content") or ""
        tool_calls = message.get("tool_calls")
        if tool_calls:
            content = (
                f"{content}\n{json.dumps(tool_calls, sort_keys=True)}"
                if content
                else json.dumps(tool_calls, sort_keys=True)
            )
        parts.append(f"{header}\n{content}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)


class BuiltinTokenizer:
    """The deterministic tokenizer of the emulated engine (module docstring)."""

    @property
    def name(self) -> str:
        return "builtin"

    @property
    def vocab_size(self) -> int:
        return ID_SPACE

    def encode(self, text: str) -> list[int]:
        return [piece_id(p) for p in _PIECE.findall(text)]

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(" " + syllable_word(t) for t in token_ids)

    def apply_chat_template(
        self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        return self.encode(render_chat(messages, tools))


class TokenizersTokenizer:
    """A Hugging Face `tokenizers` tokenizer from a `tokenizer.json`; the chat is rendered with the
    built-in template text (the file carries no chat template)."""

    def __init__(self, path: Path) -> None:
        tokenizers = _import_optional("tokenizers")
        self._path = path
        self._tok = tokenizers.Tokenizer.from_file(str(path))

    @property
    def name(self) -> str:
        return f"tokenizers:{self._path}"

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(token_ids), skip_special_tokens=True))

    def apply_chat_template(
        self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        return self.encode(render_chat(messages, tools))


class TransformersTokenizer:
    """A `transformers` tokenizer from a local model folder, with the model's own chat template."""

    def __init__(self, path: Path) -> None:
        transformers = _import_optional("transformers")
        self._path = path
        self._tok = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)

    @property
    def name(self) -> str:
        return f"transformers:{self._path}"

    @property
    def vocab_size(self) -> int:
        return len(self._tok)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(token_ids), skip_special_tokens=True))

    def apply_chat_template(
        self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        out = self._tok.apply_chat_template(
            [dict(m) for m in messages],
            tools=list(tools) if tools else None,
            add_generation_prompt=True,
            tokenize=True,
        )
        ids = out["input_ids"] if isinstance(out, Mapping) else out
        return [int(t) for t in ids]


def _import_optional(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(
            f"the Hugging Face tokenizer needs the {module!r} package, which is not installed "
            f"(install it, or set EVOLVING_ROUTER_TOKENIZER=builtin)"
        ) from exc


def load_tokenizer(kind: TokenizerKind, path: Path | None = None) -> Tokenizer:
    """The configured tokenizer. `HUGGINGFACE` needs `path`: a `tokenizer.json` file (uses `tokenizers`)
    or a model folder (uses `transformers`). Raises ValueError naming what is missing."""
    if kind is TokenizerKind.BUILTIN:
        return BuiltinTokenizer()
    if path is None:
        raise ValueError("tokenizer 'huggingface' needs a tokenizer path (EVOLVING_ROUTER_TOKENIZER_PATH)")
    if path.is_file():
        return TokenizersTokenizer(path)
    if path.is_dir():
        return TransformersTokenizer(path)
    raise ValueError(f"tokenizer path {str(path)!r} is neither a tokenizer.json file nor a model folder")


class IncrementalDetokenizer:
    """Turns a growing list of output ids into text deltas.

    Decodes a short window of recent ids and emits only the new suffix, holding text back while it
    ends in an incomplete character (U+FFFD), as byte-level tokenizers split characters over tokens.
    The concatenated deltas equal `decode(all ids)` for tokenizers whose decoding is concatenative.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def push(self, token_ids: Sequence[int]) -> str:
        """Add ids; return the text they complete (possibly empty)."""
        self._ids.extend(token_ids)
        prefix_text = self._tok.decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._tok.decode(self._ids[self._prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return delta
        return ""

    def flush(self) -> str:
        """The text still held back at the end of the stream."""
        prefix_text = self._tok.decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._tok.decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :] if len(new_text) > len(prefix_text) else ""
