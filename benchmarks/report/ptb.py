"""Section 3: PTB in the MIDX paper's Table 4 setting, its Figures 3 and 7, and the earlier
three-epoch rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
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
    read_csv,
    read_json,
)
from .papers import PAPER_TABLE4
from .quality import Quality, comparison_sentences, quality_table

PTB = "recipes/RESULTS.md, 'LSTM on PTB, three epochs'"
#: recipe JSONs in the Table 4 setting (20 negatives, K = 32): file stem, the sampled-softmax
#: convention of its SampledSoftmaxHead rows (the full softmax, CANE and One-vs-Each have none);
#: a head's row in a later file replaces its row under the same convention in an earlier one
PTB_TABLE4_RUNS = (
    ("lstm_ptb_table4_full", "exact_positive"),
    ("lstm_ptb_table4_static", "exact_positive"),
    ("lstm_ptb_table4_midx_rq", "exact_positive"),
    ("lstm_ptb_table4_learn_ove", "exact_positive"),
    ("lstm_ptb_table4_cane", "exact_positive"),
    ("lstm_ptb_table4_cane_frequency_19_1", "exact_positive"),
    ("lstm_ptb_table4_tensorflow_static", "tensorflow"),
    ("lstm_ptb_table4_tensorflow_midx", "tensorflow"),
    ("lstm_ptb_table4_corrected_all", "corrected_all"),
    ("lstm_ptb_table4_corrected_learn_pq", "corrected_all"),
    ("lstm_ptb_table4_learn", "exact_positive"),
    ("lstm_ptb_table4_corrected_learn", "corrected_all"),
    ("lstm_ptb_table4_tensorflow_learn", "tensorflow"),
)
#: the task name of a Table 4 row under each convention
PTB_CONVENTION_TASKS = {
    "exact_positive": "PTB LSTM",
    "corrected_all": "PTB LSTM, every logit corrected",
    "tensorflow": "PTB LSTM, TensorFlow's convention",
}
#: the MIDX-rq head's Table 4 row under this convention is the sweeps' K = 32, M = 20 point
PTB_SWEEP_CONVENTION = "tensorflow"
#: the conventions of the headline's PTB column, side by side
HEADLINE_PTB = ("exact_positive", "corrected_all", "tensorflow")
#: the Table 4 run whose SamplerDiagnostics give the proposal-distribution plot
PROPOSAL_RUN = "lstm_ptb_table4_midx_rq"
#: the sweeps of the paper's Figures 3 and 7: file stem prefix, the swept setting, its Table 4
#: value, and the CLI override that sets it
PTB_SWEEPS = (
    ("lstm_ptb_codebook_", "codebook size K", 32, "sampler.init_args.codebook_size"),
    ("lstm_ptb_negatives_", "negatives M", 20, "head.init_args.num_negatives"),
)


def markdown_rows_after(text: str, header_start: str) -> list[list[str]]:
    """The cells of the first Markdown table whose header line starts with ``header_start``."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(header_start):
            body = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                body.append([c.strip() for c in row.strip("|").split("|")])
            return body
    return []


def ptb_rows(inputs: Inputs) -> list[Quality]:
    """PTB LSTM validation perplexity after each epoch: the RESULTS.md table (saved only
    there) and CANE's metrics CSV."""
    text = inputs.results_md.read_text() if inputs.results_md.is_file() else ""
    rows = []
    labels = {"full softmax": "full", "uniform": "uniform", "MIDX-rq": "midx_rq"}
    for cells in markdown_rows_after(text, "| head | val ppl epoch 1 | epoch 2 | epoch 3 |"):
        head = labels.get(cells[0].split(",")[0])
        values = [number(c.replace(",", "")) for c in cells[1:4]]
        if head and None not in values:
            rows.append(ptb_row(head, values, f"{PTB} (TensorFlow convention); seed 0"))
    cane = read_csv(inputs.recipes / "lstm_ptb_cane_metrics.csv") or []
    values = [number(r["val/ppl"]) for r in cane if number(r.get("val/ppl")) is not None]
    if values:
        rows.append(ptb_row("cane", values, f"{PTB}, CANE paragraph (file of 701fac1); seed 0"))
    return rows


def ptb_row(head: str, values: list[float], source: str) -> Quality:
    return Quality(
        task="PTB LSTM",
        head=head,
        epochs=len(values),
        metric="val ppl",
        value=values[-1],
        columns={f"val ppl epoch {i + 1}": v for i, v in enumerate(values)},
        source=source,
    )


PTB_COMMAND = "python -m recipes.compare --config recipes/configs/lstm_ptb.yaml"
NEGATIVES_20 = "--model.init_args.head.init_args.num_negatives=20"


