"""``bench/kernels.py`` cannot time anything without a GPU; its dry run checks the script end to end on CPU
(tiny fp32 shapes through the interpreter): cases build, every implementation runs, the Triton results agree
with the reference, the table prints and the JSON is written."""

import json

import torch

from bench import kernels as bench
from bench.kernel_cases import Case


def test_dry_run_writes_table_and_json(tmp_path, capsys):
    out = tmp_path / "kernels.json"
    assert bench.main(["--dry-run", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    impls = {(row["case"].split()[0], row["impl"]) for row in result["rows"]}
    assert impls == {("attn", "triton"), ("attn", "torch_gather_sdpa"), ("write_kv", "triton"),
                     ("write_kv", "torch_index_copy"), ("lora", "triton"), ("lora", "torch_gather_bmm"),
                     ("lora", "torch_dense_one_adapter")}
    for row in result["rows"]:
        assert row["us"] > 0 and row["limit_us"] > 0
        if row["impl"] == "triton":
            assert row["max_err"] < 1e-4, row
    assert result["dry_run"] and result["device"] == "cpu"
    printed = capsys.readouterr().out
    assert "% limit" in printed and "attn mixed tiny" in printed and str(out) in printed


def test_peaks_follow_the_device_name_and_overrides():
    assert bench._peaks("NVIDIA H100 80GB HBM3", None, None) == bench.PEAKS["H100"]
    assert bench._peaks("NVIDIA H200", 4000, 900) == (4000e9, 900e12)


def test_a_failing_part_is_recorded_and_the_rest_still_measured(monkeypatch):
    monkeypatch.setattr(bench, "_time", lambda fn, device, dry_run: (fn(), 5.0)[1])
    monkeypatch.setattr(bench, "_time_graph", lambda fn: 4.0)

    def broken():
        raise RuntimeError("out of memory")

    case = Case("c", triton=lambda: None, baselines={"torch_ok": lambda: None, "torch_broken": broken},
                check=broken, bytes=1e6)
    triton_row, ok_row, broken_row = bench.measure(case, torch.device("cpu"), 1e9, 1e12, dry_run=False)
    assert (triton_row.us, triton_row.graph_us, triton_row.max_err) == (5.0, 4.0, None)
    assert "out of memory" in triton_row.extra["errors"][0]
    assert ok_row.us == 5.0 and ok_row.pct_limit == 100 * 1000 / 5.0 and ok_row.vs_triton == 1.0
    assert broken_row.us is None and "out of memory" in broken_row.extra["errors"][0]
