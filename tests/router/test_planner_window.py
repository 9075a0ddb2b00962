"""Window slices carry counts and sums; merging equals recording over the union; q̄ integrates occupancy."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.itermodel import DecodeCoefficients, PrefillCoefficients
from evolving_infra.core.types import Work
from evolving_infra.router.planner import (
    CoefficientNodeModel,
    MeanWork,
    SliceRecorder,
    SliceStats,
    WindowConfig,
    merge_slices,
)

works = st.builds(
    Work,
    t_uc=st.integers(0, 50_000),
    t_c=st.integers(0, 200_000),
    t_out=st.integers(0, 5_000),
    t_acc=st.floats(1.0, 4.0),
)
# (kind, time offset, payload): a request or a new decode occupancy, at increasing times in [0, 240).
events = st.lists(
    st.tuples(st.booleans(), st.floats(0.0, 239.999), works, st.integers(0, 500)),
    max_size=40,
).map(lambda evs: sorted(evs, key=lambda e: e[1]))


def _replay(recorder: SliceRecorder, evs: list[tuple[bool, float, Work, int]], until: float) -> None:
    for is_request, t, work, count in evs:
        if is_request:
            recorder.record_request(work, t)
            prompt = work.t_uc + work.t_c
            recorder.correct_prefill(prompt, work.t_c, count % (prompt + 1), t)  # the prefill started at once
        else:
            recorder.record_decode_occupancy(count, t)
            recorder.record_prefill_backlog(count // 3, t)
    recorder.advance(until)


def test_window_config_divides_the_window() -> None:
    assert WindowConfig().slice_s == 60.0
    assert WindowConfig(window_s=600, slices=10).slices == 10
    with pytest.raises(ValueError, match="slices must be >= 1"):
        WindowConfig(slices=0)


def test_requests_land_in_their_slice_and_sums_are_exact() -> None:
    rec = SliceRecorder(origin=100.0, slice_s=60.0, keep=10)
    rec.record_request(Work(t_uc=10, t_c=5, t_out=7, t_acc=2.0), 100.0)
    rec.record_request(Work(t_uc=20, t_c=0, t_out=3, t_acc=1.0), 159.9)
    rec.record_request(Work(t_uc=1, t_c=1, t_out=1, t_acc=1.0), 160.0)
    first, second = rec.completed(220.0)
    assert (first.start, first.end, second.start) == (100.0, 160.0, 160.0)
    assert first.requests == 2 and second.requests == 1
    assert first.sum_t_uc == 30 and first.sum_t_c == 5 and first.sum_t_out == 10
    assert first.sum_query_key_pairs == (10 * 5 + 10 * 11 // 2) + (20 * 21 // 2)
    assert first.sum_decode_iterations == pytest.approx(7 / 2 + 3)


def test_decode_occupancy_is_integrated_piecewise_constant_across_slices() -> None:
    rec = SliceRecorder(origin=0.0, slice_s=60.0, keep=10)
    rec.record_decode_occupancy(10, 30.0)
    rec.record_decode_occupancy(0, 90.0)
    rec.record_decode_occupancy(4, 150.0)
    s0, s1, s2 = rec.completed(180.0)
    # [0, 30) unobserved; 10 requests over [30, 60).
    assert s0.decode_request_seconds == pytest.approx(300.0) and s0.decode_observed_s == pytest.approx(30.0)
    assert s0.mean_decode_requests == pytest.approx(10.0)
    assert s1.mean_decode_requests == pytest.approx(5.0)  # 10 for 30 s, 0 for 30 s
    assert s2.mean_decode_requests == pytest.approx(2.0)  # 0 for 30 s, 4 for 30 s


def test_prefill_backlog_is_integrated_over_the_decode_occupancys_observed_time() -> None:
    rec = SliceRecorder(origin=0.0, slice_s=60.0, keep=10)
    rec.record_prefill_backlog(7, 10.0)  # before any occupancy: the slice's time is not observed yet
    rec.record_decode_occupancy(10, 30.0)
    rec.record_prefill_backlog(20, 90.0)
    s0, s1 = rec.completed(120.0)
    assert s0.mean_prefill_backlog == pytest.approx(7.0) and s0.mean_decode_requests == pytest.approx(10.0)
    assert s1.mean_prefill_backlog == pytest.approx(13.5)  # 7 for 30 s, 20 for 30 s
    assert SliceRecorder(origin=0.0).completed(60.0)[0].mean_prefill_backlog is None
    with pytest.raises(ValueError, match="backlog"):
        rec.record_prefill_backlog(-1, 130.0)


def test_empty_slice_has_no_mean_work_and_unobserved_slice_no_q_bar() -> None:
    rec = SliceRecorder(origin=0.0, slice_s=60.0)
    (only,) = rec.completed(60.0)
    assert only.mean_work is None and only.mean_decode_requests is None


def test_recorder_keeps_only_the_last_slices() -> None:
    rec = SliceRecorder(origin=0.0, slice_s=60.0, keep=10)
    got = rec.completed(60.0 * 25 + 1)
    assert len(got) == 10 and got[0].start == 60.0 * 15 and got[-1].end == 60.0 * 25


def test_time_going_backwards_is_rejected() -> None:
    rec = SliceRecorder(origin=0.0)
    rec.record_request(Work(1, 0, 1), 50.0)
    with pytest.raises(ValueError, match="time went backwards"):
        rec.record_request(Work(1, 0, 1), 49.0)


def test_negative_occupancy_is_rejected() -> None:
    with pytest.raises(ValueError, match="decode occupancy must be >= 0"):
        SliceRecorder(origin=0.0).record_decode_occupancy(-1, 1.0)


def test_overlapping_slices_do_not_merge() -> None:
    with pytest.raises(ValueError, match="overlapping"):
        SliceStats(0.0, 60.0).merge(SliceStats(30.0, 90.0))


@given(events)
def test_merge_of_two_slices_equals_one_slice_over_the_union(evs: list[tuple[bool, float, Work, int]]) -> None:
    coarse = SliceRecorder(origin=0.0, slice_s=240.0, keep=1)
    fine = SliceRecorder(origin=0.0, slice_s=60.0, keep=4)
    _replay(coarse, evs, 240.0)
    _replay(fine, evs, 240.0)
    (whole,) = coarse.completed(240.0)
    parts = fine.completed(240.0)
    merged = merge_slices(reversed(parts))  # order of the parts does not matter
    # Counts and token sums are integers and carried exactly.
    for name in ("start", "end", "requests", "sum_t_uc", "sum_t_c", "sum_query_key_pairs", "sum_t_out", "measured",
                 "correction_t_uc", "correction_t_c", "correction_query_key_pairs"):
        assert getattr(merged, name) == getattr(whole, name), name
    for name in ("sum_decode_iterations", "decode_request_seconds", "decode_observed_s", "backlog_request_seconds"):
        assert math.isclose(getattr(merged, name), getattr(whole, name), rel_tol=1e-9, abs_tol=1e-6), name
    assert merged.requests == sum(1 for e in evs if e[0])


@given(st.lists(works, min_size=1, max_size=30))
def test_mean_service_time_is_exact_from_the_sums(batch: list[Work]) -> None:
    """Eq. 3 on MeanWork equals the mean of eq. 3 over the requests (it is linear in t_uc, A, t_c)."""
    model = CoefficientNodeModel(
        PrefillCoefficients(0.02, 5e-5, 1e-10, 1e-6), DecodeCoefficients(0.015, 0.02, 2e-4, 8, 256), 8192.0, 0.3
    )
    rec = SliceRecorder(origin=0.0, slice_s=60.0)
    for w in batch:
        rec.record_request(w, 1.0)
    (s,) = rec.completed(60.0)
    assert s.mean_work is not None
    expected = sum(model.prefill_request_time(w) for w in batch) / len(batch)
    assert model.prefill_request_time(s.mean_work) == pytest.approx(expected, rel=1e-9, abs=1e-12)
    iters = sum(MeanWork.of(w).decode_iterations for w in batch) / len(batch)
    assert s.mean_work.decode_iterations == pytest.approx(iters, rel=1e-9, abs=1e-12)


# (prompt tokens, cached tokens counted at arrival, cached tokens its prefill node reused)
started = st.integers(1, 60_000).flatmap(
    lambda prompt: st.tuples(st.just(prompt), st.integers(0, prompt), st.integers(0, prompt))
)


@given(st.lists(started, min_size=1, max_size=30), st.integers(0, 2))
def test_prefill_starts_correct_the_arrivals_work_to_what_the_nodes_reused(
    batch: list[tuple[int, int, int]], slices_later: int
) -> None:
    """Requests recorded at arrival with the router's cached tokens, then corrected when their prefills start
    (in the same or a later slice): over the slices, eq. 3 on the corrected means is the mean of eq. 3 over the work
    the prefill nodes did."""
    model = CoefficientNodeModel(
        PrefillCoefficients(0.02, 5e-5, 1e-10, 1e-6), DecodeCoefficients(0.015, 0.02, 2e-4, 8, 256), 8192.0, 0.3
    )
    rec = SliceRecorder(origin=0.0, slice_s=60.0, keep=4)
    for prompt, counted, _ in batch:
        rec.record_request(Work(t_uc=prompt - counted, t_c=counted, t_out=5, t_acc=1.0), 1.0)
    for prompt, counted, cached in batch:
        rec.correct_prefill(prompt, counted, cached, 1.0 + 60.0 * slices_later)
    merged = merge_slices(rec.completed(240.0))
    assert merged.measured == len(batch)
    assert merged.mean_work is not None
    done = [Work(t_uc=prompt - cached, t_c=cached, t_out=5, t_acc=1.0) for prompt, _, cached in batch]
    expected = sum(model.prefill_request_time(w) for w in done) / len(done)
    assert model.prefill_request_time(merged.mean_work) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_a_corrected_slice_never_has_negative_mean_work() -> None:
    """Corrections of prefills that arrived in earlier slices may exceed a slice's own sums: the means stay >= 0."""
    rec = SliceRecorder(origin=0.0, slice_s=60.0)
    rec.record_request(Work(t_uc=10, t_c=0, t_out=1, t_acc=1.0), 61.0)  # a light arrival in the second slice
    rec.correct_prefill(50_000, 0, 50_000, 62.0)  # an earlier arrival found all 50,000 tokens cached after all
    (_, second) = rec.completed(120.0)
    assert second.correction_t_uc == -50_000 and second.mean_work is not None
    assert second.mean_work.t_uc == 0.0 and second.mean_work.query_key_pairs == 0.0
    assert second.mean_work.t_c == 50_000.0
    with pytest.raises(ValueError, match="cached tokens must lie in"):
        rec.correct_prefill(100, 101, 0, 130.0)
