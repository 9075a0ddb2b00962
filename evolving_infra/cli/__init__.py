"""Command-line interface (`evolving-infra`): argument parsing and terminal output only.

Boundary: each subcommand module registers its parser and calls into the pure core or a service; no
algorithm lives here.
"""
