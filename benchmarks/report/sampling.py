"""Section 2: draw and refresh time of every sampler against N (the MIDX paper's Figure 6)."""

from __future__ import annotations

from .common import Inputs, Provenance, fmt, markdown_table, not_measured, number, read_csv, size


def section_sampling(inputs: Inputs) -> list[str]:
    lines = ["## 2. Sampling time and refresh time vs N (the MIDX paper's Figure 6)", ""]
    command = "python -m benchmarks.sampler_time --threads 1"
    rows = read_csv(inputs.benchmarks / "sampler_time.csv")
    if rows is None:
        return lines + not_measured("draw and refresh times", command)
    prov = Provenance()
    lines += [
        "Draw: M = 100 negatives with their log q for each of B = 256 queries, D = 64, MIDX "
        "K = 64 (fast mode); refresh: the MIDX index rebuild (faiss k-means), not part of the "
        f"draw, as in the paper. Median milliseconds, one thread. Command: `{command}`.",
        "",
    ]
    growth, refresh = [], []
    for measurement in ("draw", "refresh"):
        chosen = [r for r in rows if r["measurement"] == measurement]
        sizes = sorted({int(r["num_classes"]) for r in chosen})
        table = []
        for sampler in dict.fromkeys(r["sampler"] for r in chosen):
            cells = {int(r["num_classes"]): r for r in chosen if r["sampler"] == sampler}
            ms = [number(cells[n]["median_ms"]) if n in cells else None for n in sizes]
            keys = dict.fromkeys(prov.row(r) for r in cells.values())
            table.append([sampler, *(fmt(v) for v in ms), ", ".join(keys)])
            known = [(n, v) for n, v in zip(sizes, ms, strict=True) if v is not None]
            if measurement == "draw" and len(known) >= 2:
                growth.append(
                    f"{sampler} {known[-1][1] / known[0][1]:.2f}x from N = {size(known[0][0])} "
                    f"to {size(known[-1][0])}"
                )
            if measurement == "refresh" and known:
                refresh.append(f"{sampler} {known[-1][1] / 1000:.3g} s at N = {size(known[-1][0])}")
        columns = [measurement, *(f"N = {size(n)}" for n in sizes), "provenance"]
        lines += [f"{measurement.capitalize()} (ms):", "", *markdown_table(columns, table)]
    lines += [
        "The paper gives Figure 6 as a plot only (GPU, the same B, M and K), with MIDX's draw "
        "time nearly flat up to about 1e5 classes; there are no numbers to quote. Here the draw "
        "time changes "
        + ", ".join(growth)
        + "; a refresh takes "
        + ", ".join(refresh)
        + ". Why: a MIDX draw costs O(K D + K^2 + M K) per "
        "query whatever N, so only memory access grows with N; the refresh is k-means over the "
        "whole table, linear in N. The training-step and sequence-shape rows are in "
        f"{inputs.link(inputs.benchmarks / 'sampler_time.md') or 'sampler_time.md'}.",
        "",
        *prov.lines(),
        *inputs.plots(inputs.benchmarks / "sampler_time.png"),
    ]
    return lines
