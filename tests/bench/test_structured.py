"""``bench.structured``'s pure parts on made-up runs: the request plan, the step probe, the figures and the report
table. The benchmark itself runs in ``make bench``, not here (no timing is asserted)."""

import itertools
from types import SimpleNamespace

import pytest

from bench import report as bench_report
from bench import structured_summary as summary
from bench.structured import plan_requests, summarize
from bench.structured_engine import StepProbe
from engine.structured.decoding import StructuredDecoding
from tests.structured.schema_suite import validate

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 5}}, "required": ["n"],
          "additionalProperties": False}


def test_plan_cycles_through_the_suite_and_oversubscribes_unnamed_batches():
    plan = plan_requests([1, 8, 4], {1: 3, 8: 10}, num_schemas=4)
    assert plan[1] == [0, 1, 2]
    assert plan[8] == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert plan[4] == [0, 1, 2, 3, 0, 1, 2, 3]  # twice the batch: finished requests get replaced


def test_percentile_interpolates_between_ranks():
    assert summary.percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert summary.percentile([0.0, 10.0], 99) == pytest.approx(9.9)
    assert summary.percentile([], 50) is None
    assert summary.compile_summary([1.0, 2.0, 3.0], {4: "refused"}) == {
        "p50_ms": 2.0, "p99_ms": pytest.approx(2.98), "max_ms": 3.0, "compiles": 3, "refused": 1}


class FakeMatcher:
    def accept_token(self, token_id):
        return True

    def is_terminated(self):
        return False


class FakeEngine:
    """What StepProbe wraps: ``step`` -> ``scheduler.schedule`` -> ``model_runner.forward`` -> ``structured.mask``
    (-> the backend's fill) -> ``StructuredDecoding.advance``, as LLMEngine.step runs them."""

    def __init__(self, num_seqs):
        backend = SimpleNamespace(fill_bitmask_batch=lambda bitmask, pairs: None)
        self.structured = SimpleNamespace(backend=backend)
        self.structured.mask = lambda logits, matchers: self.structured.backend.fill_bitmask_batch(None, [])
        self.scheduler = SimpleNamespace(schedule=lambda: SimpleNamespace(seqs=[object()] * num_seqs,
                                                                          num_batched_tokens=num_seqs + 3))
        self.model_runner = SimpleNamespace(forward=lambda input_ids, batch: "logits")

    def step(self):
        out = self.scheduler.schedule()
        if out.seqs:
            assert self.model_runner.forward(None, None) == "logits"
            self.structured.mask(None, [FakeMatcher()])
            StructuredDecoding.advance(FakeMatcher(), 7)
        return ["output"]


def test_step_probe_times_each_phase_and_puts_the_engine_back(monkeypatch):
    ticks = itertools.count()
    monkeypatch.setattr("bench.structured_engine.time.perf_counter", lambda: float(next(ticks)))
    engine, advance = FakeEngine(num_seqs=2), StructuredDecoding.__dict__["advance"]
    originals = (engine.structured.mask, engine.structured.backend.fill_bitmask_batch, engine.scheduler.schedule,
                 engine.model_runner.forward)
    with StepProbe(engine) as probe:
        assert engine.step() == ["output"]
    # ticks: step 0, forward 1-2, mask 3, fill 4-5, mask end 6, advance 7-8, step end 9
    [step] = probe.steps
    assert (step.seconds, step.num_seqs, step.num_tokens) == (9.0, 2, 5)  # 3 prompt tokens rode in the step
    assert (step.forward_s, step.fill_s, step.mask_s, step.advance_s) == (1.0, 1.0, 3.0, 1.0)
    assert "step" not in engine.__dict__ and StructuredDecoding.__dict__["advance"] is advance
    assert (engine.structured.mask, engine.structured.backend.fill_bitmask_batch,
            engine.scheduler.schedule, engine.model_runner.forward) == originals


def test_step_probe_skips_empty_schedules():
    engine = FakeEngine(num_seqs=0)
    with StepProbe(engine) as probe:
        engine.step()
    assert probe.steps == []


