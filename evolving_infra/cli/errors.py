"""Errors a subcommand raises to end with a specific message and exit status."""

from __future__ import annotations


class CliError(Exception):
    """A user-facing failure: printed as `error: <message>` on stderr, exits with `exit_code`."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


USAGE_ERROR = 2
"""Exit status for bad input (a broken trace, a bad flag value), as argparse uses for bad usage."""
