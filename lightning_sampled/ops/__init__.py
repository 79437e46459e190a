"""Functions of tensors below the heads: the exact softmax in class chunks (:mod:`.chunked`,
:mod:`.fused`), the checks of inputs and the reductions (:mod:`.inputs`), the estimator
conventions (:mod:`.conventions`), the sampled softmax on logits (:mod:`.losses`) and the batch's
targets as candidates (:mod:`.in_batch`). :mod:`lightning_sampled.functional` is their public
face; the heads call them too."""