def ptb_test_row(r: dict[str, Any], task: str, stem: str) -> Quality:
    """A PTB ``recipes.compare`` row of ``recipes/results/<stem>.json`` as its test perplexity,
    with the best validation perplexity and the seconds per epoch beside it."""
    return Quality(
        task,
        r["head"],
        int(r["epochs"]),
        "test ppl",
        float(r["test/ppl"]),
        {
            "best val ppl": number(r.get("best val/ppl")),
            "s / epoch": number(r.get("seconds/epoch")),
        },
        f"recipes/results/{stem}.json; seed 0",
    )


def table4_rows(recipes: Path) -> list[Quality]:
    """Test perplexity of the Table 4 runs (:data:`PTB_TABLE4_RUNS`), one task per convention;
    the full softmax's row stands in every task that has sampled rows."""
    rows, full = [], []
    for stem, convention in PTB_TABLE4_RUNS:
        for r in read_json(recipes / f"{stem}.json") or []:
            row = ptb_test_row(r, PTB_CONVENTION_TASKS[convention], stem)
            (full if r["head"] == "full" else rows).append(row)
    rows = latest_runs(rows, key=lambda r: (r.task, r.head))
    tasks = list(dict.fromkeys(r.task for r in rows)) or [PTB_CONVENTION_TASKS["exact_positive"]]
    return [replace(f, task=task) for task in tasks for f in full] + rows


def table5_sentence(rows: Sequence[Quality]) -> str:
    """The paper's Table 5 (learned against k-means codewords) and, under each convention where
    both ran, our MIDX-Learn (RQ) against MIDX-rq."""
    pairs = []
    for name, task in PTB_CONVENTION_TASKS.items():
        found = {r.head: r.value for r in rows if r.task == task}
        if "midx_learn" in found and "midx_rq" in found:
            learn, kmeans = found["midx_learn"], found["midx_rq"]
            side = "ahead of" if learn < kmeans else "behind"
            pairs.append(f"`{name}` {fmt(learn)}, {side} MIDX-rq's {fmt(kmeans)}")
    ours = f" Ours, MIDX-learn (RQ) test ppl: {'; '.join(pairs)}." if pairs else ""
    return (
        "The paper's Table 5 (PTB LSTM, log perplexity as printed): MIDX-pq 4.8003, "
        "MIDX-Learn-pq 4.7320, MIDX-rq 4.7693, MIDX-Learn-rq 4.7212: learned codewords ahead of "
        "k-means." + ours
    )


def table4_paragraph(rows: Sequence[Quality]) -> str:
    """The paper's four proposals ordered by test perplexity under each convention measured,
    beside the paper's order, and why the conventions part."""
    heads = ("uniform", "unigram", "midx_pq", "midx_rq")
    orders = []
    for name, task in PTB_CONVENTION_TASKS.items():
        found = sorted((r.value, r.head) for r in rows if r.task == task and r.head in heads)
        if len(found) > 1:
            order = " < ".join(f"{head_label(h)} {fmt(v)}" for v, h in found)
            orders.append(f"`{name}`: {order}")
    if not orders:
        return ""
    paper = sorted(heads, key=lambda h: float(PAPER_TABLE4[h]))
    return (
        "The proposals ordered by test perplexity under each convention (`exact_positive`, the "
        "default and the paper's Eq. 1: the positive uncorrected, accidental hits removed; "
        "`corrected_all`: every logit corrected by log(M q), hits kept; `tensorflow`: every "
        "logit corrected and hits removed, biased when a target is likely): "
        + "; ".join(orders)
        + "; the paper's: "
        + " < ".join(head_label(h) for h in paper)
        + ". Why: PTB's targets are Zipfian. When the positive is not corrected, a frequent word "
        "is pushed up as a positive at nearly every step and pushed down, with weight "
        "1 / (M q), only on the steps that draw it: unbiased, but with 20 draws of 10,000 "
        "classes so noisy that its logit runs away unless the proposal draws frequent words "
        "often (section 6 shows it for the uniform head at 100 negatives). Correcting the "
        "positive like the negatives damps exactly those words, and then the proposal's "
        "closeness to the softmax orders the heads."
    )


