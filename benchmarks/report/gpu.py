"""Section 9 and ``benchmarks/results/gpu.md``: the GPU runs of issues 28, 29 and 30
(``bash scripts/gpu_check.sh 28 29 30``).

Reads, under the benchmarks' folder, ``gpu_head_{A,B,C}.csv`` (issue 28: the exact-head rows of
``benchmarks/head_step.py`` at three shapes), ``gpu_step.csv`` (issue 29,
``benchmarks/gpu_step.py``) and ``test_gpu.txt`` (``make test-gpu``'s output on the GPU), and
under the recipes' folder ``gpu_time_to_quality/{final,curves}.csv`` (issue 30,
``benchmarks/time_to_quality.py``). The CSVs carry the GPU, torch and the commit of every row;
the driver and Triton, which they lack, come from the Markdown files written beside them. Every
target is computed here from the rows, so a new run changes the verdicts with the numbers.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .common import (
    Inputs,
    Provenance,
    divide,
    fmt,
    markdown_table,
    not_measured,
    number,
    ratio,
    read_csv,
    size,
)

COMMAND = "bash scripts/gpu_check.sh 28 29 30"
#: issue 28's shapes, in the order of ``scripts/gpu_check.sh``
SHAPES = ("A", "B", "C")
#: the shapes where the issue asks for time and memory <= Cut Cross-Entropy's
PEER_SHAPES = ("A", "B")
OURS, PEER, PLAIN = "full_softmax_head", "cut_cross_entropy", "plain_cross_entropy"
SPEEDUP = 1.5
#: the test files behind the exactness target of issue 28
EXACT_TESTS = ("tests/kernels/test_linear_cross_entropy.py", "tests/heads/test_exact_backends.py")
TTQ = "gpu_time_to_quality"


# ---------------------------------------------------------------------------------- inputs
def head_rows(inputs: Inputs) -> dict[str, list[dict[str, Any]]]:
    """Issue 28's rows per shape (shapes without a CSV left out), with ``ms`` and ``mib``."""
    found = {}
    for shape in SHAPES:
        rows = read_csv(inputs.benchmarks / f"gpu_head_{shape}.csv")
        if not rows:
            continue
        for r in rows:
            seconds = number(r.get("median_s"))
            r["ms"] = None if seconds is None else 1e3 * seconds
            r["mib"] = number(r.get("peak_mib"))
            r["shape"] = shape
        found[shape] = rows
    return found


def ttq_dir(inputs: Inputs) -> Path:
    return inputs.recipes / TTQ