def run(texts, reasons=None, wall=1.0, steps=None):
    """A run; with ``steps`` one of this engine's (its CPU time half its wall time)."""
    out = {"wall_s": wall, "output_tokens": 10 * len(texts), "lengths": [10] * len(texts), "texts": texts,
           "finish_reasons": reasons or ["stop"] * len(texts)}
    return out if steps is None else {**out, "steps": steps, "cpu_s": wall / 2}


def step(seconds, seqs, mask=0.0, fill=0.0, advance=0.0, tokens=None, forward=None):
    out = {"s": seconds, "seqs": seqs, "tokens": seqs if tokens is None else tokens, "mask_s": mask,
           "fill_s": fill, "advance_s": advance}
    return out if forward is None else {**out, "forward_s": forward}


def test_validity_counts_unparsable_invalid_and_cut_outputs():
    record = {"indices": [0, 0, 0, 0], "constrained": [run(['{"n":3}', '{"n":9}', '{"n":', '{"n":1}'],
                                                            ["stop", "stop", "length", "stop"])]}
    v = summary.validity(record, [SCHEMA], validate)
    assert (v["outputs"], v["valid"], v["cut_by_max_tokens"]) == (4, 2, 1)
    assert v["share_valid"] == 0.5
    assert any("ValidationError" in e for e in v["errors"]) and any("JSONDecodeError" in e for e in v["errors"])


def test_step_overhead_uses_full_batch_steps_and_reports_shares():
    constrained = [step(0.5, 2, tokens=40), step(0.11, 2, mask=0.011, fill=0.004, advance=0.001),
                   step(0.11, 2, mask=0.011, fill=0.004, advance=0.001), step(0.05, 1, mask=0.02)]
    free = [step(0.5, 2, tokens=40), step(0.10, 2), step(0.10, 2), step(0.04, 1)]
    record = {"indices": [0, 0, 0], "constrained": [run(["{}"] * 3, steps=constrained)],
              "free": [run(["x"] * 3, steps=free)]}
    out = summary.step_overhead(record, batch=2)
    assert out["same_schedule"] and out["full_batch_steps"] == 3
    assert out["constrained_step_ms"] == pytest.approx(240.0) and out["free_step_ms"] == pytest.approx(700 / 3)
    assert out["overhead"] == pytest.approx(0.72 / 0.70 - 1)
    assert out["mask_share"] == pytest.approx(0.022 / 0.72)
    assert out["fill_share"] + out["apply_share"] == pytest.approx(out["mask_share"])
    assert out["advance_share"] == pytest.approx(0.002 / 0.72)
    free[1]["tokens"] = 9
    assert not summary.step_overhead(record, batch=2)["same_schedule"]


def fake_report(engine_overhead_steps: float, vllm_ok: bool = True) -> dict:
    texts = ['{"n":1}', '{"n":2}']

    def batches(with_steps: bool, wall_c: float, wall_f: float) -> dict:
        c_steps = [step(engine_overhead_steps, 64, mask=0.01, fill=0.004)] if with_steps else None
        f_steps = [step(0.1, 64)] if with_steps else None
        return {"64": {"indices": [0, 0], "constrained": [run(texts, wall=wall_c, steps=c_steps)],
                       "free": [run(texts, wall=wall_f, steps=f_steps)]}}

    runs = {"engine-guidance": {"ok": True, "batches": batches(True, 1.0, 0.9)}}
    runs["vllm-guidance"] = {"ok": True, "batches": batches(False, 2.0, 1.5)} if vllm_ok else \
        {"ok": False, "reason": "timed out after 900 s", "error": "..."}
    report = {"backends": ["guidance"], "runs": runs, "quick": True, "dtype": "bfloat16", "suite": ["a"] * 30,
              "settings": {"max_tokens": 128}, "machine": {"cores": 2, "cpu": "a CPU", "load_avg_start": [1.0]},
              "compile": {"guidance": {"samples_ms": [1.0, 2.0, 3.0], "errors": {}}}}
    report["summary"] = summarize(report, [SCHEMA], validate)
    return report


