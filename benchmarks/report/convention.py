"""Section 6: TensorFlow's sampled-softmax convention against the consistent default."""

from __future__ import annotations

from .common import (
    Inputs,
    Provenance,
    divide,
    fmt,
    head_label,
    markdown_table,
    not_measured,
    number,
    ratio,
    read_json,
    verdict,
)

#: recipe JSONs with both conventions of one head on the same code: file stem, model, the
#: metric (without its ``test/`` or ``best val/`` prefix) and whether lower is better
CONVENTION_RUNS = (
    ("sasrec_ml-1m_convention", "SASRec ML-1M", "ndcg@10", False),
    ("gru4rec_ml-1m_convention", "GRU4Rec ML-1M", "ndcg@10", False),
    ("lstm_ptb_convention", "PTB LSTM", "ppl", True),
)
CONVENTION_SOURCE = (
    "recipes/RESULTS.md, 'The two conventions side by side': TensorFlow's at 18661be, the "
    "default at f9f125d (MovieLens) or 18661be (PTB); the eager uniform path is the same in both"
)
#: the third convention, every logit corrected and hits kept, in ``<stem>_corrected_all.json``
CORRECTED_ALL_SOURCE = "recipes/RESULTS.md, 'The third convention, corrected_all'"


def section_convention(inputs: Inputs) -> list[str]:
    """Both conventions of the uniform head on the same code and data: test and best validation
    metric, and the default's ratio to TensorFlow's."""
    lines = [
        "## 6. The sampled-softmax convention: TensorFlow's against the consistent default",
        "",
    ]
    table, sentences, missing = [], [], []
    prov = Provenance()
    for stem, model, metric, lower in CONVENTION_RUNS:
        rows = {r["convention"]: r for r in read_json(inputs.recipes / f"{stem}.json") or []}
        if "tensorflow" not in rows or "exact_positive" not in rows:
            missing.append(model)
            continue
        sources = dict.fromkeys(rows, CONVENTION_SOURCE)
        for r in read_json(inputs.recipes / f"{stem}_corrected_all.json") or []:
            rows["corrected_all"], sources["corrected_all"] = r, CORRECTED_ALL_SOURCE
        reference = number(rows["tensorflow"][f"test/{metric}"])
        for name in ("tensorflow", "exact_positive", "corrected_all"):
            if name not in rows:
                continue
            r = rows[name]
            table.append(
                [
                    model,
                    head_label(r["head"]),
                    name,
                    r["epochs"],
                    f"test {metric}",
                    fmt(number(r[f"test/{metric}"])),
                    fmt(number(r.get(f"best val/{metric}"))),
                    ratio(divide(number(r[f"test/{metric}"]), reference)),
                    prov.mark(f"{sources[name]}; seed 0"),
                ]
            )
        rel = divide(number(rows["exact_positive"][f"test/{metric}"]), reference)
        sentence = (
            f"On {model} the consistent default {verdict(rel, lower)} TensorFlow's convention "
            f"(test {metric} {ratio(rel)} of it)"
        )
        if "corrected_all" in rows:
            rel = divide(number(rows["corrected_all"][f"test/{metric}"]), reference)
            sentence += f", and `corrected_all` {verdict(rel, lower)} it ({ratio(rel)})"
        sentences.append(sentence + ".")
    if table:
        lines += [
            "The uniform head, 100 negatives per query, with `convention=tensorflow` (every "
            "logit, the positive's too, corrected by log(M q)) and with the default "
            "`exact_positive` (the positive uncorrected); both mask accidental hits. Where "
            "measured, also `corrected_all` (every logit corrected, hits kept: consistent like "
            "the default, damped like TensorFlow's; `<stem>_corrected_all` files). Same code, "
            "data, epochs and seed. Command: `python -m recipes.compare --config "
            "recipes/configs/<model>.yaml --heads uniform --epochs <10 | 3 for PTB> --seed 0 "
            "--threads 1 -- --model.init_args.head.init_args.convention=<tensorflow|"
            "exact_positive|corrected_all>`.",
            "",
            *markdown_table(
                ["model", "head", "convention", "epochs", "metric", "test", "best val"]
                + ["vs TensorFlow's", "provenance"],
                table,
            ),
            " ".join(sentences),
            "",
            *prov.lines(),
        ]
    if missing:
        lines += not_measured(
            f"both conventions side by side on {', '.join(missing)}",
            "python -m recipes.compare --config recipes/configs/<model>.yaml --heads uniform "
            "--seed 0 --out recipes/results/<model>_convention -- "
            "--model.init_args.head.init_args.convention=<exact_positive|tensorflow>",
        )
    return lines
