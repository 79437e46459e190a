"""The papers' numbers the report sets beside ours, as printed."""

from __future__ import annotations

#: the MIDX paper's Table 4, LSTM on Penntreebank, test perplexity, as printed
PAPER_TABLE4 = {
    "full": "109.1965",
    "uniform": "159.9701",
    "unigram": "139.7837",
    "midx_pq": "121.5477",
    "midx_rq": "117.8317",
    "midx_learn": "112.30",  # exp(4.7212): Table 5 prints MIDX-Learn-rq as log perplexity
}
#: the MIDX paper's Table 7, MovieLens-10M (it has no MovieLens-1M row): N@10, N@50, R@10, R@50
PAPER_TABLE7 = {
    "SASRec": {
        "full": ("0.0922", "0.1440", "0.1738", "0.4114"),
        "uniform": ("0.0840", "0.1371", "0.1623", "0.4058"),
        "unigram": ("0.0885", "0.1406", "0.1705", "0.4100"),
        "midx_pq": ("0.0899", "0.1419", "0.1721", "0.4102"),
        "midx_rq": ("0.0916", "0.1433", "0.1752", "0.4125"),
    },
    "GRU4Rec": {
        "full": ("0.1358", "0.1892", "0.2365", "0.4808"),
        "uniform": ("0.1224", "0.1797", "0.2270", "0.4882"),
        "unigram": ("0.1261", "0.1818", "0.2304", "0.4847"),
        "midx_pq": ("0.1336", "0.1873", "0.2355", "0.4802"),
        "midx_rq": ("0.1337", "0.1877", "0.2355", "0.4817"),
    },
}
#: the AdaptiveSoftmax paper's Figure 1 average gains (delta 10%, eps 30%), as printed
PAPER_FIGURE1_GAIN = {"a": "3.953", "b": "29.039"}
