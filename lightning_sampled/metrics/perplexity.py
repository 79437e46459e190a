"""``Perplexity`` with sum states, fed from logits, exact log-probabilities or NLL sums."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)

#: largest log-probability accepted as "<= 0" (rounding in a chunked log-sum-exp).
_LOG_PROB_TOLERANCE = 1e-4


class Perplexity(Metric):
    """``exp(total NLL / number of tokens)``, accumulated over batches.

    States (sums, reduced by summation under DDP): ``nll_sum`` (float64) and ``num_tokens``
    (long). Three ways to feed it, all through :meth:`update` (so ``forward`` and the torchmetrics
    bookkeeping work with each):

    - ``update(preds, target)``: logits ``[..., V]`` and class ids ``[...]``, as torchmetrics'
      ``torchmetrics.text.Perplexity`` (which it equals), targets equal to ``ignore_index``
      skipped.
    - ``update(log_prob=..., target=...)`` (or ``mask=`` in place of ``target``) or
      :meth:`update_from_log_prob`: per-token log-probabilities ``[...]``, e.g. a head's exact
      ``head.log_prob(z, target)``, which never materialises the ``[..., V]`` logits. Either
      ``target`` (the tokens whose target is ``ignore_index`` are skipped) or a bool ``mask``
      (the tokens to count) is required: a head's ``log_prob`` is ``0`` at ignored positions,
      which would otherwise count as tokens predicted with certainty and lower the perplexity
      silently.
    - ``update(nll_sum=..., num_tokens=...)`` or :meth:`update_from_nll`: a summed NLL and its token
      count, e.g. ``head.full_loss(z, y) * n``.

    Args:
        ignore_index: target id to skip (any int; ``None`` to skip none). ``-100`` by default,
            as the heads and ``F.cross_entropy`` (torchmetrics' own ``Perplexity`` defaults to
            ``None``).
        kwargs: passed to :class:`torchmetrics.Metric`.
    """

    is_differentiable: bool = False
    higher_is_better: bool = False
    full_state_update: bool = False
    plot_lower_bound: float = 1.0

    nll_sum: Tensor
    num_tokens: Tensor

    def __init__(self, ignore_index: int | None = -100, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if ignore_index is not None and (
            isinstance(ignore_index, bool) or not isinstance(ignore_index, int)
        ):
            raise ValueError(f"ignore_index must be an int or None, got {ignore_index!r}")
        self.ignore_index = ignore_index
        self.add_state(
            "nll_sum", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum"
        )
        self.add_state(
            "num_tokens", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum"
        )

    def update(
        self,
        preds: Tensor | None = None,
        target: Tensor | None = None,
        *,
        log_prob: Tensor | None = None,
        mask: Tensor | None = None,
        nll_sum: Tensor | float | None = None,
        num_tokens: Tensor | int | None = None,
    ) -> None:
        """Adds tokens given in exactly one of three forms.

        Args:
            preds: logits ``[..., V]`` (unnormalised; softmax is taken here in fp32).
            target: class ids ``[...]`` in ``[0, V)`` or ``ignore_index``, with ``preds`` or
                with ``log_prob``.
            log_prob: per-token log-probabilities ``[...]`` (each ``<= 0``), with ``target``
                or ``mask``.
            mask: bool ``[...]`` with ``log_prob`` in place of ``target``: the tokens to count.
            nll_sum: a summed negative log-likelihood (a float or scalar tensor, ``>= 0``).
            num_tokens: the number of tokens in ``nll_sum`` (an int or integer scalar tensor).

        Raises:
            ValueError: a mix of forms, bad shapes or dtypes, NaN, positive log-probabilities.
            IndexError: a target id outside ``[0, V)`` that is not ``ignore_index``.
        """
        given = {
            "logits": preds is not None or (target is not None and log_prob is None),
            "log_prob": log_prob is not None or mask is not None,
            "nll": nll_sum is not None or num_tokens is not None,
        }
        if sum(given.values()) != 1:
            raise ValueError(
                "update takes exactly one of (preds, target), (log_prob, target or mask) or "
                f"(nll_sum, num_tokens); got arguments for {[k for k, v in given.items() if v]}"
            )
        if given["logits"]:
            nll, count = self._from_logits(preds, target)
        elif given["log_prob"]:
            nll, count = self._from_log_prob(log_prob, self._counted(log_prob, target, mask))
        else:
            nll, count = self._from_nll(nll_sum, num_tokens)
        self.nll_sum += nll.to(self.nll_sum.device)
        self.num_tokens += count

    def update_from_log_prob(
        self, log_prob: Tensor, mask: Tensor | None = None, *, target: Tensor | None = None
    ) -> None:
        """Adds per-token log-probabilities ``[...]`` of the tokens that bool ``mask`` ``[...]``
        picks, or of those whose ``target`` ``[...]`` is not ``ignore_index`` (one of the two).

        Example: ``ppl.update_from_log_prob(head.log_prob(z, y), target=y)``.
        """
        self.update(log_prob=log_prob, mask=mask, target=target)

    def update_from_nll(self, nll_sum: Tensor | float, num_tokens: Tensor | int) -> None:
        """Adds a summed NLL (scalar, ``>= 0``) over ``num_tokens`` tokens."""
        self.update(nll_sum=nll_sum, num_tokens=num_tokens)

    def compute(self) -> Tensor:
        """Perplexity, a float32 scalar (NaN before any token, as torchmetrics)."""
        if int(self.num_tokens) == 0:
            return torch.full((), math.nan, dtype=torch.float32, device=self.nll_sum.device)
        return torch.exp(self.nll_sum / self.num_tokens).float()

    # -- the three input forms --------------------------------------------------------------------

    def _from_logits(self, preds: Tensor | None, target: Tensor | None) -> tuple[Tensor, int]:
        if not isinstance(preds, Tensor) or not isinstance(target, Tensor):
            raise ValueError("update(preds, target) needs both preds and target tensors")
        if not preds.is_floating_point() or preds.dim() < 1:
            raise ValueError(
                f"preds must be float logits [..., V], got dtype {preds.dtype} and shape "
                f"{tuple(preds.shape)}"
            )
        if tuple(target.shape) != tuple(preds.shape[:-1]):
            hint = (
                "; preds has target's shape: for per-token log-probabilities (a head's "
                "log_prob) call update(log_prob=..., target=...)"
                if tuple(target.shape) == tuple(preds.shape)
                else ""
            )
            raise ValueError(
                f"target must have shape {tuple(preds.shape[:-1])} (preds without its last dim), "
                f"got {tuple(target.shape)}{hint}"
            )
        if target.dtype not in _INT_DTYPES:
            raise ValueError(f"target must be an integer tensor, got dtype {target.dtype}")
        vocab = preds.shape[-1]
        logits = preds.reshape(-1, vocab)
        target = target.reshape(-1).to(logits.device).long()
        if self.ignore_index is not None:
            keep = target != self.ignore_index
            logits, target = logits[keep], target[keep]
        if target.numel():
            lo, hi = int(target.min()), int(target.max())
            if lo < 0 or hi >= vocab:
                extra = (
                    "" if self.ignore_index is None else f" (or ignore_index={self.ignore_index})"
                )
                raise IndexError(
                    f"target must be in [0, {vocab}){extra}, got {lo if lo < 0 else hi}"
                )
        if bool(torch.isnan(logits).any()) or bool(torch.isposinf(logits).any()):
            raise ValueError(f"preds contains NaN or +inf logits (shape {tuple(preds.shape)})")
        logits = logits.float()
        nll = torch.logsumexp(logits, dim=-1) - logits.gather(1, target[:, None]).squeeze(1)
        return nll.sum(dtype=torch.float64), target.numel()

    def _counted(
        self, log_prob: Tensor | None, target: Tensor | None, mask: Tensor | None
    ) -> Tensor | None:
        """The bool mask of the tokens to count in the log-probability form: ``mask``, or
        ``target != ignore_index``; exactly one of them must be given."""
        if (target is None) == (mask is None):
            raise ValueError(
                "update(log_prob=...) needs exactly one of target= (the tokens whose target is "
                "ignore_index are skipped) or mask= (the tokens to count): a head's log_prob is "
                "0 at ignored positions, which would count as tokens predicted with certainty; "
                "mask=torch.ones_like(log_prob, dtype=torch.bool) counts every token"
            )
        if mask is not None:
            return mask
        if not isinstance(target, Tensor) or target.dtype not in _INT_DTYPES:
            raise ValueError(
                f"target must be an integer tensor of class ids, got "
                f"{target.dtype if isinstance(target, Tensor) else type(target).__name__}"
            )
        if isinstance(log_prob, Tensor) and tuple(target.shape) != tuple(log_prob.shape):
            raise ValueError(
                f"target must have the shape of log_prob {tuple(log_prob.shape)}, "
                f"got {tuple(target.shape)}"
            )
        if self.ignore_index is None:
            return torch.ones(target.shape, dtype=torch.bool, device=target.device)
        return target != self.ignore_index

    def _from_log_prob(self, log_prob: Tensor | None, mask: Tensor) -> tuple[Tensor, int]:
        if not isinstance(log_prob, Tensor) or not log_prob.is_floating_point():
            raise ValueError(
                f"log_prob must be a float tensor of per-token log-probabilities, got "
                f"{log_prob.dtype if isinstance(log_prob, Tensor) else type(log_prob).__name__}"
            )
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            raise ValueError(
                f"mask must be a bool tensor, got "
                f"{mask.dtype if isinstance(mask, Tensor) else type(mask).__name__}"
            )
        if tuple(mask.shape) != tuple(log_prob.shape):
            raise ValueError(
                f"mask must have the shape of log_prob {tuple(log_prob.shape)}, "
                f"got {tuple(mask.shape)}"
            )
        log_prob = log_prob[mask.to(log_prob.device)].detach()
        if bool(torch.isnan(log_prob).any()):
            raise ValueError(f"log_prob contains NaN values (shape {tuple(log_prob.shape)})")
        if log_prob.numel() and float(log_prob.max()) > _LOG_PROB_TOLERANCE:
            raise ValueError(
                f"log_prob must hold log-probabilities (<= 0), got {float(log_prob.max())}; "
                f"pass NLL sums with update_from_nll"
            )
        return -log_prob.sum(dtype=torch.float64), log_prob.numel()

    def _from_nll(
        self, nll_sum: Tensor | float | None, num_tokens: Tensor | int | None
    ) -> tuple[Tensor, int]:
        if nll_sum is None or num_tokens is None:
            raise ValueError("update(nll_sum=..., num_tokens=...) needs both arguments")
        if isinstance(num_tokens, Tensor):
            if num_tokens.numel() != 1 or num_tokens.dtype not in _INT_DTYPES:
                raise ValueError(
                    f"num_tokens must be an int or an integer scalar tensor, got dtype "
                    f"{num_tokens.dtype} and shape {tuple(num_tokens.shape)}"
                )
            num_tokens = int(num_tokens)
        elif isinstance(num_tokens, bool) or not isinstance(num_tokens, int):
            raise ValueError(f"num_tokens must be an int, got {num_tokens!r}")
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        if isinstance(nll_sum, Tensor):
            if nll_sum.numel() != 1 or not nll_sum.is_floating_point():
                raise ValueError(
                    f"nll_sum must be a float or a float scalar tensor, got dtype {nll_sum.dtype} "
                    f"and shape {tuple(nll_sum.shape)}"
                )
            value = nll_sum.detach().reshape(()).double()
        elif isinstance(nll_sum, (int, float)) and not isinstance(nll_sum, bool):
            value = torch.tensor(float(nll_sum), dtype=torch.float64)
        else:
            raise ValueError(f"nll_sum must be a float or a scalar tensor, got {nll_sum!r}")
        v = float(value)
        if math.isnan(v) or v < -_LOG_PROB_TOLERANCE:
            raise ValueError(f"nll_sum must be a non-negative NLL, got {v}")
        if num_tokens == 0 and v != 0.0:
            raise ValueError(f"nll_sum must be 0 when num_tokens is 0, got {v}")
        return value, num_tokens
