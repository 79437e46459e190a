"""``benchmarks.hf_causal_lm`` at toy sizes: each method measured in its own process, the ratios
to Hugging Face's own loss of the same run, and the results files."""

from benchmarks import hf_causal_lm


def test_a_tiny_run_writes_its_rows_and_ratios(tmp_path):
    rows = hf_causal_lm.main(
        ["--vocab", "2000", "--methods", "hf", "exact", "--batch", "2", "--length", "16",
         "--dim", "32", "--repeats", "1", "--name", str(tmp_path / "hf")]
    )  # fmt: skip
    assert [(r["vocab"], r["method"]) for r in rows] == [(2000, "hf"), (2000, "exact")]
    assert rows[0]["memory_vs_hf"] == rows[0]["loss_memory_vs_hf"] == rows[0]["time_vs_hf"] == 1.0
    exact = rows[1]
    assert exact["peak_mb"] > 0 and exact["loss_peak_mb"] > 0 and exact["seconds"] > 0
    assert exact["memory_vs_hf"] == exact["peak_mb"] / rows[0]["peak_mb"]
    assert exact["loss_memory_vs_hf"] == exact["loss_peak_mb"] / rows[0]["loss_peak_mb"]
    text = (tmp_path / "hf.md").read_text()
    assert "| 2000 | exact |" in text and "python -m benchmarks.hf_causal_lm" in text
    assert (tmp_path / "hf.csv").read_text().count("\n") == 3
