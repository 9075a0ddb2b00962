"""API keys, per-key concurrency and the access log of the HTTP front end.

- `ApiKeys`: keys read from a file (one `key` or `name:key` per line, `#` comments, blank lines skipped).
  A request presents `Authorization: Bearer <key>`; it is compared with every key in constant time
  (`hmac.compare_digest`, no early exit), and the request is then known by the key's *name*, never the key
  itself (logs, limits). Every route but `/healthz` and `/readyz` needs a key when keys are configured.
- `KeyLimiter`: at most N completions in flight per key name (429 `rate_limit_exceeded` above).
- `access_line`: one JSON line per answered request for the `evolving_infra.router.access` logger: time,
  request id, key name, method, route, status, duration and bytes sent. Never the prompt, a header value
  or a key.

Boundary: plain values and checks; the middleware in server.py applies them.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from evolving_infra.router.http.errors import ApiError, ErrorCode, ErrorType

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
"""Routes answered without an API key (probes)."""
MIN_KEY_CHARS = 16
MAX_KEY_CHARS = 512
MAX_KEYS = 10_000
MAX_KEY_FILE_BYTES = 4 * 1024 * 1024


class ApiKeyFileError(ValueError):
    """The key file is unreadable or malformed; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class ApiKeys:
    """Named API keys (see the module docstring)."""

    keys: tuple[tuple[str, bytes], ...]

    @classmethod
    def load(cls, path: Path) -> ApiKeys:
        try:
            data = path.read_bytes()[: MAX_KEY_FILE_BYTES + 1]
        except OSError as error:
            raise ApiKeyFileError(f"API key file {str(path)!r}: cannot read it ({error.strerror or error})") from error
        if len(data) > MAX_KEY_FILE_BYTES:
            raise ApiKeyFileError(f"API key file {str(path)!r}: larger than {MAX_KEY_FILE_BYTES} bytes")
        return cls.parse(data, str(path))

    @classmethod
    def parse(cls, data: bytes, where: str = "API key file") -> ApiKeys:
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError as error:
            raise ApiKeyFileError(f"{where}: not ASCII (byte {error.start})") from None
        keys: list[tuple[str, bytes]] = []
        names: set[str] = set()
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, key = line.partition(":")
            if not sep:
                name, key = f"key-{len(keys) + 1}", line
            if not name or not name.isprintable() or len(name) > 64 or " " in name:
                raise ApiKeyFileError(f"{where}:{number}: a key name is 1-64 printable characters without spaces")
            if not MIN_KEY_CHARS <= len(key) <= MAX_KEY_CHARS or not key.isprintable() or " " in key:
                raise ApiKeyFileError(
                    f"{where}:{number}: a key is {MIN_KEY_CHARS}-{MAX_KEY_CHARS} printable characters without spaces"
                )
            if name in names:
                raise ApiKeyFileError(f"{where}:{number}: key name {name!r} is used twice")
            names.add(name)
            keys.append((name, key.encode("ascii")))
        if not keys:
            raise ApiKeyFileError(f"{where}: no keys in the file")
        if len(keys) > MAX_KEYS:
            raise ApiKeyFileError(f"{where}: {len(keys)} keys, at most {MAX_KEYS}")
        return cls(tuple(keys))

    def identify(self, authorization: str | None) -> str | None:
        """The name of the key in `Authorization: Bearer <key>`, or None. Every key is compared, in constant
        time, whatever matched first."""
        if authorization is None:
            return None
        scheme, _, given = authorization.partition(" ")
        presented = given.strip().encode("utf-8", "replace") if scheme.lower() == "bearer" else b""
        found: str | None = None
        for name, key in self.keys:
            if hmac.compare_digest(presented, key) and found is None:
                found = name
        return found


def unauthorized(missing: bool) -> ApiError:
    message = (
        "You didn't provide an API key: send it as 'Authorization: Bearer <key>'."
        if missing
        else "Incorrect API key provided."
    )
    return ApiError(401, message, ErrorType.INVALID_REQUEST, ErrorCode.INVALID_API_KEY)


class KeyLimiter:
    """Completions in flight per key name, at most `limit` each (None: no limit)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.inflight: dict[str, int] = {}

    @contextmanager
    def hold(self, key: str, retry_after_s: float) -> Iterator[None]:
        held = self.inflight.get(key, 0)
        if self.limit is not None and held >= self.limit:
            raise ApiError(
                429,
                f"this API key already has {held} requests in flight, the limit is {self.limit}",
                ErrorType.RATE_LIMIT,
                ErrorCode.RATE_LIMITED,
                should_retry=True,
                retry_after_s=max(1.0, retry_after_s),
            )
        self.inflight[key] = held + 1
        try:
            yield
        finally:
            left = self.inflight[key] - 1
            if left:
                self.inflight[key] = left
            else:
                del self.inflight[key]


def access_line(
    request_id: str, key: str | None, method: str, route: str, status: int, seconds: float, sent: int | None
) -> str:
    """One access log record (JSON): no prompt text, header values or keys."""
    return json.dumps(
        {
            "ts": round(time.time(), 3),
            "request_id": request_id,
            "key": key,
            "method": method,
            "route": route,
            "status": status,
            "duration_s": round(seconds, 4),
            "bytes": sent,
        },
        separators=(",", ":"),
    )