def read_text(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


def search(pattern: str, *texts: str) -> str | None:
    """The first group of ``pattern`` in the first text that has it."""
    for text in texts:
        match = re.search(pattern, text, re.M)
        if match:
            return match.group(1).strip()
    return None


def environment(inputs: Inputs) -> dict[str, Any]:
    """The GPU, driver, torch, Triton and the commit of every result file."""
    heads = head_rows(inputs)
    step = read_csv(inputs.benchmarks / "gpu_step.csv") or []
    finals = read_csv(ttq_dir(inputs) / "final.csv") or []
    tests = read_text(inputs.benchmarks / "test_gpu.txt")
    mds = [read_text(inputs.benchmarks / f"gpu_head_{s}.md") for s in SHAPES]
    mds += [
        read_text(inputs.benchmarks / "gpu_step.md"),
        read_text(ttq_dir(inputs) / "time_to_quality.md"),
    ]
    rows = [r for rows in heads.values() for r in rows] + step + finals
    commits: dict[str, str] = {}
    for shape, shape_rows in heads.items():
        commits[f"issue 28, shape {shape}"] = ", ".join(
            dict.fromkeys(r["commit"] for r in shape_rows)
        )
    if tests:
        commits["make test-gpu"] = search(r"commit (\w+)", tests) or "not recorded"
    if step:
        commits["issue 29"] = ", ".join(dict.fromkeys(r["commit"] for r in step))
    if finals:
        commits["issue 30"] = ", ".join(dict.fromkeys(r["commit"] for r in finals))
    return {
        "gpu": next((r["machine"] for r in rows if r.get("machine")), None),
        "driver": search(r"driver:? ([\d.]+)", *mds, tests),
        "torch": next((r["torch"] for r in rows if r.get("torch")), None),
        "triton": search(r"Triton:? ([\d.]+)", *mds, tests) or search(r"^- triton: ([\d.]+)", *mds),
        "dtype": search(r"(\w+) table and queries", *mds),
        "commits": commits,
    }


def environment_lines(env: dict[str, Any]) -> list[str]:
    missing = "not recorded"
    commits = "; ".join(f"{what}: {commit}" for what, commit in env["commits"].items())
    return [
        f"- GPU: {env['gpu'] or missing}; driver {env['driver'] or missing}",
        f"- torch {env['torch'] or missing}; Triton {env['triton'] or missing}",
        f"- commits: {commits or missing}",
        "",
    ]


def line(label: str, value: str, ok: bool | None) -> str:
    """One Targets line: what was measured and whether it meets the target."""
    verdict = "not measured" if ok is None else ("met" if ok else "NOT met")
    return f"- {label}: {value}: **{verdict}**"


# ---------------------------------------------------------------------------------- issue 28
def shape_text(rows: list[dict[str, Any]]) -> str:
    r = rows[0]
    return f"T = {int(r['batch']):,}, D = {int(r['dim']):,}"


def by_method(rows: list[dict[str, Any]], n: str) -> dict[str, dict[str, Any]]:
    return {r["method"]: r for r in rows if r["num_classes"] == n}


def head_table(heads: dict[str, list[dict[str, Any]]], prov: Provenance, full: bool) -> list[str]:
    """One line per (shape, N, method): ms, MiB, and ratios to Cut Cross-Entropy and plain
    cross-entropy of the same run; ``full`` keeps the rows without numbers, with their status."""
    table = []
    for shape, rows in heads.items():
        for n in dict.fromkeys(r["num_classes"] for r in rows):
            at = by_method(rows, n)
            peer, plain = at.get(PEER, {}), at.get(PLAIN, {})
            for r in at.values():
                if r["ms"] is None and not full:
                    continue
                cells = [
                    shape,
                    shape_text(rows),
                    f"{int(n):,}",
                    r["method"],
                    fmt(r["ms"]),
                    fmt(r["mib"]),
                    ratio(divide(r["ms"], peer.get("ms"))),
                    ratio(divide(r["mib"], peer.get("mib"))),
                    ratio(divide(r["ms"], plain.get("ms"))),
                    ratio(divide(r["mib"], plain.get("mib"))),
                ]
                table.append(cells + ([r["status"]] if full else []) + [prov.row(r)])
    columns = ["shape", "queries", "N", "method", "ms", "peak MiB", "time / CCE", "memory / CCE"]
    columns += ["time / plain", "memory / plain"]
    return markdown_table([*columns, *(["status"] if full else []), "provenance"], table)


def not_run(heads: dict[str, list[dict[str, Any]]]) -> list[str]:
    """One sentence naming the rows without numbers, grouped by why."""
    why: dict[str, list[str]] = {}
    for rows in heads.values():
        for r in rows:
            if r["ms"] is None:
                where = f"{r['method']} ({r['shape']}, N = {int(r['num_classes']):,})"
                why.setdefault(r["status"], []).append(where)
    parts = [f"{', '.join(where)} ({status})" for status, where in why.items()]
    return ["Not run: " + "; ".join(parts) + ".", ""] if parts else []


def exact_tests(text: str) -> tuple[bool | None, str]:
    """Whether the exactness tests ran and passed in ``make test-gpu``'s output, and what it
    says: ``None`` where the output is missing or does not list them."""
    if not text:
        return None, "make test-gpu's output is not in the results"
    lines = [ln for ln in text.splitlines() if ln.startswith(EXACT_TESTS)]
    ran = {t for t in EXACT_TESTS if any(ln.startswith(t) for ln in lines)}
    if ran != set(EXACT_TESTS):
        return None, f"not in make test-gpu's output: {', '.join(sorted(set(EXACT_TESTS) - ran))}"
    progress = "".join(ln.split(maxsplit=1)[1].split("[")[0] for ln in lines if " " in ln)
    failed = any(c in progress for c in "FE") or bool(re.search(r"\d+ (failed|error)", text))
    counts = f"{progress.count('.')} passed, {progress.count('s')} skipped"
    return not failed, f"{counts} in {' and '.join(EXACT_TESTS)}"


def head_targets(heads: dict[str, list[dict[str, Any]]], tests: str) -> list[str]:
    """Issue 28's Targets lines, from the rows and ``make test-gpu``'s output."""
    lines = []
    for what, key, unit in (("fwd + bwd time", "ms", "ms"), ("peak memory", "mib", "MiB")):
        for shape in PEER_SHAPES:
            rows = heads.get(shape)
            label = f"{what} <= Cut Cross-Entropy's, shape {shape}"
            if not rows:
                lines.append(line(label, "no rows", None))
                continue
            n = rows[0]["num_classes"]
            at = by_method(rows, n)
            mine, peer = at.get(OURS, {}).get(key), at.get(PEER, {}).get(key)
            label += f" ({shape_text(rows)}, N = {int(n):,})"
            if mine is None or peer is None:
                lines.append(line(label, "not both measured", None))
                continue
            value = f"{fmt(mine)} vs {fmt(peer)} {unit} ({ratio(mine / peer)})"
            lines.append(line(label, value, mine <= peer))
    for shape, rows in heads.items():
        for n in dict.fromkeys(r["num_classes"] for r in rows):
            at = by_method(rows, n)
            plain, mine = at.get(PLAIN, {}).get("ms"), at.get(OURS, {}).get("ms")
            if plain is None:
                continue  # plain cross-entropy does not fit (or did not run): no target
            label = (
                f">= {SPEEDUP:g}x faster than plain cross-entropy, shape {shape} "
                f"({shape_text(rows)}, N = {int(n):,})"
            )
            if mine is None:
                lines.append(line(label, "ours not measured", None))
                continue
            value = f"{fmt(mine)} vs {fmt(plain)} ms (plain / ours = {ratio(plain / mine)})"
            lines.append(line(label, value, plain / mine >= SPEEDUP))
    ok, said = exact_tests(tests)
    lines.append(
        line(
            "equal to F.cross_entropy: the loss within 1e-5 (fp32) / 1e-3 relative (bf16), the "
            "gradients within 1e-5 (fp32) / no further from fp32 than plain bf16's (bf16), by "
            "the tests that passed on the GPU",
            f"{said}: fp32 within 1e-5 relative (1e-6 absolute); bf16 / fp16 under autocast "
            "the loss within 1e-3 relative and every gradient no further from fp32 than plain "
            "half-precision F.cross_entropy's (the test allows 1.5x its largest error). The "
            "gradient bar is not literally 1e-3 relative: per-element bf16 rounding of the "
            "logit gradients makes "
            "both ~4e-3 of the largest",
            ok,
        )
    )
    return lines


def issue_28(inputs: Inputs, prov: Provenance, full: bool, level: str) -> list[str]:
    heads = head_rows(inputs)
    title = [
        f"{level} Issue 28: the exact head against Cut Cross-Entropy and plain cross-entropy",
        "",
    ]
    if not heads:
        return title + not_measured("the exact head on a GPU", "bash scripts/gpu_check.sh 28")
    env = environment(inputs)
    dtype = env["dtype"] or "the benchmark's"
    return [
        *title,
        f"One training step (forward + backward, no optimizer step) of `benchmarks/head_step.py`, "
        f"{dtype} table and queries (our heads under autocast), medians of 5 rounds; peak MiB: "
        "growth of `max_memory_allocated` over one step beyond the table and inputs. "
        '`full_softmax_head` is `backend="auto"` (the fused Triton kernel on CUDA), '
        '`full_softmax_head_chunked` `backend="torch"`; `cut_cross_entropy` is its `impl="cce"` '
        "with its default gradient filtering. Ratios to the same run's Cut Cross-Entropy (CCE) and "
        "plain cross-entropy rows (below 1: less).",
        "",
        *head_table(heads, prov, full),
        *([] if full else not_run(heads)),
        "Targets:",
        "",
        *head_targets(heads, read_text(inputs.benchmarks / "test_gpu.txt")),
        "",
    ]


# ---------------------------------------------------------------------------------- issue 29
def step_targets(rows: list[dict[str, str]]) -> list[str]:
    """Issue 29's Targets lines, from ``gpu_step.csv``."""
    lines = []
    head = [r for r in rows if r["part"] == "head"]
    uniform = next((r for r in head if r["method"] == "uniform"), None)
    for r in head:
        if r["method"] != "midx_rq" or uniform is None:
            continue
        where = f"{int(r['batch']):,} queries, N = {size(int(r['num_classes']))}"
        for what, column, unit, bound in (
            ("time", "median_ms", "ms", 1.3),
            ("peak memory", "peak_mib", "MiB", 2.0),
        ):
            a, b = number(r[column]), number(uniform[column])
            label = (
                f"MIDX-rq head K = {r['codebook_size']} / uniform head, {what} ({where}; "
                f"target <= {bound:g}x)"
            )
            x = divide(a, b)
            value = "missing" if x is None else f"{fmt(a)} / {fmt(b)} {unit} = {ratio(x)}"
            lines.append(line(label, value, None if x is None else x <= bound))
    for r in rows:
        if r["part"] != "refresh":
            continue
        seconds = divide(number(r["median_ms"]), 1e3)
        cold = search(r"cold\) refresh ([\d.]+ s)", r.get("note", ""))
        label = (
            f"index refresh, MIDX-rq K = {r['codebook_size']}, N = {size(int(r['num_classes']))} "
            "(warm-started median; target <= 0.5 s)"
        )
        value = (
            "missing"
            if seconds is None
            else f"{seconds:.3f} s" + (f" (cold first {cold})" if cold else "")
        )
        lines.append(line(label, value, None if seconds is None else seconds <= 0.5))
    train = [r for r in rows if r["part"] == "train"]
    sizes = sorted({int(r["num_classes"]) for r in train})
    step = {(r["method"], int(r["num_classes"])): number(r["median_ms"]) for r in train}
    samplers = list(dict.fromkeys(r["method"].split("/", 1)[1] for r in train))
    if sizes:
        small, large = sizes[0], sizes[-1]
        for s in samplers:
            a, b = step.get((f"sparse/{s}", large)), step.get((f"sparse/{s}", small))
            x = divide(a, b)
            lines.append(
                line(
                    f"whole step, sparse_grad + LazyAdam, {s}, "
                    f"N = {size(large)} / N = {size(small)} (target <= 1.5x)",
                    "missing" if x is None else f"{fmt(a)} / {fmt(b)} ms = {ratio(x)}",
                    None if x is None else x <= 1.5,
                )
            )
        for n in (n for n in sizes if n >= 1_000_000):
            for s in samplers:
                a, b = step.get((f"sparse/{s}", n)), step.get((f"dense_fused/{s}", n))
                lines.append(
                    line(
                        f"sparse_grad + LazyAdam faster than dense + Adam(fused=True), {s}, "
                        f"N = {size(n)}",
                        "missing"
                        if a is None or b is None
                        else f"{fmt(a)} vs {fmt(b)} ms (fused / sparse = {ratio(b / a)})",
                        None if a is None or b is None else a < b,
                    )
                )
    compiled = [r for r in rows if r["part"] == "compile"]
    for head_name in dict.fromkeys(r["method"].split("/", 1)[0] for r in compiled):
        got = {
            r["method"].split("/", 1)[1]: r
            for r in compiled
            if r["method"].startswith(f"{head_name}/")
        }
        eager, comp = (number(got.get(m, {}).get("median_ms")) for m in ("eager", "compiled"))
        breaks = search(r"graph breaks (\d+)", got.get("compiled", {}).get("note", ""))
        n = int(compiled[0]["num_classes"])
        lines.append(
            line(
                f"compiled forward + backward faster than eager, {head_name}, N = {size(n)} "
                f"(graph breaks: {breaks if breaks is not None else 'not recorded'})",
                "missing"
                if eager is None or comp is None
                else f"{fmt(comp)} vs {fmt(eager)} ms ({ratio(comp / eager)})",
                None if eager is None or comp is None else comp < eager,
            )
        )
    return lines


def issue_29(inputs: Inputs, prov: Provenance, level: str) -> list[str]:
    title = [f"{level} Issue 29: sampled training on the GPU", ""]
    rows = read_csv(inputs.benchmarks / "gpu_step.csv")
    if not rows:
        return title + not_measured("sampled training on a GPU", "bash scripts/gpu_check.sh 29")
    columns = ["part", "method", "codebook_size", "num_classes", "batch", "median_ms", "peak_mib"]
    table = [
        [r[c] if number(r[c]) is None else fmt(number(r[c])) for c in columns]
        + [r["note"], prov.row(r)]
        for r in rows
    ]
    return [
        *title,
        "`benchmarks/gpu_step.py`: the sampled head's forward + backward (uniform vs MIDX-rq, "
        "M = 100), the MIDX index refresh of a `[N, 64]` table on the GPU, the whole training step "
        "(B = 1024, M = 100; `sparse_grad` + `LazyAdam` vs the dense gradient + "
        "`Adam(fused=True)`) and eager vs `torch.compile`; details in "
        f"{inputs.link(inputs.benchmarks / 'gpu_step.md')}.",
        "",
        *markdown_table([*columns, "note", "provenance"], table),
        "Targets:",
        "",
        *step_targets(rows),
        "",
    ]


# ---------------------------------------------------------------------------------- issue 30
def ttq_settings(inputs: Inputs, finals: list[dict[str, str]]) -> tuple[float, str, str]:
    """The budget per method (s), the seed and the precision, from ``time_to_quality.md``
    (the budget falls back on the rows' training time)."""
    text = read_text(ttq_dir(inputs) / "time_to_quality.md")
    budget = number(search(r"^- budget: ([\d.]+) s", text))
    if budget is None:
        budget = float(round(max(number(r["train_s"]) or 0.0 for r in finals)))
    return (
        budget,
        search(r"seed (\d+)", text) or "not recorded",
        search(r"precision: ([\w-]+)", text) or "not recorded",
    )


def reach_time(
    curve: list[dict[str, str]], threshold: float, higher_is_better: bool
) -> float | None:
    """The first training time at which a curve is at least as good as ``threshold``."""
    for point in curve:
        value = float(point["value"])
        if value >= threshold if higher_is_better else value <= threshold:
            return float(point["wall_s"])
    return None


def ttq_targets(
    finals: list[dict[str, str]], curves: list[dict[str, str]], budget: float
) -> list[str]:
    """Issue 30's Targets lines (those of ``benchmarks.time_to_quality.targets``), from the
    CSVs: the default sampled head against Cut Cross-Entropy and mixed negatives."""
    ok = {(r["task"], r["method"]): r for r in finals if r["status"] == "ok"}

    def val(task: str, method: str) -> float | None:
        return number(ok.get((task, method), {}).get("val"))

    def curve(task: str, method: str) -> list[dict[str, str]]:
        return [p for p in curves if (p["task"], p["method"]) == (task, method)]

    def compare(task: str, other: str, label: str, holds: Callable[[float, float], bool]) -> str:
        mine, theirs = val(task, "default"), val(task, other)
        if mine is None or theirs is None:
            return line(label, "did not run", None)
        return line(label, f"{fmt(mine)} vs {fmt(theirs)}", holds(mine, theirs))

    goal = curve("gcide", PEER)
    reach = reach_time(curve("gcide", "default"), float(goal[-1]["value"]), False) if goal else None
    when = "never" if reach is None else f"at {reach:.1f} s"
    mine, theirs = val("gcide", "default"), val("gcide", PEER)
    return [
        compare(
            "gcide",
            PEER,
            "GCIDE, equal wall clock: default sampled val ppl <= Cut Cross-Entropy's",
            lambda a, b: a <= b,
        ),
        compare(
            "gcide",
            "mixed",
            "GCIDE, equal wall clock: default sampled val ppl <= mixed negatives'",
            lambda a, b: a <= b,
        ),
        line(
            "GCIDE: default sampled reaches Cut Cross-Entropy's final val ppl within "
            f"0.5 x {budget:g} s",
            f"reached {when} (final val ppl {fmt(mine)} vs {fmt(theirs)})",
            None if not goal or mine is None else reach is not None and reach <= 0.5 * budget,
        ),
        compare(
            "sasrec",
            PEER,
            "1M synthetic items, equal wall clock: default sampled val NDCG@10 >= "
            "Cut Cross-Entropy's",
            lambda a, b: a >= b,
        ),
    ]


def classes(finals: list[dict[str, str]]) -> str:
    """Per task, its metric and class count (from the head's ``repr`` in the rows)."""
    parts = []
    for task in dict.fromkeys(r["task"] for r in finals):
        row = next(r for r in finals if r["task"] == task)
        n = search(r"num_classes=(\d+)", row.get("head", ""))
        parts.append(f"{task}: {row['metric']}" + (f" over {int(n):,} classes" if n else ""))
    return "; ".join(parts)


def issue_30(inputs: Inputs, prov: Provenance, level: str, full: bool) -> list[str]:
    title = [f"{level} Issue 30: time to quality at equal wall clock", ""]
    finals = read_csv(ttq_dir(inputs) / "final.csv")
    curves = read_csv(ttq_dir(inputs) / "curves.csv") or []
    if not finals:
        return title + not_measured("time to quality on a GPU", "bash scripts/gpu_check.sh 30")
    budget, seed, precision = ttq_settings(inputs, finals)
    details = inputs.link(ttq_dir(inputs) / "time_to_quality.md")
    lines = [
        *title,
        f"`benchmarks/time_to_quality.py`: every method trains for the same {budget:g} s of wall "
        f"clock per task (validation excluded), seed {seed}, {precision} training, then exact "
        f"validation and test quality over every class ({classes(finals)}). The synthetic "
        "generator of the SASRec task plants item clusters, which MIDX exploits. Shapes, heads "
        f"and versions in {details}.",
        "",
    ]
    if full:
        return lines + ["Targets:", "", *ttq_targets(finals, curves, budget), ""]
    columns = ["task", "method", "steps", "epochs", "positions/s", "val", "test"]
    table = [
        [
            r["task"],
            r["method"],
            r["steps"],
            fmt(number(r["epochs"])),
            fmt(number(r["positions_per_s"])),
            fmt(number(r["val"])),
            fmt(number(r["test"])),
            prov.row(r),
        ]
        for r in finals
    ]
    return [
        *lines,
        "Final exact quality per task (`default`: uniform sampling, 100 negatives; "
        "`mixed`: in-batch + 100 uniform; `midx_rq`: 20 negatives, `sparse_grad`; `exact`: "
        '`FullSoftmaxHead(backend="auto")`):',
        "",
        *markdown_table([*columns, "provenance"], table),
        "Targets:",
        "",
        *ttq_targets(finals, curves, budget),
        "",
        *inputs.plots(ttq_dir(inputs) / "time_to_quality.png"),
    ]


# ---------------------------------------------------------------------------------- outputs
def measured(inputs: Inputs) -> bool:
    """Whether any GPU result file is there."""
    return bool(
        head_rows(inputs)
        or read_csv(inputs.benchmarks / "gpu_step.csv")
        or read_csv(ttq_dir(inputs) / "final.csv")
    )


def gpu_title(inputs: Inputs) -> str:
    gpu = environment(inputs)["gpu"] if measured(inputs) else None
    return f"GPU ({gpu})" if gpu else "GPU"


def gpu_markdown(inputs: Inputs) -> str:
    """The text of ``benchmarks/results/gpu.md``."""
    head = [
        "# GPU results: issues 28, 29 and 30",
        "",
        "Generated by `python -m benchmarks.report` (`make report`) from the GPU runs' result "
        f"files; edit those, not this file. Command on a GPU machine: `{COMMAND}` (see the "
        "script's header).",
        "",
    ]
    if not measured(inputs):
        return "\n".join(head + not_measured("any GPU result", COMMAND)).strip() + "\n"
    prov = Provenance()
    parts = [
        *head,
        *environment_lines(environment(inputs)),
        *issue_28(inputs, prov, full=True, level="##"),
        *inputs.plots(*(inputs.benchmarks / f"gpu_head_{s}.png" for s in SHAPES)),
        *issue_29(inputs, prov, level="##"),
        *issue_30(inputs, prov, level="##", full=True),
        *prov.lines(),
    ]
    return "\n".join(parts).strip() + "\n"


def write_gpu_md(inputs: Inputs) -> Path:
    """Writes ``gpu.md`` beside the report; returns its path."""
    path = inputs.benchmarks / "gpu.md"
    path.write_text(gpu_markdown(dataclasses.replace(inputs, out=path)))
    return path


def section_gpu(inputs: Inputs) -> list[str]:
    lines = [f"## 9. {gpu_title(inputs)}", ""]
    if not measured(inputs):
        return lines + not_measured(
            "the exact head, sampled training and time to quality on a GPU",
            f"{COMMAND}` on a GPU machine (see the script's header), then `make report",
        )
    prov = Provenance()
    gpu_md = inputs.link(inputs.benchmarks / "gpu.md")
    return [
        *lines,
        f"Run by `{COMMAND}` on a GPU machine (see the script's header)"
        + (f"; the same tables and targets in {gpu_md}" if gpu_md else "")
        + ".",
        "",
        *environment_lines(environment(inputs)),
        *issue_28(inputs, prov, full=False, level="###"),
        *inputs.plots(*(inputs.benchmarks / f"gpu_head_{s}.png" for s in SHAPES)),
        *issue_29(inputs, prov, level="###"),
        *issue_30(inputs, prov, level="###", full=False),
        *prov.lines(),
    ]


def speed_pointer(inputs: Inputs) -> list[str]:
    """Section 1's line about the GPU: a pointer to section 9, or the command."""
    if not head_rows(inputs):
        return not_measured("the exact heads' table on a GPU (section 9)", COMMAND)
    gpu_md = inputs.link(inputs.benchmarks / "gpu.md")
    return [
        f"On a GPU ({gpu_title(inputs).removeprefix('GPU (').removesuffix(')')}): the exact "
        "heads against Cut Cross-Entropy and plain cross-entropy at issue 28's shapes, in "
        "section 9 below" + (f" and {gpu_md}" if gpu_md else "") + ".",
        "",
    ]
