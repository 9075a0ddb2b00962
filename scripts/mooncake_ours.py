"""Our side of `evolving-infra bench sim --against-dynamo` alone, for timing two copies of the tree against
each other without Dynamo's replay in the measurement.

    python scripts/mooncake_ours.py [--tree TREE] [--rows N] [--trace FILE]

Replays the first N rows of the Mooncake trace (default: all) through our simulator as `bench sim
--against-dynamo` does (`peers.judge.run_ours`: system evolving, 4P5D, the peer profile, exact engine models) and
prints one JSON line: wall and CPU seconds of the replay, kernel events, requests finished, peak resident
memory, and a digest of the request records (equal digests: the same results). `--tree` imports every
component from a copy of the repository (as `scripts/sim_reference_runs.py as-tree` does).

Boundary: a development tool (docs/benchmarks.md, "Our simulator against Dynamo's replay"); never imported by
the package.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import sys
import time
from pathlib import Path

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, help="a copy of the repository to import every component from")
    parser.add_argument("--rows", type=int, help="the first N rows of the trace (default: all)")
    parser.add_argument("--trace", type=Path, help="a Mooncake trace (default: `bench sim --mooncake`'s)")
    args = parser.parse_args()
    if args.rows is not None and args.rows < 1:
        parser.error(f"--rows must be >= 1, got {args.rows}")
    if args.tree is not None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import sim_reference_runs

        sim_reference_runs.import_from(args.tree.resolve())

    from evolving_infra.cli.bench_sim import MOONCAKE, PEER_PROFILE, default_split
    from evolving_infra.peers.judge import OurSide, run_ours
    from evolving_infra.traces.loader import trace_from_records
    from evolving_infra.traces.mooncake import convert_mooncake, read_mooncake

    if args.tree is not None and not Path(sys.modules["evolving_infra.sim"].__file__ or "").resolve().is_relative_to(
        args.tree.resolve()
    ):
        raise SystemExit(f"evolving_infra.sim did not come from {args.tree}")
    path = args.trace or MOONCAKE
    rows = read_mooncake(path)[: args.rows]
    records, _ = convert_mooncake(rows, name=f"mooncake-{path.stem}", source=str(path))
    trace = trace_from_records(records)
    cpu = time.process_time()
    run = run_ours(OurSide.EVOLVING, trace, profile=PEER_PROFILE, split=default_split(9))  # as `bench sim` does
    cpu = time.process_time() - cpu
    digest = hashlib.sha256(repr(run.requests).encode()).hexdigest()[:16]
    print(json.dumps({"rows": len(rows), "wall_s": round(run.wall_s, 2), "cpu_s": round(cpu, 2),
                      "events": run.detail["events"], "requests": len(run.requests), "records_sha256": digest,
                      "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))  # fmt: skip


if __name__ == "__main__":
    main()
