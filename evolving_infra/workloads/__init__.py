"""Synthetic agent workloads written as traces (format version 1, `shared/trace-format.md`).

Generators for the paper's agent workloads: `putnam` (decode-heavy math agent), `cc` (coding agent with
sub-agents, forks and compaction), `osworld` (prefill-heavy computer-use agent), `mixed` (Putnam and OSWorld at a
fixed ratio) and `shift` (section 6.3: Putnam, then mixed, then OSWorld). Each kind has a parameter dataclass whose
every default names its source in the paper or is marked as an assumption; `generate(kind, agents, seed,
**overrides)` returns the records and `write_trace` writes them as `.jsonl` or `.jsonl.gz`.

Boundary: pure generation from seeded `random.Random` streams (no clock, no global random state); writing a file is
the only I/O. Sits beside `evolving_infra.traces` and imports only `core` and `traces`.
"""

from evolving_infra.workloads.cc import CCParams
from evolving_infra.workloads.compose import MixedParams, Period, ShiftParams
from evolving_infra.workloads.dist import LogNormal
from evolving_infra.workloads.generate import KINDS, Kind, default_params, generate, generate_with, kind_of
from evolving_infra.workloads.osworld import OSWorldParams
from evolving_infra.workloads.params import OverrideError, describe, with_overrides
from evolving_infra.workloads.putnam import PutnamParams
from evolving_infra.workloads.shape import Shape, Wait, format_shape, shapes
from evolving_infra.workloads.writer import dumps, write_trace

__all__ = [
    "KINDS",
    "CCParams",
    "Kind",
    "LogNormal",
    "MixedParams",
    "OSWorldParams",
    "OverrideError",
    "Period",
    "PutnamParams",
    "Shape",
    "ShiftParams",
    "Wait",
    "default_params",
    "describe",
    "dumps",
    "format_shape",
    "generate",
    "generate_with",
    "kind_of",
    "shapes",
    "with_overrides",
    "write_trace",
]
