"""The simulator's reference runs of issue #11, for any copy of the source tree, and their byte-identical check.

    python scripts/sim_reference_runs.py run TREE OUT [--quick | --only NAME...]  # the runs of TREE into OUT/<name>/
    python scripts/sim_reference_runs.py compare OUT_A OUT_B  # exit 1 unless the runs in both are identical; for
                                                              # those that differ: records and metrics that moved

TREE is a copy of the repository (`git archive COMMIT | tar -x -C TREE`, or a copy with some files replaced). The
editable install maps `evolving_infra.<component>` (router, node_agent, sim, ...) to the repository it was
installed from, whatever the working directory, so `python -m evolving_infra` inside a copy would silently run
this checkout's components; each run here goes through `as-tree`, which imports every component from TREE.
`run` prints, per run, the process CPU seconds, peak resident memory and kernel events, and the sha256 of
`metrics.json` and `requests.jsonl`; `--quick` leaves out the 90-agent run (about two thirds of the time).

Boundary: a development tool (docs/benchmarks.md, "Reference runs of issue #11"); never imported by the package.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.machinery
import importlib.util
import json
import resource
import runpy
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

COMPONENTS = ("router", "node_agent", "operator", "sim", "proto")
FILES = ("metrics.json", "requests.jsonl")
_S = ["simulate", "--nodes", "9", "--split", "6P3D", "--agents", "30", "--quiet"]
RUNS: dict[str, list[str]] = {
    "cc-evolving": [*_S, "--workload", "cc", "--system", "evolving", "--warmup", "120", "--duration", "240", "--seed", "3"],
    "cc-dynamo": [*_S, "--workload", "cc", "--system", "dynamo", "--warmup", "120", "--duration", "240", "--seed", "3"],
    "cc-static": [*_S, "--workload", "cc", "--system", "best-static", "--warmup", "120", "--duration", "240",
                  "--seed", "3"],
    "putnam": [*_S, "--workload", "putnam", "--system", "arrow", "--warmup", "120", "--duration", "180", "--seed", "1"],
    "osworld": [*_S, "--workload", "osworld", "--system", "evolving", "--warmup", "120", "--duration", "180",
                "--seed", "2"],
    "cc90": ["simulate", "--workload", "cc", "--agents", "90", "--nodes", "9", "--system", "evolving", "--warmup",
             "300", "--duration", "300", "--quiet"],
}  # fmt: skip
QUICK = ("cc-evolving", "cc-dynamo", "cc-static", "putnam", "osworld")


class _TreeFinder(importlib.machinery.PathFinder):
    """Finds `evolving_infra.<component>` in TREE/<component> (ahead of the editable install's finder)."""

    tree = Path()

    @classmethod
    def find_spec(cls, fullname: str, path: object = None, target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:  # fmt: skip
        top, _, component = fullname.partition(".")
        if top != "evolving_infra" or component not in COMPONENTS:
            return None
        folder = cls.tree / component
        return importlib.util.spec_from_file_location(fullname, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])  # fmt: skip


def import_from(tree: Path) -> None:
    """Import every component of `evolving_infra` from `tree` (a copy of the repository) from now on."""
    sys.path.insert(0, str(tree))
    _TreeFinder.tree = tree
    sys.meta_path.insert(0, _TreeFinder)


def as_tree(tree: Path, argv: list[str]) -> None:
    """Run `python -m evolving_infra ARGV` with every module taken from `tree`."""
    import_from(tree)
    import evolving_infra

    if not Path(evolving_infra.__file__ or "").resolve().is_relative_to(tree):
        raise SystemExit(f"evolving_infra came from {evolving_infra.__file__}, not from {tree}")
    sys.argv = ["evolving_infra", *argv]
    runpy.run_module("evolving_infra", run_name="__main__", alter_sys=True)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def run(tree: Path, out: Path, names: tuple[str, ...]) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        folder = out / name
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        command = [sys.executable, __file__, "as-tree", str(tree), *RUNS[name], "--out", str(folder)]
        done = subprocess.run(command, capture_output=True, text=True, cwd=out)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
            return done.returncode
        metrics = json.loads((folder / "metrics.json").read_text())
        simulation = metrics.get("simulation", {})
        print(json.dumps({
            "run": name, "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2),
            "wall_s": round(time.perf_counter() - start, 1), "peak_rss_mib": round(after.ru_maxrss / 1024),
            "events": simulation.get("events"), **{f: _digest(folder / f) for f in FILES},
        }))  # fmt: skip
    return 0


def _numbers(value: object, prefix: str = "") -> dict[str, float]:
    """The numeric leaves of a JSON value, by dotted path."""
    if isinstance(value, dict):
        out: dict[str, float] = {}
        for key, item in value.items():
            out.update(_numbers(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {prefix: float(value)}
    return {}


def _how_different(name: str, left: Path, right: Path, shown: int = 6) -> list[str]:
    """For two different outputs: how many request records differ, or which overall metrics moved and by how much
    (the largest relative changes first)."""
    if name == "requests.jsonl":
        a, b = left.read_text().splitlines(), right.read_text().splitlines()
        changed = sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))
        return [f"{changed} of {max(len(a), len(b))} records differ"]
    try:
        old = _numbers(json.loads(left.read_text()).get("overall", {}))
        new = _numbers(json.loads(right.read_text()).get("overall", {}))
    except (ValueError, AttributeError):
        return ["not comparable as metrics"]
    moved = sorted(
        ((abs(new[k] - v) / abs(v) if v else float("inf"), k, v, new[k]) for k, v in old.items() if k in new and new[k] != v),
        reverse=True,
    )  # fmt: skip
    lines = [f"{len(moved)} of {len(old)} overall metrics differ"]
    lines += [f"{k}: {v:.6g} -> {w:.6g} ({(w - v) / abs(v):+.4%})" if v else f"{k}: {v:.6g} -> {w:.6g}"
              for _, k, v, w in moved[:shown]]  # fmt: skip
    return lines


def compare(a: Path, b: Path) -> int:
    differ = compared = 0
    for name in RUNS:
        if not (a / name).is_dir() or not (b / name).is_dir():
            if (a / name).is_dir() or (b / name).is_dir():
                print(f"{name}: only in {a if (a / name).is_dir() else b}, not compared")
            continue
        compared += 1
        for f in FILES:
            left, right = a / name / f, b / name / f
            same = left.is_file() and right.is_file() and left.read_bytes() == right.read_bytes()
            differ += not same
            print(f"{name}/{f}: {'identical' if same else 'DIFFERENT'}")
            if not same and left.is_file() and right.is_file():
                for line in _how_different(f, left, right):
                    print(f"    {line}")
    if not compared:
        print("no run is in both folders")
    return 1 if differ or not compared else 0


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "as-tree":
        as_tree(Path(sys.argv[2]).resolve(), sys.argv[3:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="the reference runs of TREE into OUT")
    p_run.add_argument("tree", type=Path)
    p_run.add_argument("out", type=Path)
    p_run.add_argument("--quick", action="store_true", help="the five 30-agent runs only")
    p_run.add_argument("--only", nargs="+", choices=list(RUNS), help="these runs only")
    p_cmp = sub.add_parser("compare", help="exit 1 unless both folders hold identical outputs")
    p_cmp.add_argument("a", type=Path)
    p_cmp.add_argument("b", type=Path)
    args = parser.parse_args()
    if args.command == "compare":
        return compare(args.a, args.b)
    tree = args.tree.resolve()
    if not all((tree / c / "__init__.py").is_file() for c in ("router", "node_agent", "sim")):
        parser.error(f"{tree} is not a copy of the repository (no router/, node_agent/, sim/ packages)")
    names = tuple(args.only) if args.only else QUICK if args.quick else tuple(RUNS)
    return run(tree, args.out.resolve(), names)


if __name__ == "__main__":
    sys.exit(main())
