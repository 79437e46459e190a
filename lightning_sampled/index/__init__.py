"""Index structures that samplers and heads search: k-means, PQ / RQ codebooks, class trees."""
