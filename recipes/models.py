"""SASRec, GRU4Rec, the MIDX paper's LSTM language model and a small GPT, each with any head."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .module import LanguageModel, SequentialRecommender
from .towers import ItemTower, TowerSpec


def item_embedding(num_items: int, dim: int) -> nn.Embedding:
    """An item table ``[N, D]`` with padding row 0 and ``N(0, 1 / D)`` rows, so that the tied
    head's initial logits are of order one."""
    emb = nn.Embedding(num_items, dim, padding_idx=0)
    nn.init.normal_(emb.weight, std=dim**-0.5)
    with torch.no_grad():
        emb.weight[0].zero_()
    return emb


class TiedRecommender(SequentialRecommender):
    """A recommender whose head is tied to its item embedding ``item_emb``, or, for a head built
    with ``sharded: true``, owns the item table and looks the inputs up itself (``head.embed``,
    a collective over the ranks that hold the rows; ``item_emb`` is then ``None``), or, with
    ``item_tower``, computes every item vector, inputs' and candidates', from item features
    (:class:`~recipes.towers.ItemTower`, the head's ``candidate_encoder``; the data module's
    ``item_features`` are loaded at setup).

    Args:
        item_tower: the tower's sizes, or ``None`` for a table of items.
        **kwargs: of :class:`SequentialRecommender`.
    """

    item_emb: nn.Embedding | None
    item_tower: ItemTower | None

    def __init__(self, *args: Any, item_tower: TowerSpec | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if item_tower is not None and self.shards_table():
            raise ValueError("item_tower computes the item vectors: the head cannot be sharded")
        self.tower_spec = item_tower

    def new_item_embedding(self, dim: int) -> nn.Embedding | None:
        """The item embedding, or ``None`` where the head will own a sharded table or a tower
        gives the vectors (then built here as ``item_tower``)."""
        spec = self.tower_spec
        self.item_tower = (
            None
            if spec is None
            else ItemTower(
                self.num_classes,
                dim,
                spec.feature_dim,
                spec.num_categories,
                self.class_counts,
                spec.num_buckets,
            )
        )
        if self.shards_table() or spec is not None:
            return None
        return item_embedding(self.num_classes, dim)

    def tie_head(self, dim: int) -> None:
        """Builds the head, tied to ``item_emb`` (its lookup row-sparse with a
        ``sparse_grad`` head), scoring ``item_tower``'s vectors, or owning the sharded table,
        initialised as ``item_emb`` is."""
        if self.item_tower is not None:
            self.head = self.build_head(dim, candidate_encoder=self.item_tower)
        elif self.item_emb is None:  # created at the split (ShardedTables), N(0, 1 / D) too
            self.head = self.build_head(dim, init_std=dim**-0.5)
        else:
            self.head = self.build_head(dim, self.item_emb.weight)
            self.sparse_lookup(self.item_emb)

    def setup(self, stage: str) -> None:
        """Loads the data module's ``item_features`` into the tower, if there is one (a caller
        that trains without a data module loads them itself: ``item_tower.load``)."""
        super().setup(stage)
        if self.item_tower is None:
            return
        features = getattr(self.trainer.datamodule, "item_features", None)
        if features is not None:
            self.item_tower.load(features)
        elif not self.item_tower.loaded:
            raise ValueError(
                f"item_tower needs item features: {type(self.trainer.datamodule).__name__} has "
                f"no item_features and none were loaded (item_tower.load)"
            )

    def items(self, ids: Tensor) -> Tensor:
        """Item vectors ``[*ids.shape, D]`` (the padding item 0: zeros, or the tower's)."""
        if self.item_tower is not None:
            return self.item_tower(ids)
        return self.head.embed(ids) if self.item_emb is None else self.item_emb(ids)


class SASRec(TiedRecommender):
    """SASRec (Kang and McAuley, 2018): item and learned position embeddings, causal
    self-attention blocks, output head tied to the item embeddings.

    Inputs are left-padded with item 0, so the last position always holds the latest item.

    Args:
        dim: ``D``, the embedding width.
        num_blocks: self-attention blocks.
        num_heads: attention heads per block.
        dropout: dropout rate.
        max_len: the longest input (the number of learned positions); must be at least the data
            module's ``max_len``.
        **kwargs: of :class:`SequentialRecommender` (``num_classes``, ``head``, ``sampler``, ...).
    """

    def __init__(
        self,
        *args: Any,
        dim: int = 64,
        num_blocks: int = 2,
        num_heads: int = 1,
        dropout: float = 0.2,
        max_len: int = 200,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        self.item_emb = self.new_item_embedding(dim)
        self.pos_emb = nn.Embedding(max_len, dim)
        self.dropout = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(
            dim, num_heads, dim, dropout, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, num_blocks, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.tie_head(dim)

    def encode(self, inputs: Tensor) -> Tensor:
        """``[B, L]`` item ids (0 = padding) to ``[B, L, D]`` states."""
        length = inputs.shape[1]
        if length > self.pos_emb.num_embeddings:
            raise ValueError(
                f"input length {length} exceeds SASRec max_len={self.pos_emb.num_embeddings}"
            )
        keep = (inputs != 0).unsqueeze(-1)
        x = self.items(inputs) * self.head.dim**0.5
        x = self.dropout(x + self.pos_emb.weight[:length]) * keep
        causal = nn.Transformer.generate_square_subsequent_mask(length, device=inputs.device)
        return self.norm(self.blocks(x, mask=causal, is_causal=True)) * keep


class GRU4Rec(TiedRecommender):
    """GRU4Rec: item embedding, GRU, output head (tied to the item embedding by default).

    Args:
        dim: embedding and hidden width.
        num_layers: GRU layers.
        dropout: dropout on the embeddings.
        tie_weights: share the item embedding with the head's class table.
        **kwargs: of :class:`SequentialRecommender`.
    """

    def __init__(
        self,
        *args: Any,
        dim: int = 64,
        num_layers: int = 1,
        dropout: float = 0.1,
        tie_weights: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if not tie_weights and (self.shards_table() or self.tower_spec is not None):
            raise ValueError(
                "a sharded head or an item_tower needs tie_weights=True (one source of item "
                "vectors for the inputs and the head)"
            )
        self.item_emb = self.new_item_embedding(dim)
        self.dropout = nn.Dropout(dropout)
        self.gru = nn.GRU(dim, dim, num_layers, batch_first=True)
        if tie_weights:
            self.tie_head(dim)
        else:
            self.head = self.build_head(dim)
            self.sparse_lookup(self.item_emb)

    def encode(self, inputs: Tensor) -> Tensor:
        """``[B, L]`` item ids to ``[B, L, D]`` states."""
        return self.gru(self.dropout(self.items(inputs)))[0]


class LSTMLanguageModel(LanguageModel):
    """The MIDX paper's Section 6.2.1 LSTM: embedding 200, 2 layers of hidden 128, dropout.

    With ``tie_weights`` the LSTM output is projected 128 -> 200 and the head shares the word
    embedding; otherwise the head has its own ``[N, 128]`` table.

    Args:
        embedding_dim: word embedding width.
        hidden_dim: LSTM width.
        num_layers: LSTM layers.
        dropout: dropout on the embeddings, between layers and on the outputs.
        tie_weights: share the word embedding with the head's class table.
        **kwargs: of :class:`LanguageModel`.
    """

    def __init__(
        self,
        *args: Any,
        embedding_dim: int = 200,
        hidden_dim: int = 128,
        num_layers: int = 2,
        dropout: float = 0.2,
        tie_weights: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.word_emb = nn.Embedding(self.num_classes, embedding_dim)
        nn.init.uniform_(self.word_emb.weight, -0.1, 0.1)
        self.dropout = nn.Dropout(dropout)
        self.lstm = nn.LSTM(
            embedding_dim, hidden_dim, num_layers, batch_first=True, dropout=dropout
        )
        if tie_weights:
            self.project: nn.Module = nn.Linear(hidden_dim, embedding_dim)
            self.head = self.build_head(embedding_dim, self.word_emb.weight)
            self.sparse_lookup(self.word_emb)
        else:
            self.project = nn.Identity()
            self.head = self.build_head(hidden_dim)

    def encode(self, inputs: Tensor) -> Tensor:
        """``[B, T]`` token ids to ``[B, T, D]`` states (``D`` = 200 tied, 128 untied)."""
        out = self.lstm(self.dropout(self.word_emb(inputs)))[0]
        return self.project(self.dropout(out))


class GPTLanguageModel(LanguageModel):
    """A small GPT-2 trained from scratch: Hugging Face's ``GPT2Model`` (token and learned
    position embeddings, causal self-attention blocks, final layer norm) built from a config,
    without Hugging Face's LM head: its hidden states go to the recipe's head, tied to the token
    embedding ``wte`` (as GPT-2 ties its own), so no ``[B, L, V]`` logits are built in training.

    Args:
        n_layer: transformer blocks.
        n_embd: ``D``, the width (of the embeddings and the head).
        n_head: attention heads per block.
        n_positions: learned positions, the longest input (at least the data's ``seq_len``).
        dropout: GPT-2's residual, embedding and attention dropout.
        **kwargs: of :class:`LanguageModel`.
    """

    def __init__(
        self,
        *args: Any,
        n_layer: int = 2,
        n_embd: int = 256,
        n_head: int = 4,
        n_positions: int = 64,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if self.shards_table():
            raise ValueError("GPTLanguageModel does not split its token table (sharded: true)")
        from transformers import GPT2Config, GPT2Model

        config = GPT2Config(
            vocab_size=self.num_classes,
            n_positions=n_positions,
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=n_head,
            resid_pdrop=dropout,
            embd_pdrop=dropout,
            attn_pdrop=dropout,
        )
        self.transformer = GPT2Model(config)
        self.head = self.build_head(n_embd, self.transformer.wte.weight)
        self.sparse_lookup(self.transformer.wte)

    def encode(self, inputs: Tensor) -> Tensor:
        """``[B, T]`` token ids to ``[B, T, D]`` final hidden states (after ``ln_f``)."""
        positions = self.transformer.config.n_positions
        if inputs.shape[1] > positions:
            raise ValueError(f"input length {inputs.shape[1]} exceeds n_positions={positions}")
        return self.transformer(input_ids=inputs, use_cache=False).last_hidden_state
