"""What keeping the branch table costs (router/branch_snapshot.py): for tables of B branches of P pages each,
counted on a prefill and a decode node, the time to copy the rows on the event loop (`take`), to encode them
(on the writer's thread), the file's size, and the time to read and restore it at start, beside the time the
table took to build. Usage: python -P scripts/bench_branch_snapshot.py [B:P ...]   (default 1000:500 4000:1000)
"""

from __future__ import annotations

import gc
import random
import sys
import time

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import BranchId, NodeId, Phase
from evolving_infra.router.branch_snapshot import decode, encode, restore, take
from evolving_infra.router.branches import BranchTable

PHASES = {NodeId("p0"): Phase.PREFILL, NodeId("d0"): Phase.DECODE}


def one(branches: int, pages: int) -> str:
    rng = random.Random(0)
    table = BranchTable(dict(PHASES))
    start = time.perf_counter()
    for b in range(branches):
        branch = BranchId(f"b{b}")
        table.request(branch, [PageHash(rng.getrandbits(64)) for _ in range(pages)])
        table.place(branch, NodeId("p0"))
        table.place(branch, NodeId("d0"))
    built = time.perf_counter() - start
    gc.collect()
    t0 = time.perf_counter()
    snapshot = take(table)
    t1 = time.perf_counter()
    data = encode(snapshot)
    t2 = time.perf_counter()
    back = BranchTable({n: Phase.PREFILL for n in PHASES})
    restore(back, decode(data))
    t3 = time.perf_counter()
    return (
        f"{branches} branches x {pages} pages: built {built:.1f} s; take {1e3 * (t1 - t0):.1f} ms on the loop; "
        f"encode {1e3 * (t2 - t1):.0f} ms on the writer thread; {len(data) / 1e6:.1f} MB; read + restore {t3 - t2:.1f} s"
    )


if __name__ == "__main__":
    for arg in sys.argv[1:] or ["1000:500", "4000:1000"]:
        b, p = (int(x) for x in arg.split(":"))
        print(one(b, p), flush=True)