def test_summary_ratios_and_target():
    report = fake_report(engine_overhead_steps=0.105)
    s = report["summary"]
    [row] = s["systems"]["engine-guidance"]
    assert row["steps"]["overhead"] == pytest.approx(0.05) and row["validity"]["valid"] == 2
    assert row["constrained"]["tok_s"] == 20.0 and row["wall_overhead"] == pytest.approx(1 / 0.9 - 1)
    assert row["cpu_overhead"] == pytest.approx(1 / 0.9 - 1)
    assert "steps" not in s["systems"]["vllm-guidance"][0]  # vLLM's steps and CPU time are not measured
    assert "cpu_overhead" not in s["systems"]["vllm-guidance"][0]
    assert s["ratios"]["guidance"] == [{"batch": 64, "constrained": 2.0, "free": pytest.approx(1.5 / 0.9)}]
    assert s["target_met"]["guidance"] is True
    assert fake_report(engine_overhead_steps=0.12)["summary"]["target_met"]["guidance"] is False


def test_report_has_a_structured_table_and_lists_a_failed_peer():
    report = fake_report(engine_overhead_steps=0.105, vllm_ok=False)
    lines = "\n".join(bench_report.structured_table((bench_report.RESULTS / "structured-x.json", report)))
    assert "## Structured outputs" in lines
    assert "| guidance | 64 | 100.0 -> 105.0 ms | +5.0% (target <= 10%: met) | n/a | 10.0 ms, 9.5% (3.8% + 5.7%) | " \
        "+11% / +11% | 20.0 / 22.2 | not run | n/a | 2/2 |" in lines
    assert "vllm-guidance: FAILED: timed out after 900 s" in lines
    assert "guidance p50 2.0 ms" in lines
    [row] = bench_report.structured_rows(report)
    assert row[0] == "Constrained step at batch 64 (guidance)" and row[3] == "+5.0%"
    assert "## Structured outputs" in bench_report.structured_table(None)[1]


def test_overhead_outside_the_forward_pass_is_what_the_target_reads():
    """The forward pass ran 10 ms faster in the constrained run (its time drifts between runs of the same shapes):
    the whole steps hide the 6 ms constrained decoding added outside it, which the target reads."""
    constrained = [step(0.096, 2, mask=0.005, forward=0.080), step(0.096, 2, mask=0.005, forward=0.080)]
    free = [step(0.100, 2, forward=0.090), step(0.100, 2, forward=0.090)]
    record = {"indices": [0, 0], "constrained": [run(["{}"] * 2, steps=constrained)],
              "free": [run(["x"] * 2, steps=free)]}
    out = summary.step_overhead(record, batch=2)
    assert out["overhead"] == pytest.approx(-0.04)
    assert out["forward_ratio"] == pytest.approx(80 / 90 - 1)
    assert (out["constrained_outside_forward_ms"], out["free_outside_forward_ms"]) == pytest.approx((16.0, 10.0))
    assert out["overhead_outside_forward"] == pytest.approx(0.06)
    assert out["forward_ms_by_run"] == {"constrained": [pytest.approx(80.0)], "free": [pytest.approx(90.0)]}
    assert summary.target_overhead(out) == pytest.approx(0.06)
    rows = [{"batch": 64, "steps": {**out, "overhead_outside_forward": 0.11}}]
    assert summary.target_met(rows) is False  # whole steps at -4% do not pass a cost of 11% outside the forward
    assert summary.target_met([{"batch": 64, "steps": out}]) is True


def test_report_reads_the_target_outside_the_forward_when_it_was_timed():
    report = fake_report(engine_overhead_steps=0.105)
    record = report["runs"]["engine-guidance"]["batches"]["64"]
    record["constrained"][0]["steps"] = [step(0.105, 64, mask=0.01, fill=0.004, forward=0.090)]
    record["free"][0]["steps"] = [step(0.100, 64, forward=0.092)]
    report["summary"] = summarize(report, [SCHEMA], validate)
    lines = "\n".join(bench_report.structured_table((bench_report.RESULTS / "structured-x.json", report)))
    assert "| guidance | 64 | 100.0 -> 105.0 ms | +5.0% (-2.2%) | 8.0 -> 15.0 ms, +7.0% (target <= 10%: met) |" in lines
    [row] = bench_report.structured_rows(report)
    assert row[0] == "Constrained decoding's cost a step at batch 64 (guidance)" and row[3] == "+7.0%"
    assert row[1] == "7.0 ms outside the forward pass"
