"""`--out` plots: each PNG is written, is a real image, and reflects the run (split changes, latencies)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image as mpimg

from evolving_infra.sim.plots import write_plots
from evolving_infra.sim.records import RequestRecord, SplitRecord


def _record(i: int, issued: float, ttft: float, cached: int) -> RequestRecord:
    return RequestRecord(
        request_id=f"r{i}", agent="a", workload="cc", branch="b", issued=issued, prefill_node="n0",
        decode_node="n1", queued=issued, prefill_start=issued, first_token=issued + ttft,
        finish=issued + ttft + 1.0, prompt_tokens=1000, cached_tokens=cached, fetched_tokens=0, output_tokens=10,
    )  # fmt: skip


def test_write_plots_makes_three_pngs(tmp_path: Path) -> None:
    records = [_record(i, 30.0 * i, 0.1 * (i + 1), 500 + 10 * i) for i in range(20)]
    splits = [SplitRecord(0.0, 2, 2), SplitRecord(300.0, 3, 1)]
    ideal = {r.request_id: 900 for r in records}
    paths = write_plots(records, splits, ideal, (60.0, 600.0), 4, tmp_path)
    assert set(paths) == {"split plot", "latency plot", "KV plot"}
    for path in paths.values():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        image = mpimg.imread(path)
        assert image.shape[0] > 100 and image.shape[1] > 100
        # not a blank canvas: some pixels differ from the background
        assert (image[..., :3] < 0.9).any()
