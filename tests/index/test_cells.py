"""K x K cell counts and the CSR layout of classes per cell."""

import torch

from lightning_sampled.index import build_cells, cell_of


def test_counts_offsets_and_members_group_classes_by_cell():
    class_cells = torch.tensor([3, 0, -1, 3, 1, 0, 3])
    cells = build_cells(class_cells, 4)
    assert cells.counts.tolist() == [2, 1, 0, 3]
    assert cells.offsets.tolist() == [0, 2, 3, 3, 6]
    assert cells.members.tolist() == [1, 5, 4, 0, 3, 6]
    for c in range(4):
        inside = cells.members[cells.offsets[c] : cells.offsets[c + 1]]
        assert torch.equal(inside, (class_cells == c).nonzero().squeeze(1))


def test_cell_ids_are_row_major():
    codes = torch.tensor([[0, 0], [0, 2], [2, 1]])
    assert cell_of(codes, 3).tolist() == [0, 2, 7]


def test_random_layout_is_a_permutation_of_indexed_classes():
    g = torch.Generator().manual_seed(0)
    class_cells = torch.randint(-1, 25, (1000,), generator=g)
    cells = build_cells(class_cells, 25)
    assert torch.equal(cells.counts, torch.bincount(class_cells[class_cells >= 0], minlength=25))
    assert torch.equal(cells.members.sort().values, (class_cells >= 0).nonzero().squeeze(1))
    assert torch.equal(class_cells[cells.members], class_cells[cells.members].sort().values)
