"""`TraceRecorder`: served requests become a valid trace with the structure their token ids imply (appends,
retries, page-granular rewrites, forks, shared prefixes across agents, sub-agent waits, branch ends), and the
trace holds no token ids."""

from __future__ import annotations

import json
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.router.recording import TraceRecorder
from evolving_infra.traces.loader import trace_from_records
from evolving_infra.traces.records import Relation

P = 4
SYSTEM = list(range(1000, 1012))  # 12 tokens = 3 pages


def _serve(rec: TraceRecorder, rid: str, branch: str, parent: str | None, prompt: list[int], output: list[int],
           start: float, end: float) -> None:  # fmt: skip
    rec.begin(rid, branch, parent, prompt, start)
    rec.end(rid, output, end, first_token_s=start + 0.5, cached_tokens=3)


def test_one_agent_with_a_sub_agent_a_retry_and_a_compaction() -> None:
    rec = TraceRecorder(P, time_scale=2.0)
    p1 = [*SYSTEM, 1, 2, 3]
    _serve(rec, "x1", "main", None, p1, [7, 8, 9], 10.0, 11.0)
    p2 = [*p1, 7, 8, 9, 4, 4]  # exactly the previous context, then the tool result: an append
    _serve(rec, "x2", "main", None, p2, [5], 12.0, 13.0)
    # A sub-agent branch: starts from the system prompt (3 shared pages of the parent's context) -> a fork
    # of the parent's latest request keeping 3 pages.
    _serve(rec, "x3", "sub", "main", [*SYSTEM, 9, 9, 9, 9, 9], [6, 6], 13.5, 14.0)
    rec.finish_branch("sub")
    p4 = [*p2, 5, 3, 3]  # the parent's next request, after the sub-agent ended: waits for it
    _serve(rec, "x4", "main", None, p4, [2], 15.0, 16.0)
    _serve(rec, "x5", "main", None, list(p4), [1, 1], 17.0, 18.0)  # same prompt again (a retry): keeps it
    p6 = [*SYSTEM, 42, 42, 42, 42, 42]  # compaction: keeps the system pages only
    _serve(rec, "x6", "main", None, p6, [3], 19.0, 19.5)
    records = rec.records()
    trace = trace_from_records(records)
    r = {req.id: req for req in trace.requests}
    assert [req.relation for req in trace.requests] == [
        Relation.ROOT, Relation.APPEND, Relation.FORK, Relation.APPEND, Relation.REWRITE, Relation.REWRITE]  # fmt: skip
    assert (r["r2"].base, r["r2"].keep, r["r2"].new) == ("r1", 18, 2)
    assert (r["r3"].base, r["r3"].keep, r["r3"].new, r["r3"].branch) == ("r2", 12, 5, "b1")
    assert r["r4"].after == ("r2", "r3") and r["r4"].delay_s == (15.0 - 14.0) * 2
    assert (r["r5"].base, r["r5"].keep, r["r5"].new) == ("r4", len(p4), 0)
    assert (r["r6"].base, r["r6"].keep, r["r6"].new) == ("r5", 12, 5)
    assert trace.agents["a0"].start_s == 0.0 and r["r2"].delay_s == (12.0 - 11.0) * 2
    assert [(e.branch, e.after) for e in trace.branch_ends] == [("b1", "r3")]
    req2 = next(x for x in records if x.get("id") == "r2")
    assert req2["recorded_ttft_s"] == 1.0 and req2["recorded_e2e_s"] == 2.0 and req2["recorded_cached_tokens"] == 3
    assert rec.report.appends == 2 and rec.report.retries == 1 and rec.report.forks == 1


def test_agents_share_a_recorded_prefix_and_the_first_producer_uses_it() -> None:
    rec = TraceRecorder(P)
    _serve(rec, "x1", "a", None, [*SYSTEM, 1, 2], [3], 0.0, 1.0)
    _serve(rec, "x2", "b", None, [*SYSTEM, 5, 6, 7, 8, 9], [3], 2.0, 3.0)
    _serve(rec, "x3", "c", None, [77, 78, 79, 80, 81], [3], 2.5, 3.5)  # nothing shared: fresh
    trace = trace_from_records(rec.records())
    assert list(trace.prefixes.values())[0].tokens == 12
    name = next(iter(trace.prefixes))
    assert [(q.shared, q.keep, q.new) for q in trace.requests] == [(name, 12, 2), (name, 12, 5), (None, 0, 5)]
    assert len(trace.agents) == 3


def test_failed_requests_are_dropped_and_a_finish_waits_for_the_request_in_flight() -> None:
    rec = TraceRecorder(P)
    rec.begin("x1", "a", None, [1, 2, 3, 4, 5], 0.0)
    rec.end("x1", [], 1.0)  # no output: dropped
    rec.begin("x2", "a", None, [1, 2, 3, 4, 5], 2.0)
    rec.finish_branch("a")  # while x2 is in flight
    rec.begin("x3", "a", None, [9, 9], 2.5)  # the finished id is reused: a new branch
    rec.end("x2", [6], 3.0)
    rec.end("x3", [1], 3.5)
    trace = trace_from_records(rec.records())
    assert rec.report.dropped == 1 and len(trace.requests) == 2
    assert [(e.branch, e.after) for e in trace.branch_ends] == [("b0", "r2")]
    assert trace.request("r3").branch == "b1"


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10_000), page=st.sampled_from([1, 3, 8]))
def test_random_traffic_records_a_valid_trace_without_token_ids(seed: int, page: int) -> None:
    rng = random.Random(seed)
    rec = TraceRecorder(page)
    contexts: dict[str, list[int]] = {}
    now = 0.0
    secret = 987_654_321
    for i in range(rng.randint(1, 25)):
        branch = f"br{rng.randint(0, 4)}"
        parent = f"br{rng.randint(0, 4)}" if rng.random() < 0.3 else None
        base = contexts.get(branch, [])
        choice = rng.random()
        if choice < 0.5:
            prompt = base + [secret + rng.randint(0, 3) for _ in range(rng.randint(1, 6))]
        elif choice < 0.7:
            prompt = base[: rng.randint(0, len(base))] + [secret] * rng.randint(1, 3)
        else:
            prompt = [secret + 7] * rng.randint(1, 9)
        output = [secret + 9] * rng.randint(0, 4)
        now += rng.random()
        rec.begin(f"x{i}", branch, parent, prompt, now)
        if rng.random() < 0.2:
            rec.finish_branch(branch)
        now += rng.random()
        rec.end(f"x{i}", output, now)
        if output:
            contexts[branch] = prompt + output
        if rng.random() < 0.2:
            rec.finish_branch(branch)
    records = rec.records()
    trace = trace_from_records(records)  # valid
    assert len(trace.requests) == rec.report.requests
    text = json.dumps(records)
    assert str(secret) not in text and str(secret + 7) not in text
