"""`python -m evolving_infra` runs the command-line interface."""

from evolving_infra.cli.main import main

raise SystemExit(main())
