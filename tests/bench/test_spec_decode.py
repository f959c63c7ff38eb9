"""``bench.spec_decode``'s pure parts on made-up runs: the prompt sets and their slices, the counters' deltas, the
summary (speedups, crossover, saturation) and the report section. The benchmark itself runs in ``make bench``, not
here (no timing is asserted)."""

import pytest

from bench import spec_decode as bench
from bench import spec_decode_http as chat
from bench import spec_decode_report
from bench.edit_paragraphs import CASES, edit_cases


def test_paragraphs_are_sixteen_edits_of_60_to_120_words():
    assert len(CASES) == 16
    for case in CASES:
        assert 60 <= len(case.paragraph.split()) <= 120
        assert case.old in case.paragraph and case.new not in case.paragraph
        assert case.paragraph in case.prompt and f'"{case.old}" to "{case.new}"' in case.prompt
        assert case.old not in case.expected and case.new in case.expected
    assert len({c.paragraph for c in CASES}) == 16
    assert [c.prompt for c in edit_cases(3)] == [c.prompt for c in CASES[:3]]


@pytest.mark.parametrize("quick", [True, False])
def test_server_runs_use_disjoint_prompts_and_leave_the_warm_up_prompt_out(quick):
    s = bench.settings(quick)
    jobs = bench.all_jobs(s)
    runs = bench.server_runs(s, jobs)
    assert [(r["set"], r["streams"]) for r in runs] == [("json", 1), ("edit", 1), ("json", 4), ("edit", 4)]
    for name in ("json", "edit"):
        used = [id(j) for r in runs if r["set"] == name for j in r["jobs"]]
        assert len(used) == len(set(used)) == s[name][1] + s[name][4]
        assert id(jobs[name][-1]) not in used  # the warm-up's prompt
    assert all(j.max_tokens == s["max_tokens"][j.set] for r in runs for j in r["jobs"])
    assert [r["set"] for r in bench.server_runs(s, jobs, ("edit",))] == ["edit", "edit"]


def test_sweep_mixes_both_sets_and_oversubscribes_in_full_runs():
    jobs = bench.all_jobs(bench.settings(False))
    assert [j.set for j in bench.sweep_jobs(jobs, 2, quick=False)] == ["json", "edit", "json", "edit"]
    assert len(bench.sweep_jobs(jobs, 32, quick=False)) == 40  # every prompt, fewer than twice the seats
    assert len(bench.sweep_jobs(jobs, 1, quick=True)) == 2
    assert len(bench.sweep_jobs(jobs, 8, quick=True)) == 8


def test_request_body_names_the_adapter_as_each_server_expects():
    json_job, edit_job = chat.Job("json", [{"role": "user", "content": "x"}], 64), chat.Job("edit", [], 160)
    engine = chat.request_body(json_job, "engine")
    assert engine["model"] == engine["adapter"]["id"] == "demo-json-extractor"
    assert engine["adapter"]["uri"].endswith("demo/adapters/json-extractor")
    assert chat.request_body(json_job, "vllm")["model"] == "json-extractor"
    base = chat.request_body(edit_job, "vllm")
    assert base["model"] == "bench" and "adapter" not in base and base["temperature"] == 0
    assert "ignore_eos" not in base  # real answers, of their own length


def test_acceptance_is_the_runs_delta_of_the_counters():
    before = {"drafted": 10, "accepted": 4, "drafts": 3}
    after = {"drafted": 50, "accepted": 34, "drafts": 13}
    delta = chat.acceptance(before, after)
    assert (delta["drafted"], delta["accepted"], delta["drafts"]) == (40, 30, 10)
    assert delta["acceptance_rate"] == 0.75 and delta["mean_accepted_length"] == 3.0
    assert chat.acceptance(before, before)["acceptance_rate"] is None
    assert chat.acceptance(None, after) is None


def test_vllm_counters_are_summed_over_label_sets():
    metrics = "\n".join([
        "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="bench"} 40.0',
        'vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="bench"} 8.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="bench"} 30.0',
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="bench"} 12.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 11.0',
    ])
    assert chat.vllm_spec_counters(metrics) == {"drafted": 48.0, "accepted": 30.0, "drafts": 12.0}
    assert chat.vllm_spec_counters("vllm:num_requests_running 0.0") is None


