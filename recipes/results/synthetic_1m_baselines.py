"""Reference points for ``synthetic_1m.md``: a popularity ranking and an approximate Bayes ranking
that knows the generator, on the same 2,000 validation / test users, exact over 1M items, seen
items excluded. Run: ``python recipes/results/synthetic_1m_baselines.py`` (about a minute)."""

import numpy as np

from recipes.data.synthetic import SyntheticSpec, generate

USERS = 2_000


def ndcg_recall(ranked: np.ndarray, target: np.ndarray) -> tuple[float, float]:
    """NDCG@10 and Recall@10 of ``ranked`` ``[U, 10]`` against one ``target`` ``[U]`` each."""
    hit = ranked == target[:, None]
    gain = np.where(hit.any(1), 1 / np.log2(hit.argmax(1) + 2), 0)
    return float(gain.mean()), float(hit.any(1).mean())


def report(split: str, name: str, ranked: np.ndarray, target: np.ndarray) -> None:
    ndcg, recall = ndcg_recall(ranked, target)
    print(f"{split} {name}: NDCG@10 {ndcg:.4f}  Recall@10 {recall:.4f}")


def main() -> None:
    spec = SyntheticSpec()  # the defaults = sasrec_synthetic-1m.yaml's data
    seqs, world = generate(spec)
    counts = np.bincount(seqs[:, :-2].ravel(), minlength=spec.num_items + 1)  # training counts
    counts[0] = 0
    popular = np.argsort(-counts)[:200]
    order = np.argsort(world.cluster[1:], kind="stable") + 1
    offsets = np.searchsorted(world.cluster[order], np.arange(spec.num_clusters + 1))
    move = 1 - spec.stay - spec.jump
    for split, cut in (("validation", 2), ("test", 1)):
        history, target = seqs[:USERS, : spec.seq_len - cut], seqs[:USERS, spec.seq_len - cut]
        ranked = np.array([[i for i in popular if i not in set(h)][:10] for h in history])
        report(split, "popularity", ranked, target)
        # P(cluster | recent items) from the planted transitions (jumps: popularity only), then
        # within a cluster p_i * exp(<v_i, q> / T), normalised per cluster
        out = []
        for h in history:
            recent = h[-spec.window :]
            query = world.vectors[recent].mean(0)
            mass: dict[int, float] = {}
            for c in world.cluster[recent]:
                mass[c] = mass.get(c, 0) + spec.stay / len(recent)
                for k in world.neighbors[c]:
                    mass[k] = mass.get(k, 0) + move / spec.num_neighbors / len(recent)
            items, scores = [], []
            for k, p in mass.items():
                it = order[offsets[k] : offsets[k + 1]]
                a = np.log(world.popularity[it]) + world.vectors[it] @ query / spec.temperature
                e = np.exp(a - a.max())
                items.append(it)
                scores.append(p * e / e.sum() + spec.jump * world.popularity[it])
            items, score = np.concatenate(items), np.concatenate(scores)
            score[np.isin(items, h)] = -1
            out.append(items[np.argsort(-score)[:10]])
        report(split, "generator", np.array(out), target)


if __name__ == "__main__":
    main()
