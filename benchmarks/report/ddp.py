"""Section 7: two-process DDP on CPU against one process, and the equality of the metrics."""

from __future__ import annotations

from .common import (
    Inputs,
    Provenance,
    csv_table,
    divide,
    fmt,
    not_measured,
    number,
    ratio,
    read_csv,
)


def section_ddp(inputs: Inputs) -> list[str]:
    lines = ["## 7. Two-process DDP on CPU (gloo)", ""]
    throughput = read_csv(inputs.benchmarks / "ddp_scaling.csv")
    equality = read_csv(inputs.benchmarks / "ddp_scaling_equality.csv")
    command = "python -m benchmarks.ddp_scaling"
    if not throughput or not equality:
        return lines + not_measured(
            "throughput of two processes against one, and equality of their metrics", command
        )
    prov = Provenance()
    columns = ["processes", "threads / process", "steps", "positions", "train s", "positions/s"]
    two = next(r for r in throughput if r["processes"] == "2")
    same_cores = next(
        r for r in throughput if r["processes"] == "1" and r["threads / process"] == "2"
    )
    worst = max(equality, key=lambda r: float(r["relative difference"]))
    return lines + [
        "SASRec on MovieLens-1M with the MIDX-rq head, one epoch from seed 0, each run a fresh "
        "process: one process with one thread, one with two, and two DDP processes with one "
        f"thread each and the recipe's batch each. Command: `{command}`.",
        "",
        *csv_table(throughput, [*columns, "vs 1 process x 1 thread", "test/ndcg@10"], prov),
        f"Two processes train {ratio(number(two['vs 1 process x 1 thread']))} the positions per "
        "second of one single-threaded process and "
        f"{ratio(divide(number(two['positions/s']), number(same_cores['positions/s'])))} those "
        "of one process on both cores. Their test NDCG@10 differs because each step sees twice "
        "the positions (half the steps per epoch), not because of DDP. The same weights "
        "evaluated by one and by two processes (the evaluation sets split without padding, "
        "metric states summed): the largest relative difference over every validation and test "
        f"metric, both ways, is {fmt(number(worst['relative difference']))} "
        f"({worst['metric']}); every metric in "
        f"{inputs.link(inputs.benchmarks / 'ddp_scaling_equality.md')}.",
        "",
        *prov.lines(),
    ]
