#!/usr/bin/env python3
"""Run the evaluation matrix of simulator runs and render its tables (see docs/evaluation.md).

    .venv/bin/python scripts/evaluate.py run --matrix cc90 --warmup 600 --duration 1200 --jobs 2
    .venv/bin/python scripts/evaluate.py render --cache runs/eval

A thin wrapper over `evolving_infra.cli.evaluate`.
"""

from __future__ import annotations

import sys

from evolving_infra.cli.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
