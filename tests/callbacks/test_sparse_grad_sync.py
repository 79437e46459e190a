"""``SparseGradSync``'s choice of tables and its single-process no-op; its two-process run is
``tests/integration/test_lazy_adam_lightning.py`` (``dense``), its reduction
``tests/optim/test_sparse_all_reduce.py``."""

from torch import nn

from lightning_sampled.callbacks import SparseGradSync
from lightning_sampled.callbacks.sparse_grad_sync import sparse_tables
from lightning_sampled.heads import FullSoftmaxHead, SampledSoftmaxHead
from lightning_sampled.samplers import UniformSampler


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.items = nn.Embedding(20, 4, sparse=True)
        self.head = SampledSoftmaxHead(20, 4, UniformSampler(20), 3, sparse_grad=True,
                                       weight=self.items.weight)  # fmt: skip
        self.dense_head = SampledSoftmaxHead(7, 4, UniformSampler(7), 3)  # sparse_grad off
        self.exact = FullSoftmaxHead(9, 4)
        self.lookup = nn.Embedding(5, 4, sparse=True)
        self.dense_lookup = nn.Embedding(6, 4)


def test_the_sparse_tables_are_each_row_sparse_table_once():
    module = Tied()
    assert [t.shape[0] for t in sparse_tables(module)] == [20, 5]
    module.dense_head.sparse_grad = True
    assert [t.shape[0] for t in sparse_tables(module)] == [20, 7, 5]


def test_outside_torch_distributed_it_leaves_the_module_to_ddp_and_does_nothing():
    module = Tied()
    callback = SparseGradSync()
    callback.setup(None, module, "fit")
    assert callback.tables == [] and not hasattr(module, "_ddp_params_and_buffers_to_ignore")
