"""Section 5: the GCIDE language model (108,620 words) at an equal token budget and an equal
wall clock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .common import (
    Inputs,
    Provenance,
    divide,
    fmt,
    head_label,
    latest_runs,
    markdown_table,
    missing_heads,
    not_measured,
    number,
    ratio,
    read_json,
    verdict,
)

GCIDE = "recipes/results/gcide.md: torch 2.13.0 CPU, 1 thread, 2 shared cores"
OTHER_HEADS = f"{GCIDE}, 'The issue's other heads' section"
LEARN = f"{GCIDE}, 'MIDX-Learn with the sampler's own codes' section"
#: recipe JSONs on GCIDE: file stem, budget (``tokens``, ``time`` or ``both``), where the
#: provenance is, and the full-softmax run of the same session and load its rows are compared with;
#: a sampled head's row in a later file replaces its row at the same budget in an earlier one
GCIDE_RUNS = (
    ("gcide_full", "both", f"{GCIDE} (file of de21590)", "gcide_full"),
    ("gcide_time", "time", f"{GCIDE} (file of de21590)", "gcide_full"),
    ("gcide_time_mixture", "time", f"{GCIDE}, mixture section (file of 4b16217)", "gcide_full"),
    ("gcide_tokens", "tokens", f"{GCIDE} (file of de21590)", "gcide_full"),
    ("gcide_full_rerun", "tokens", OTHER_HEADS, "gcide_full_rerun"),
    ("gcide_tokens_more", "tokens", OTHER_HEADS, "gcide_full_rerun"),
    ("gcide_tokens_cane", "tokens", OTHER_HEADS, "gcide_full_rerun"),
    ("gcide_time_full_rerun", "time", OTHER_HEADS, "gcide_time_full_rerun"),
    ("gcide_time_more", "time", OTHER_HEADS, "gcide_time_full_rerun"),
    ("gcide_time_cane", "time", OTHER_HEADS, "gcide_time_full_rerun"),
    ("gcide_full_rerun_learn", "tokens", LEARN, "gcide_full_rerun_learn"),
    ("gcide_tokens_learn", "tokens", LEARN, "gcide_full_rerun_learn"),
    ("gcide_time_full_rerun_learn", "time", LEARN, "gcide_time_full_rerun_learn"),
    ("gcide_time_learn", "time", LEARN, "gcide_time_full_rerun_learn"),
)
#: the overrides that put the issue's other heads (plain head configs) on the sparse path with 20
#: scored negatives per token, and CANE's split of its 20 classes
SPARSE_20 = (
    "--model.init_args.head.init_args.sparse_grad=true "
    "--model.init_args.head.init_args.num_negatives=20"
)
CANE_4_16 = (
    "--model.init_args.head.init_args.num_candidates=4 "
    "--model.init_args.head.init_args.num_noise=16"
)


#: a GCIDE row, its provenance and the stem of the full-softmax run it is compared with
Run = tuple[dict[str, Any], str, str]


def gcide_runs(recipes: Path) -> tuple[dict[str, list[Run]], dict[str, dict[str, Any] | None]]:
    """The :data:`GCIDE_RUNS` rows per budget (``tokens``, ``time``), and each reference
    stem's full-softmax row (``None`` where it is missing)."""
    fulls = {
        reference: next(
            (r for r in read_json(recipes / f"{reference}.json") or [] if r["head"] == "full"),
            None,
        )
        for *_, reference in GCIDE_RUNS
    }
    budgets: dict[str, list[Run]] = {"tokens": [], "time": []}
    for stem, budget, source, reference in GCIDE_RUNS:
        for r in read_json(recipes / f"{stem}.json") or []:
            for b in budgets if budget == "both" else [budget]:
                budgets[b].append((r, source, reference))
    for budget, runs in budgets.items():
        budgets[budget] = latest_runs(runs, key=superseding_key)
    return budgets, fulls


def superseding_key(run: Run) -> tuple[str, str]:
    """Runs with equal keys replace one another: a sampled head's runs, but not the full
    softmax's, which each session keeps as the reference of its own rows."""
    r, _, reference = run
    return (r["head"], reference if r["head"] == "full" else "")


def wall_clock_ratios(recipes: Path) -> dict[str, tuple[float, str]]:
    """Per head key (``sparse_`` removed): validation perplexity over that of the full softmax of
    the same session at equal wall clock, and the row's provenance; the last run of a head wins."""
    budgets, fulls = gcide_runs(recipes)
    found = {}
    for r, source, reference in budgets["time"]:
        rel = versus(r, fulls[reference], "val/ppl")
        if rel is not None:
            found[r["head"].removeprefix("sparse_")] = (rel, source)
    return found