def test_latency_summary_counts_only_replies_that_succeeded():
    replies = [chat.Reply(True, 11, 0.1, 1.1), chat.Reply(True, 21, 0.3, 2.3), chat.Reply(False, 0, 0, 0.5,
                                                                                           error="HTTP 500")]
    summary = chat.latency_summary(replies, duration=4.0)
    assert summary["requests_ok"] == 2 and summary["output_tokens"] == 32 and summary["tok_s"] == 8.0
    assert summary["tpot_ms"]["p50"] == pytest.approx(100.0)
    assert summary["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert summary["errors"] == ["HTTP 500"]


def test_crossover_is_where_speculation_stops_paying_for_good():
    assert bench.crossover({1: 2.9, 2: 2.0, 4: 1.4, 8: 1.1, 16: 0.9, 32: 0.8}) == 16
    assert bench.crossover({1: 2.0, 2: 0.95, 4: 1.2, 8: 0.9}) == 8  # a dip that recovers is not the crossover
    assert bench.crossover({1: 2.0, 32: 1.01}) is None
    assert bench.crossover({1: 0.9, 2: 0.8}) == 1


def test_identical_share_compares_runs_reply_by_reply():
    assert bench.identical_share(["a", "b", "c", "d"], ["a", "b", "x", "d"]) == 0.75
    assert bench.identical_share([], []) is None
    assert bench.strip_private({"a": [{"_token_ids": [1], "tok_s": 2}], 1: {"_x": 0}}) == {"a": [{"tok_s": 2}], 1: {}}


def _run(set_name: str, streams: int, tpot: float, drafted: int = 0, accepted: int = 0) -> dict:
    acceptance = chat.acceptance({"drafted": 0, "accepted": 0, "drafts": 0},
                                 {"drafted": drafted, "accepted": accepted, "drafts": 4}) if drafted else None
    return {"set": set_name, "streams": streams, "tpot_ms": {"p50": tpot}, "ttft_ms": {"p50": 50.0}, "tok_s": 10.0,
            "acceptance": acceptance, "texts": []}


def _made_up_report() -> dict:
    off = {"ok": True, "runs": [_run("json", 1, 60.0), _run("edit", 1, 60.0), _run("json", 4, 80.0),
                                _run("edit", 4, 80.0)]}
    ngram = {"ok": True, "runs": [_run("json", 1, 30.0, 20, 15), _run("edit", 1, 20.0, 20, 18),
                                  _run("json", 4, 50.0, 20, 10), _run("edit", 4, 40.0, 20, 12)]}
    for run in ngram["runs"]:
        run["identical_to_off"] = 1.0
    server = {"engine": {"off": off, "ngram": ngram},
              "vllm": {"off": {"ok": True, "runs": off["runs"][1::2]},
                       "ngram": {"ok": False, "reason": "ValueError: LoRA | speculative decoding"},
                       "ngram-no-lora": {"ok": True, "runs": [_run("edit", 1, 40.0, 8, 4), _run("edit", 4, 64.0)]}}}

    def rec(tok_s):
        return {"tok_s": tok_s, "acceptance": None}

    offline = {"sweep": [{"batch": b, "off": rec(10.0 * b), "ngram": rec(r * 10.0 * b)}
                         for b, r in ((1, 2.5), (8, 1.2), (16, 0.9), (32, 0.7))],
               "saturation": {"off": rec(200.0), "ngram": rec(198.0), "ngram-no-cut": rec(150.0)},
               "saturation_workload": {"requests": 32, "output_tokens": 64, "prompt_tokens": [16, 256]}}
    report = {"quick": True, "dtype": "bfloat16", "configs": {"off": None, "ngram": {"method": "ngram"}},
              "vllm_spec": {"method": "ngram"}, "machine": {"cores": 2, "cpu": "Test CPU", "load_avg_start": [3.0]},
              "server": server, "offline": offline}
    report["summary"] = bench.summarize(server, offline)
    return report


def test_saturation_rounds_combine_into_one_run_per_setting():
    def one(tokens, wall, before, after, ids):
        return {"requests": 2, "output_tokens": tokens, "wall_s": wall, "tok_s": tokens / wall,
                "counters": (before, after), "token_ids": ids}

    rounds = [one(100, 2.0, {"d": 0}, {"d": 5}, [[1, 2]]), one(100, 3.0, {"d": 5}, {"d": 9}, [[1, 2]])]
    run = bench._combined(rounds)
    assert (run["requests"], run["output_tokens"], run["wall_s"]) == (4, 200, 5.0)
    assert run["tok_s"] == 40.0 and run["round_tok_s"] == [50.0, pytest.approx(100 / 3)]
    assert run["counters"] == ({"d": 0}, {"d": 9}) and run["token_ids"] == [[1, 2]]


def test_summary_speedups_sweep_and_saturation_against_targets():
    summary = _made_up_report()["summary"]
    engine = {(r["set"], r["streams"]): r for r in summary["tpot_speedup"] if r["system"] == "engine"}
    assert engine["json", 1]["speedup"] == 2.0 and engine["json", 1]["met"]
    assert engine["edit", 4]["speedup"] == 2.0 and engine["json", 4]["speedup"] == 1.6 and engine["json", 4]["met"]
    vllm = [r for r in summary["tpot_speedup"] if r["system"] == "vllm"]
    assert [(r["config"], r["set"], r["streams"], r["speedup"]) for r in vllm] == [
        ("ngram-no-lora", "edit", 1, 1.5), ("ngram-no-lora", "edit", 4, 1.25)]
    assert summary["crossover"] == {"ngram": 16}
    assert summary["sweep_ratios"]["ngram"][1] == 2.5
    assert summary["saturation_ratio"]["ngram"] == {"ratio": 0.99, "target": 0.97, "met": True}
    assert not summary["saturation_ratio"]["ngram-no-cut"]["met"]


def test_report_rows_and_section_show_speedups_failures_and_crossover(tmp_path):
    report = _made_up_report()
    rows = spec_decode_report.rows(report)
    assert [r[0] for r in rows] == ["Speculative decoding: TPOT p50 off / on, 1 stream",
                                    "Speculative decoding: TPOT p50 off / on, 4 streams",
                                    "Speculation on at saturation (output tok/s)"]
    assert rows[0][1] == "ngram: json 2.00x, edit 3.00x" and rows[0][3] == "2.00x"
    assert rows[0][2] == "vLLM ngram-no-lora: edit 1.50x"
    assert rows[2][1:4] == ("ngram 198.0", "off: 200.0", "0.99")
    text = "\n".join(spec_decode_report.table((tmp_path / "spec_decode-20270101-000000.json", report)))
    assert "## Speculative decoding" in text and "(quick)" in text
    assert "| engine | ngram | json-extractor | 1 | 50 | 30 | 2.00x | 10.0 | 75% / 3.75 | 100% |" in text
    assert "vllm ngram: FAILED: ValueError: LoRA / speculative decoding" in text
    assert "ngram from batch 16" in text and "ngram-no-cut 150.0 (0.75)" in text
    assert spec_decode_report.table(None)[-1] == "`python -m bench.spec_decode`: not run."
