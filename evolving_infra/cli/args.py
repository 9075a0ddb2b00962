"""Small argument parsers shared by subcommands."""

from __future__ import annotations

from collections.abc import Iterable

from evolving_infra.cli.errors import USAGE_ERROR, CliError


def parse_addresses(items: Iterable[str], flag: str, key: str) -> dict[str, str]:
    """Repeated `--flag KEY=HOST:PORT` values as a mapping; a malformed one is a usage error naming it."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, address = item.partition("=")
        if not sep or not name or not address:
            raise CliError(f"{flag} {item!r}: expected {key}=HOST:PORT", USAGE_ERROR)
        out[name] = address
    return out
