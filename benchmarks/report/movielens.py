"""Section 4: SASRec and GRU4Rec on MovieLens-1M beside the MIDX paper's Table 7."""

from __future__ import annotations

from pathlib import Path

from .common import (
    HEADS,
    Inputs,
    Provenance,
    divide,
    markdown_table,
    missing_heads,
    not_measured,
    number,
    ratio,
    read_json,
)
from .papers import PAPER_TABLE7
from .quality import Quality, comparison_sentences, quality_table

ML1M = "recipes/RESULTS.md, MovieLens-1M section"
#: recipe JSONs on MovieLens-1M: file stem, model, head key override, where their provenance is
ML1M_RUNS = (
    ("sasrec_ml-1m_rerun", "SASRec", None, f"{ML1M}, 'current MIDX draw and defaults': f9f125d"),
    ("gru4rec_ml-1m_rerun", "GRU4Rec", None, f"{ML1M}, 'current MIDX draw and defaults': f9f125d"),
    ("sasrec_ml-1m", "SASRec", None, f"{ML1M}: code at 77fdf9c / c0731a7, TensorFlow convention"),
    ("gru4rec_ml-1m", "GRU4Rec", None, f"{ML1M}: code at 77fdf9c / c0731a7, TensorFlow convention"),
    ("sasrec_ml-1m_20_epochs", "SASRec", None, f"{ML1M}, 'SASRec, 20 epochs' (file of b04b93a)"),
    ("sasrec_ml-1m_in_batch", "SASRec", None, f"{ML1M}, 'in-batch and mixed negatives': ce5b199"),
    ("sasrec_ml-1m_tapas", "SASRec", None, f"{ML1M}, 'TAPAS and One-vs-Each': f8ca01a + work tree"),
    ("sasrec_ml-1m_ove", "SASRec", None, f"{ML1M}, 'TAPAS and One-vs-Each': 14dbed2 + work tree"),
    (
        "sasrec_ml-1m_uniform_shared",
        "SASRec",
        "uniform_shared",
        f"{ML1M}, 'TAPAS and One-vs-Each': 16fef5b + work tree",
    ),
    ("sasrec_ml-1m_cane", "SASRec", None, "recipes/RESULTS.md, CANE on SASRec paragraph: f9f125d"),
    ("gru4rec_ml-1m_table7", "GRU4Rec", None, f"{ML1M}, 'GRU4Rec, the paper's Table 7 heads'"),
    (
        "gru4rec_ml-1m_table7_midx",
        "GRU4Rec",
        None,
        f"{ML1M}, 'GRU4Rec, the paper's Table 7 heads'",
    ),
    ("sasrec_ml-1m_table7_full", "SASRec", None, f"{ML1M}, 'SASRec, unigram and MIDX-pq'"),
    ("sasrec_ml-1m_table7_unigram", "SASRec", None, f"{ML1M}, 'SASRec, unigram and MIDX-pq'"),
    ("sasrec_ml-1m_table7_midx_pq", "SASRec", None, f"{ML1M}, 'SASRec, unigram and MIDX-pq'"),
)


def movielens_rows(recipes: Path) -> list[Quality]:
    rows = []
    for stem, model, head, source in ML1M_RUNS:
        for r in read_json(recipes / f"{stem}.json") or []:
            rows.append(
                Quality(
                    task=model,
                    head=head or r["head"],
                    epochs=int(r["epochs"]),
                    metric="test NDCG@10",
                    value=float(r["test/ndcg@10"]),
                    columns={
                        "test Recall@10": number(r.get("test/recall@10")),
                        **{
                            f"test {name}@50": number(r[f"test/{name.lower()}@50"])
                            for name in ("NDCG", "Recall")
                            if f"test/{name.lower()}@50" in r
                        },
                        "s / epoch": number(r.get("seconds/epoch")),
                    },
                    source=f"{source}; seed 0",
                )
            )
    return rows


def section_movielens(inputs: Inputs) -> list[str]:
    lines = ["## 4. MovieLens-1M, the MIDX paper's Table 7", ""]
    rows = movielens_rows(inputs.recipes)
    if not rows:
        return lines + not_measured(
            "SASRec and GRU4Rec on MovieLens-1M",
            "python -m recipes.compare --config recipes/configs/sasrec_ml-1m.yaml --heads full "
            "uniform midx_rq --epochs 10 --seed 0 --threads 1 --out recipes/results/sasrec_ml-1m",
        )
    prov = Provenance()

    def paper(r: Quality | None) -> list[str]:
        if r is None:
            return ["paper ML-10M N@10", "paper vs full", "paper N@50", "paper R@50"]
        theirs = PAPER_TABLE7.get(r.task, {}).get(r.head)
        if not theirs:
            return ["—", "—", "—", "—"]
        return [theirs[0], ratio(paper_ratio(r)), theirs[1], theirs[3]]

    def paper_ratio(r: Quality) -> float | None:
        table = PAPER_TABLE7.get(r.task, {})
        if r.head not in table:
            return None
        return divide(number(table[r.head][0]), number(table["full"][0]))

    lines += [
        "Test NDCG / Recall at 10 (and at 50 where the run logged it) ranking all 3,706 items, "
        "seen items excluded, leave-one-out, "
        "the best-validation checkpoint; 100 negatives per query unless the head says otherwise. "
        "Command: `python -m recipes.compare --config recipes/configs/<sasrec|gru4rec>_ml-1m.yaml "
        "--heads <heads> --epochs <epochs> --seed 0 --threads 1 --out recipes/results/<file>`. "
        "The paper's Table 7 has no MovieLens-1M rows: beside ours are its MovieLens-10M numbers "
        "(so compare the ratios to full softmax, not the values).",
        "",
        *quality_table(rows, prov, paper),
        comparison_sentences(rows, paper_ratio, lower=False)
        + " Why: with 3,707 classes, 100 negatives per query cover much of the catalogue, so "
        "every per-query head stays near the full softmax; heads that score fewer classes (shared "
        "negatives) or see few targets among their candidates (CANE) fall behind at equal epochs.",
        "",
        *(missing_heads({r.head for r in rows if r.task == m}, m) for m in PAPER_TABLE7),
        "",
        "The paper's Table 7, MovieLens-10M (N: NDCG, R: Recall):",
        "",
        *markdown_table(
            ["model", "sampler", "N@10", "N@50", "R@10", "R@50"],
            [
                [model, HEADS[h], *values]
                for model, table in PAPER_TABLE7.items()
                for h, values in table.items()
            ],
        ),
        *(
            []
            if any("test NDCG@50" in r.columns for r in rows)
            else not_measured(
                "NDCG@50 / Recall@50 (the MovieLens-1M configs log both cutoffs)",
                "python -m recipes.compare --config recipes/configs/gru4rec_ml-1m.yaml --heads "
                "full uniform unigram midx_pq midx_rq --epochs 10 --seed 0 --threads 1 --out "
                "recipes/results/gru4rec_ml-1m_table7",
            )
        ),
        *prov.lines(),
        *inputs.plots(
            inputs.recipes / "sasrec_ml-1m.png",
            inputs.recipes / "gru4rec_ml-1m.png",
            inputs.recipes / "sasrec_ml-1m_in_batch.png",
        ),
    ]
    return lines