def sweep_lines(inputs: Inputs, prov: Provenance, table4: Sequence[Quality]) -> list[str]:
    """The paper's Figures 3 and 7: MIDX-rq's test perplexity against the codebook size and the
    number of negatives (:data:`PTB_SWEEPS`), the ``table4`` MIDX-rq row under
    :data:`PTB_SWEEP_CONVENTION` as the default point."""
    lines = []
    task = PTB_CONVENTION_TASKS[PTB_SWEEP_CONVENTION]
    reference = [r for r in table4 if r.task == task and r.head == "midx_rq"]
    full = [r for r in table4 if r.head == "full"][:1]
    versus = f" (the full softmax: {fmt(full[0].value)})" if full else ""
    convention = f"--model.init_args.head.init_args.convention={PTB_SWEEP_CONVENTION}"
    for prefix, setting, default, override in PTB_SWEEPS:
        points = {
            int(path.stem.removeprefix(prefix)): ptb_test_row(r, task, path.stem)
            for path in inputs.recipes.glob(f"{prefix}*.json")
            if path.stem.removeprefix(prefix).isdigit()
            for r in read_json(path) or []
        }
        if reference:
            points.setdefault(default, reference[0])
        command = (
            f"{PTB_COMMAND} --heads midx_rq --epochs 3 --seed 0 --out recipes/results/"
            f"{prefix}<value> -- {convention} "
            + ("" if override.endswith("num_negatives") else f"{NEGATIVES_20} ")
            + f"--model.init_args.{override}=<value>"
        )
        if len(points) < 2:
            lines += not_measured(f"MIDX-rq's test perplexity against the {setting}", command)
            continue
        table = [
            [
                v,
                r.epochs,
                fmt(r.value),
                fmt(r.columns["best val ppl"]),
                fmt(r.columns["s / epoch"]),
                prov.mark(r.source),
            ]
            for v, r in sorted(points.items())
        ]
        ends = [table[0], table[-1]]
        lines += [
            f"MIDX-rq against the {setting} ({PTB_SWEEP_CONVENTION} convention, the other "
            f"settings as in Table 4). Command: `{command}`.",
            "",
            *markdown_table(
                [setting, "epochs", "test ppl", "best val ppl", "s / epoch", "provenance"], table
            ),
            f"Test perplexity goes from {ends[0][2]} at {setting} = {ends[0][0]} to "
            f"{ends[1][2]} at {ends[1][0]}{versus}; the paper reports it falling as the "
            + ("codebook grows (Figure 3)." if "codebook" in setting else "draws grow (Figure 7)."),
            "",
        ]
    return lines


def section_ptb(inputs: Inputs) -> list[str]:
    lines = ["## 3. PTB, the MIDX paper's Table 4", ""]
    prov = Provenance()

    def paper(r: Quality | None) -> list[str]:
        if r is None:
            return ["paper test ppl", "paper vs full"]
        return [PAPER_TABLE4.get(r.head, "—"), ratio(paper_ratio(r))]

    def paper_ratio(r: Quality) -> float | None:
        return divide(number(PAPER_TABLE4.get(r.head)), number(PAPER_TABLE4["full"]))

    table4 = table4_rows(inputs.recipes)
    runs = [stem for stem, _ in PTB_TABLE4_RUNS]
    command = (
        f"{PTB_COMMAND} --heads <heads> --epochs 3 --seed 0 --out recipes/results/<file> -- "
        f"{NEGATIVES_20} --model.init_args.head.init_args.convention="
        "<exact_positive|corrected_all|tensorflow>"
    )
    if table4:
        epochs = sorted({r.epochs for r in table4})
        lines += [
            "Every head with 20 negatives per query and K = 32 (the paper's setting), "
            f"{' / '.join(map(str, epochs))} epochs, the best-validation checkpoint; test "
            "perplexity over the whole vocabulary, beside the paper's after up to 100 epochs "
            "with early stopping. CANE scores 20 classes too: 4 beam candidates against 16 "
            "noises. TAPAS picks its 20 shared negatives among 40 uniform presamples. Commands: "
            f"`{command}` for the sampled heads, the same without the overrides for `full`, "
            "and with `--model.init_args.head.init_args.num_candidates=4 "
            "--model.init_args.head.init_args.num_noise=16` for `cane`; `cane_frequency` "
            "(Section 5's frequency tree: 19 candidates drawn from the routed subset, 1 noise) "
            "runs its own config with no override. The runs: "
            + ", ".join(f"`{stem}`" for stem in runs)
            + ".",
            "",
            *quality_table(table4, prov, paper),
            comparison_sentences(table4, paper_ratio, lower=True),
            "",
            table4_paragraph(table4),
            "",
            missing_heads({r.head for r in table4}, "PTB LSTM (Table 4 setting)"),
            "",
        ]
    else:
        lines += not_measured(
            "every head with 20 negatives and K = 32 at the same epochs (the paper's setting)",
            command,
        )
    rows = ptb_rows(inputs)
    if rows:
        lines += [
            "Earlier: three epochs, 100 negatives per query (TensorFlow convention), "
            "validation perplexity. Command: `python -m recipes fit --config "
            "recipes/configs/lstm_ptb.yaml --config recipes/configs/heads/<head>.yaml "
            "--trainer.max_epochs=3`.",
            "",
            *quality_table(rows, prov, paper),
            comparison_sentences(rows, paper_ratio, lower=True)
            + " Why: an adaptive proposal draws the negatives the model confuses with the target, "
            "so it needs fewer draws than a static one; with 100 negatives instead of the paper's "
            "20 and 3 epochs instead of up to 100, every head is nearer the full softmax here, so "
            "only the ordering compares.",
            "",
        ]
    lines += [
        table5_sentence(table4),
        "",
        *sweep_lines(inputs, prov, table4),
        *prov.lines(),
        *inputs.plots(*(inputs.recipes / f"{stem}.png" for stem in runs)),
    ]
    return lines
