"""The built-in tokenizer's prefix and round-trip invariants, incremental detokenization, the optional
Hugging Face tokenizer, and the HTTP layer's settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from evolving_infra.router.http import RouterHttpSettings, TokenizerKind
from evolving_infra.router.http.settings import HttpFrontFields
from evolving_infra.router.service.settings import RouterSettings
from evolving_infra.router.http.tokenizer import (
    ID_SPACE,
    BuiltinTokenizer,
    IncrementalDetokenizer,
    load_tokenizer,
    piece_id,
    render_chat,
    syllable_word,
)
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

TOK = BuiltinTokenizer()
_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=60)
_ids = st.lists(st.integers(0, ID_SPACE - 1), max_size=30)


@given(_text, _text, st.sampled_from([" ", "\n", "\t", "  "]))
def test_encoding_is_concatenative_at_whitespace(a: str, b: str, sep: str) -> None:
    assert TOK.encode(a + sep + b) == TOK.encode(a) + TOK.encode(b)


@given(_text, _text)
def test_equal_prefixes_give_equal_token_prefixes(prefix: str, rest: str) -> None:
    whole = TOK.encode(prefix + "\n" + rest)
    assert whole[: len(TOK.encode(prefix))] == TOK.encode(prefix)


@given(st.integers(0, ID_SPACE - 1))
def test_syllable_words_spell_their_ids(token_id: int) -> None:
    word = syllable_word(token_id)
    assert word.isalpha() and word.islower()
    assert piece_id(word) == token_id


@given(_ids)
def test_generated_text_encodes_back_to_the_same_ids(ids: list[int]) -> None:
    assert TOK.encode(TOK.decode(ids)) == ids


@given(_text)
def test_ids_are_31_bit_and_stable(text: str) -> None:
    ids = TOK.encode(text)
    assert all(0 <= t < ID_SPACE for t in ids)
    assert ids == BuiltinTokenizer().encode(text)


def test_known_pieces() -> None:
    assert syllable_word(0) == "ba"
    assert piece_id("baba") != 0, "non-canonical words are hashed, not spelled"
    assert TOK.encode("Hello, world!") == [piece_id("Hello"), piece_id(","), piece_id("world"), piece_id("!")]


@given(
    st.lists(
        st.tuples(st.sampled_from(["user", "assistant", "system", "tool"]), _text), min_size=1, max_size=5
    )
)
def test_a_chat_prompt_is_a_prefix_of_the_next_turns_prompt(turns: list[tuple[str, str]]) -> None:
    messages = [{"role": r, "content": c} for r, c in turns]
    reply = {"role": "assistant", "content": TOK.decode([5, 6, 7])}
    now = TOK.apply_chat_template(messages)
    later = TOK.apply_chat_template([*messages, reply, {"role": "user", "content": "next"}])
    assert later[: len(now) + 3] == [*now, 5, 6, 7]


def test_tools_and_tool_calls_are_part_of_the_prompt() -> None:
    call = [{"id": "c", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]
    text = render_chat([{"role": "assistant", "content": None, "tool_calls": call}], tools=[{"name": "ls"}])
    assert text.startswith("<|tools|>\n") and '"name": "ls"' in text and text.endswith("<|assistant|>\n")


@given(_ids, st.lists(st.integers(1, 4), min_size=1, max_size=40))
def test_incremental_deltas_add_up_to_the_full_decode(ids: list[int], cuts: list[int]) -> None:
    detok = IncrementalDetokenizer(TOK)
    out, i, k = [], 0, 0
    while i < len(ids):
        step = cuts[k % len(cuts)]
        out.append(detok.push(ids[i : i + step]))
        i, k = i + step, k + 1
    out.append(detok.flush())
    assert "".join(out) == TOK.decode(ids)


class _BytesTokenizer:
    """Each id is one UTF-8 byte: decoding a split character gives U+FFFD, as byte-level BPE does."""

    name = "bytes"
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, token_ids: list[int]) -> str:
        return bytes(token_ids).decode(errors="replace")

    def apply_chat_template(self, messages, tools=None):  # type: ignore[no-untyped-def]
        return self.encode(render_chat(messages, tools))


@given(st.text(max_size=20))
def test_detokenizer_holds_back_split_characters(text: str) -> None:
    tok = _BytesTokenizer()
    detok = IncrementalDetokenizer(tok)  # type: ignore[arg-type]
    deltas = [detok.push([b]) for b in tok.encode(text)] + [detok.flush()]
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas if "\ufffd" not in text)


def test_huggingface_tokenizer_from_a_tokenizer_json(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "<|user|>": 3}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    loaded = load_tokenizer(TokenizerKind.HUGGINGFACE, path)
    assert loaded.encode("hello world") == [1, 2]
    assert loaded.vocab_size == 4
    assert loaded.apply_chat_template([{"role": "user", "content": "hello"}])


def test_huggingface_tokenizer_errors_say_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs a tokenizer path"):
        load_tokenizer(TokenizerKind.HUGGINGFACE, None)
    with pytest.raises(ValueError, match=r"neither a tokenizer\.json file nor a model folder"):
        load_tokenizer(TokenizerKind.HUGGINGFACE, tmp_path / "missing")


# --- settings ---------------------------------------------------------------------------------------


def test_settings_defaults_bind_loopback() -> None:
    settings = RouterHttpSettings()
    assert settings.host == "127.0.0.1" and settings.tokenizer is TokenizerKind.BUILTIN


def test_the_router_settings_read_the_front_ends_fields_and_hand_them_over(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One settings object reads EVOLVING_ROUTER_*: every HTTP field set there reaches the front end."""
    monkeypatch.setenv("EVOLVING_ROUTER_PORT", "9123")
    monkeypatch.setenv("EVOLVING_ROUTER_REQUEST_TIMEOUT_S", "2.5")
    monkeypatch.setenv("EVOLVING_ROUTER_TOKENIZER", "huggingface")
    monkeypatch.setenv("EVOLVING_ROUTER_TOKENIZER_PATH", str(tmp_path))
    monkeypatch.setenv("EVOLVING_ROUTER_OFFLOAD_BYTES", "0")
    monkeypatch.setenv("EVOLVING_ROUTER_BODY_READ_TIMEOUT_S", "7")
    http = RouterSettings(nodes={"n": "127.0.0.1:1"}, metrics_port=9500).http(context_tokens=4096)
    assert (http.port, http.request_timeout_s, http.offload_bytes, http.body_read_timeout_s) == (9123, 2.5, 0, 7.0)
    assert http.tokenizer is TokenizerKind.HUGGINGFACE and http.tokenizer_path == tmp_path
    assert (http.context_tokens, http.admin_port) == (4096, 9500)
    # The front end's own settings object reads no environment: nothing set above reaches it.
    assert RouterHttpSettings().port == 8000
    # Every front-end field is declared once and inherited (no copy that could drift).
    assert set(HttpFrontFields.model_fields) <= set(RouterSettings.model_fields)
    for name in HttpFrontFields.model_fields:
        assert repr(RouterSettings.model_fields[name]) == repr(HttpFrontFields.model_fields[name]), name


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("port", 70000),
        ("request_timeout_s", 0),
        ("max_body_bytes", 10),
        ("tokenizer", "sentencepiece"),
        ("model_name", ""),
    ],
)
def test_settings_reject_out_of_bounds_values_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValidationError, match=field):
        RouterHttpSettings(**{field: value})


def test_settings_tokenizer_path_must_match_kind(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="needs tokenizer_path"):
        RouterHttpSettings(tokenizer=TokenizerKind.HUGGINGFACE)
    with pytest.raises(ValidationError, match="tokenizer is 'builtin'"):
        RouterHttpSettings(tokenizer_path=tmp_path)
    assert json.loads(RouterHttpSettings().model_dump_json())["tokenizer"] == "builtin"
