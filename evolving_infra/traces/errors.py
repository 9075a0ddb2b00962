"""Why a trace is refused: a stable rule id per rule of the format, and the error that carries it.

Every rule of `shared/trace-format.md` (version 1) has one `Rule` member; its value is the short id printed in
`error: FILE:LINE: [rule] message` and documented in `docs/traces.md`. The ids are part of the public contract:
rename one only with a format version bump.

Boundary: plain values; no parsing here.
"""

from __future__ import annotations

import enum


class Rule(enum.Enum):
    """A rule of trace format version 1 (value = stable id)."""

    # Reading the file and its lines.
    UNREADABLE = "unreadable"
    NOT_UTF8 = "not-utf8"
    INVALID_JSON = "invalid-json"
    NOT_OBJECT = "not-object"
    # Record kinds and the header.
    MISSING_KIND = "missing-kind"
    UNKNOWN_KIND = "unknown-kind"
    HEADER_NOT_FIRST = "header-not-first"
    UNSUPPORTED_VERSION = "unsupported-version"
    # Field presence and types.
    MISSING_FIELD = "missing-field"
    WRONG_TYPE = "wrong-type"
    NOT_INTEGER = "not-integer"
    NOT_NUMBER = "not-number"
    # Uniqueness.
    DUPLICATE_PREFIX = "duplicate-prefix"
    DUPLICATE_AGENT = "duplicate-agent"
    DUPLICATE_REQUEST = "duplicate-request"
    DUPLICATE_BRANCH_END = "duplicate-branch-end"
    # Bounds on numbers.
    NEGATIVE_TOKENS = "negative-tokens"
    NEGATIVE_START = "negative-start"
    NEGATIVE_DELAY = "negative-delay"
    NEGATIVE_KEEP = "negative-keep"
    NEGATIVE_NEW = "negative-new"
    EMPTY_PROMPT = "empty-prompt"
    NO_OUTPUT = "no-output"
    # References (only to ids defined on earlier lines).
    UNDEFINED_AGENT = "undefined-agent"
    UNDEFINED_AFTER = "undefined-after"
    AFTER_OTHER_AGENT = "after-other-agent"
    BRANCH_OTHER_AGENT = "branch-other-agent"
    UNDEFINED_BASE = "undefined-base"
    UNDEFINED_PREFIX = "undefined-prefix"
    BASE_AND_SHARED = "base-and-shared"
    KEEP_EXCEEDS_CONTEXT = "keep-exceeds-context"
    KEEP_EXCEEDS_PREFIX = "keep-exceeds-prefix"
    KEEP_WITHOUT_SOURCE = "keep-without-source"
    # Branch ends.
    UNDEFINED_BRANCH = "undefined-branch"
    BRANCH_END_NOT_IN_BRANCH = "branch-end-not-in-branch"
    REQUEST_AFTER_BRANCH_END = "request-after-branch-end"


class TraceError(ValueError):
    """A trace breaks rule `rule` on `line` (1-based; 0 when no line is concerned)."""

    def __init__(self, line: int, rule: Rule, message: str, source: str | None = None) -> None:
        self.line = line
        self.rule = rule
        self.message = message
        self.source = source
        where = f"{source}:{line}" if source is not None else f"line {line}"
        super().__init__(f"{where}: [{rule.value}] {message}")