def section_gcide(inputs: Inputs) -> list[str]:
    lines = ["## 5. GCIDE, 108,620 words: equal token budget and equal wall clock", ""]
    budgets, fulls = gcide_runs(inputs.recipes)
    if not any(budgets.values()):
        return lines + not_measured(
            "the GCIDE language model",
            "python -m recipes.compare --config recipes/configs/lstm_gcide.yaml --heads full "
            "sparse_midx_rq --max-time 8 --val-every 5000 --seed 0 --out "
            "recipes/results/gcide_time",
        )
    prov = Provenance()
    lines += [
        "Tied LSTM LM, 32 x 35 tokens a step, sampled heads on the sparse path with 20 "
        "negatives per token; exact perplexity over all words on the first 10,000 validation / "
        "test tokens, final weights; seed 0. Commands: "
        "`python -m recipes.compare --config recipes/configs/lstm_gcide.yaml --heads <heads> "
        "--max-steps 30` (equal tokens: what the full softmax trains in 8 minutes) or "
        "`--max-time 8` (equal wall clock), with `--val-every 5000 --seed 0 --out "
        "recipes/results/gcide_<tokens|time>`. The `sparse_*` head configs set the sparse path; "
        "the other heads (unigram, One-vs-Each, TAPAS: `--out "
        "recipes/results/gcide_<tokens|time>_more`; MIDX-learn: `gcide_<tokens|time>_learn`, "
        "replacing its rows of `_more`, which had the soft encoder) get it from the overrides "
        f"`-- {SPARSE_20}`, and CANE (`gcide_<tokens|time>_cane`) from "
        f"`-- --model.init_args.head.init_args.sparse_grad=true {CANE_4_16}` (4 beam "
        "candidates against 16 noises). Every sampled head uses the default convention.",
        "",
    ]
    for budget, title in (("tokens", "Equal token budget"), ("time", "Equal wall clock")):
        runs = budgets[budget]
        table = [
            [
                head_label(r["head"]),
                r["steps"],
                fmt(number(r["train positions"])),
                fmt(number(r["positions/s"])),
                ratio(versus(r, fulls[reference], "positions/s")),
                fmt(number(r["refresh s"])),
                fmt(number(r["peak RSS MB"])),
                fmt(number(r["val/ppl"])),
                fmt(number(r["test/ppl"])),
                ratio(versus(r, fulls[reference], "val/ppl")),
                prov.mark(source),
            ]
            for r, source, reference in runs
        ]
        columns = ["head", "steps", "tokens", "tokens/s", "tokens/s vs full", "refresh s"]
        columns += ["peak RSS MB", "val ppl", "test ppl", "val ppl vs full", "provenance"]
        lines += [f"{title}:", "", *markdown_table(columns, table)]
        for reference in dict.fromkeys(ref for *_, ref in runs):
            full = fulls[reference]
            sampled = [r for r, _, ref in runs if ref == reference and r["head"] != "full"]
            if not sampled or not full:
                continue
            best = min(sampled, key=lambda r: float(r["val/ppl"]))
            rel = versus(best, full, "val/ppl")
            lines += [
                f"{title}, against the full softmax of the same session ({full['steps']} steps "
                f"at {fmt(number(full['positions/s']))} tokens/s): the best sampled head, "
                f"{head_label(best['head'])}, reaches {ratio(rel)} of its validation perplexity "
                f"({verdict(rel, lower_is_better=True)} it) at "
                f"{ratio(versus(best, full, 'positions/s'))} its tokens per second.",
                "",
            ]
    have = {r["head"].removeprefix("sparse_") for runs in budgets.values() for r, *_ in runs}
    lines += [
        "Why: the full softmax pays for 1,120 x 108,620 logits a step, so in equal time it sees "
        "a fraction of the tokens. Under the default convention (the positive uncorrected) a "
        "proposal must draw the frequent words as negatives from the first steps, or their "
        "logits run away: log-uniform and unigram do, and so do CANE's beam candidates (the "
        "words the model already ranks high); uniform negatives do not, nor MIDX while its index "
        "is built on untrained embeddings. MIDX-rq recovers as its index is refreshed; "
        "MIDX-learn, whose classes are reassigned to its learned codewords before every step, "
        "follows the model closest and leads at equal wall clock once the index is informative, "
        "though the reassignment is most of its step at this N (recipes/results/gcide.md). "
        "One-vs-Each stays stable with "
        "uniform negatives because its pairwise bound stops pushing once the positive is above "
        "a negative. TAPAS is the fastest per token (20 negatives shared by the batch) but "
        "learns least per token (recipes/results/gcide.md).",
        "",
        (
            missing_heads(have, "GCIDE") + " Peak RSS of heads run after another in one process "
            "includes what that process still held (gcide.md)."
        ).strip(),
        "",
        *prov.lines(),
        *inputs.plots(inputs.recipes / "gcide_time.png", inputs.recipes / "gcide_tokens.png"),
    ]
    return lines


def versus(row: dict[str, Any], full: dict[str, Any] | None, key: str) -> float | None:
    """``row[key]`` over the same key of the full-softmax row it is compared with."""
    return divide(number(row[key]), full and number(full[key]))
