"""Dynamo mocker's timing tables fitted to our profile: decode exactly eq. 2 / t_acc, prefill equal in total over
the trace's chunks (the documented fit), chunks of a trace as the engine would compute them."""

from __future__ import annotations

import numpy as np
import pytest

from evolving_infra.core.itermodel import PrefillItem, decode_iteration_time, prefill_iteration_time
from evolving_infra.node_agent.profiles import load_profile
from evolving_infra.peers.dynamo_timing import fit_timing, mean_context, prefill_table, trace_chunks
from evolving_infra.peers.dynamo_replay import DynamoSetup
from evolving_infra.traces.loader import trace_from_records
from evolving_infra.workloads import generate

PROFILE = load_profile("glm-5.2-4xgb300-tp4")


@pytest.fixture(scope="module")
def trace():  # type: ignore[no-untyped-def]
    return trace_from_records(generate("cc", 2, 0))


def test_chunks_by_hand() -> None:
    records = [
        {"kind": "agent", "agent": "a", "workload": "cc", "start_s": 0},
        {"kind": "request", "id": "r0", "agent": "a", "branch": "m", "after": [], "delay_s": 0,
         "input": {"new": 20000}, "output_tokens": 5},
        {"kind": "request", "id": "r1", "agent": "a", "branch": "m", "after": ["r0"], "delay_s": 0,
         "input": {"base": "r0", "keep": 20005, "new": 100}, "output_tokens": 5},
    ]  # fmt: skip
    items = trace_chunks(trace_from_records(records), page_tokens=64, chunk_tokens=8192)
    cached = 20005 // 64 * 64
    assert items == [
        PrefillItem(8192, 0), PrefillItem(8192, 8192), PrefillItem(3616, 16384),
        PrefillItem(20105 - cached, cached),
    ]  # fmt: skip
    assert mean_context(items) == pytest.approx(sum(i.t_uc * i.t_c for i in items) / sum(i.t_uc for i in items))
    with pytest.raises(ValueError, match="chunk_tokens"):
        trace_chunks(trace_from_records(records), 64, 0)


def test_fit_keeps_total_prefill_time(trace) -> None:  # type: ignore[no-untyped-def]
    fit = fit_timing(PROFILE, trace)
    assert abs(fit.total_prefill_error) < 1e-3
    assert fit.chunks > 0 and 0 <= fit.chunk_error_mean <= fit.chunk_error_p95
    items = trace_chunks(trace, PROFILE.page_tokens, PROFILE.chunk_tokens)
    coef = PROFILE.prefill.coefficients()
    # a chunk with exactly the mean context costs the same in both models
    item = PrefillItem(4096, round(fit.context_tokens))
    arrays = fit.arrays()
    f = np.interp(4096, arrays["prefill_isl"], arrays["prefill_ttft_ms"]) / 1000
    assert f == pytest.approx(prefill_iteration_time(coef, [item]), rel=1e-3)
    assert len(items) == fit.chunks


def test_prefill_table_monotone_and_decode_is_eq2() -> None:
    n, ms = prefill_table(PROFILE, 50_000.0, 32768)
    assert n[0] == 0 and n[-1] == 32768 and np.all(np.diff(ms) > 0)
    assert ms[0] == pytest.approx(PROFILE.prefill.c0 * 1000)
    fit = fit_timing(PROFILE, trace_from_records(generate("putnam", 1, 0)))
    a = fit.arrays()
    kv, ctx, itl = a["decode_active_kv_tokens"], a["decode_context_length"], a["decode_itl"]
    assert itl.shape == (len(kv), len(ctx))
    coef = PROFILE.decode.coefficients()
    for i in (0, 10, len(kv) - 1):
        for j in (0, 7, len(ctx) - 1):
            batch = max(1.0, kv[i] / ctx[j])
            expected = 1000 * decode_iteration_time(coef, batch) / PROFILE.decode.t_acc
            assert itl[i, j] == pytest.approx(expected)
    assert fit.describe()["profile"] == PROFILE.name and "tables" not in fit.describe()


def test_setup_mirrors_profile() -> None:
    setup = DynamoSetup.for_profile(PROFILE, 4, 5)
    e = setup.engine
    assert (setup.prefill_workers, setup.decode_workers, setup.block_tokens) == (4, 5, 64)
    assert e["num_gpu_blocks"] * e["block_size"] <= PROFILE.l1_tokens
    assert e["max_num_batched_tokens"] == PROFILE.chunk_tokens
    assert e["native_host_offload"]["num_host_blocks"] == PROFILE.l2_pages
    assert "native_host_offload" not in DynamoSetup.for_profile(PROFILE, 4, 5, host_offload=False).engine
