"""Exact softmax over a class table, computed in class chunks.

Nothing here holds more than ``[T, chunk_size]`` logits: the cross-entropy is a custom autograd
function that keeps only the per-row log-normaliser from its forward pass and recomputes each
chunk's logits in backward (the approach of Cut Cross-Entropy and Liger's fused linear
cross-entropy). The log-sum-exp and all gradient accumulators are fp32 whatever the compute dtype.

The functions here take the queries as the head scores them (``OutputHead.score_queries``: already
normalised and divided by the temperature) and, with ``normalize=True``, score the unit class
vectors :func:`scored_rows`, normalised one chunk at a time: no ``[N, D]`` copy of the table.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from ..sharding.collectives import RankReduction


def class_chunks(num_classes: int, chunk_size: int) -> Iterator[tuple[int, int]]:
    """Yields ``(start, end)`` bounds that cover ``[0, num_classes)`` in steps of ``chunk_size``."""
    for start in range(0, num_classes, chunk_size):
        yield start, min(start + chunk_size, num_classes)


#: default size of one ``[T, C]`` block of logits, in elements (64 MiB in fp32)
MAX_BLOCK_ELEMENTS = 2**24


def resolve_chunk_size(chunk_size: int | None, num_rows: int, num_classes: int) -> int:
    """Classes per chunk: ``chunk_size`` if given, else as many as keep a ``[T, C]`` block within
    :data:`MAX_BLOCK_ELEMENTS` (at least 1024: fewer make the matmuls inefficient)."""
    if chunk_size is None:
        chunk_size = max(1024, MAX_BLOCK_ELEMENTS // max(num_rows, 1))
    return min(chunk_size, num_classes)


def positions_per_gather(num_candidates: int, dim: int) -> int:
    """Positions whose per-query candidate vectors ``[t, num_candidates, D]`` fit one block of
    :data:`MAX_BLOCK_ELEMENTS` (at least 1): how many a sampled head gathers at a time."""
    return max(1, MAX_BLOCK_ELEMENTS // max(num_candidates * dim, 1))


def positions_per_block(num_columns: int, gathered_per_row: int, dim: int) -> int:
    """Rows a sampled head scores at a time (at least 1): as many as keep two ``[t,
    gathered_per_row, D]`` tensors (the gathered vectors and their gradient) and eight ``[t,
    num_columns]`` ones (the logits, their corrections and concatenation, the softmax and its
    gradient, as measured) within :data:`MAX_BLOCK_ELEMENTS`, the exact head's block; so a
    block's gather is one gather (:func:`positions_per_gather`), and the sampled heads' peak
    memory stays below the exact head's (``benchmarks/results/hf_causal_lm.md``)."""
    per_row = 2 * gathered_per_row * dim + 8 * num_columns
    return max(1, MAX_BLOCK_ELEMENTS // max(per_row, 1))


def row_blocks(num_rows: int, step: int, align: int = 1) -> list[slice]:
    """Slices of at most ``step`` rows covering ``[0, num_rows)``, the short one first, each
    starting at a multiple of ``align`` (``step`` rounded down to one, at least ``align``: the
    groups of rows that share candidates, :func:`grouped_logits`, stay whole): a head that
    scores blocks under activation checkpointing runs the last block without it (its saved
    tensors are the one block that checkpointing holds anyway), so the last is a whole block."""
    units, per_block = -(-num_rows // align), max(1, step // align)
    short = units % per_block
    starts = [0, *range(short, units, per_block)] if short else list(range(0, units, per_block))
    ends = [*starts[1:], units]
    return [
        slice(start * align, min(end * align, num_rows))
        for start, end in zip(starts, ends, strict=True)
    ]


def groups_of(rows: slice, group_size: int) -> slice:
    """The groups of ``group_size`` consecutive rows that the rows ``rows`` cover (a block of
    :func:`row_blocks` aligned to the groups): ``[start / g, ceil(stop / g))``."""
    return slice(rows.start // group_size, -(-rows.stop // group_size))


def compute_dtype(z: Tensor) -> torch.dtype:
    """The matmul dtype: the autocast dtype when autocast is on for ``z``'s device; otherwise
    fp32 for fp16 / bf16 ``z`` (half-precision products outside autocast lose accuracy, and fp16
    overflows) and ``z``'s own dtype for fp32 / fp64."""
    device_type = z.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return torch.float32 if z.dtype in (torch.float16, torch.bfloat16) else z.dtype


def widened(x: Tensor) -> Tensor:
    """``x`` in fp32, or in its own dtype when that is wider (fp64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def unit_rows(x: Tensor) -> Tensor:
    """``x / ||x||`` along the last dim (``F.normalize``: an all-zero row stays zero), computed in
    :func:`widened` precision so that half-precision squares neither overflow nor round away;
    differentiable, also under autocast. ``[..., D]`` in, ``[..., D]`` fp32 (fp64 for fp64 ``x``)
    out."""
    with torch.autocast(x.device.type, enabled=False):
        return F.normalize(widened(x), dim=-1)


def scored_rows(rows: Tensor, normalize: bool) -> Tensor:
    """Class vectors ``[..., D]`` as the heads score them: :func:`unit_rows` when ``normalize``,
    else ``rows`` unchanged. Every head reads class vectors through this function."""
    return unit_rows(rows) if normalize else rows


def in_compute_dtype(z: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
    """Queries ``z`` ``[..., D]`` and class vectors ``rows`` ``[..., D]`` cast to
    :func:`compute_dtype` of ``z``, so that their products neither mix dtypes nor run in half
    precision outside autocast."""
    dtype = compute_dtype(z)
    return z.to(dtype), rows.to(dtype)


def gathered_logits(z: Tensor, rows: Tensor, bias: Tensor | None) -> Tensor:
    """fp32 logits ``z . v_c + b_c`` of queries ``z`` ``[T, D]`` against gathered class vectors
    ``rows``: ``[M, D]`` (the same classes for every query) or ``[T, M, D]`` (per query), with
    their ``bias`` (``[M]`` / ``[T, M]``) or ``None``; ``[T, M]``, the products in
    :func:`compute_dtype` of ``z``."""
    z, rows = in_compute_dtype(z, rows)
    if rows.dim() == 2:
        logits = (z @ rows.T).float()
    else:
        logits = torch.bmm(rows, z[:, :, None]).squeeze(-1).float()
    return logits if bias is None else logits + bias.float()


def grouped_logits(z: Tensor, rows: Tensor, bias: Tensor | None, group_size: int) -> Tensor:
    """fp32 logits ``[T, K]`` of queries ``z`` ``[T, D]`` against the ``K`` class vectors of
    their group, each ``group_size`` consecutive queries one group (the last one the rest):
    ``rows`` ``[G, K, D]`` (``G = ceil(T / group_size)``), ``bias`` ``[G, K]`` or ``None``. One
    ``[g, D] x [D, K]`` product per group, in :func:`compute_dtype` of ``z``."""
    num_rows, (num_groups, num_candidates, dim) = z.shape[0], rows.shape
    z, rows = in_compute_dtype(z, rows)
    padded = F.pad(z, (0, 0, 0, num_groups * group_size - num_rows))  # the last group's rest
    logits = torch.bmm(padded.view(num_groups, group_size, dim), rows.transpose(1, 2)).float()
    if bias is not None:
        logits = logits + bias.float()[:, None, :]
    return logits.reshape(num_groups * group_size, num_candidates)[:num_rows]


def chunk_logits(
    z: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    start: int,
    end: int,
    padding_idx: int | None,
    dtype: torch.dtype,
    workspace: Tensor | None = None,
    *,
    normalize: bool = False,
) -> Tensor:
    """fp32 logits ``[T, end - start]`` of rows ``z`` ``[T, D]`` against classes ``[start, end)``.

    The matmul runs in ``dtype``; the padding class (if inside the chunk) gets ``-inf``. With
    ``normalize`` the chunk's class vectors are :func:`unit_rows` first. With a flat fp32
    ``workspace`` of at least ``T * (end - start)`` elements the logits are written into it, so a
    loop over chunks allocates (and page-faults) its ``[T, C]`` block only once; the result is
    then not differentiable. Without a workspace it is.
    """
    z_c, w_c = z.to(dtype), scored_rows(weight[start:end], normalize).to(dtype)
    with torch.autocast(z.device.type, enabled=False):
        if workspace is None:  # differentiable
            logits = (z_c @ w_c.T).float()
        else:
            logits = workspace[: z.shape[0] * (end - start)].view(z.shape[0], end - start)
            if dtype == torch.float32:
                torch.mm(z_c, w_c.T, out=logits)
            else:
                logits.copy_(z_c @ w_c.T)
    if bias is not None:
        logits.add_(bias[start:end].float())
    if padding_idx is not None and start <= padding_idx < end:
        logits[:, padding_idx - start] = -math.inf
    return logits


def new_workspace(z: Tensor, num_classes: int, chunk_size: int) -> Tensor:
    """A flat fp32 buffer for one ``[T, chunk_size]`` block of logits."""
    return torch.empty(z.shape[0] * min(chunk_size, num_classes), device=z.device)


def exp_shifted_(logits: Tensor, shift: Tensor, out: Tensor | None = None) -> Tensor:
    """In place: ``logits <- exp(logits - shift[:, None])``, or into ``out`` (``logits``'
    shape) where given, ``logits`` then unchanged; rows whose shift is ``-inf`` give 0."""
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    return torch.sub(logits, shift[:, None], out=logits if out is None else out).exp_()


#: logits of shared candidates (:class:`ChunkedLogSumExp`) kept from forward for backward, in
#: elements (8 MiB in fp32): the columns of whole chunks up to it skip backward's recomputation
#: (a product and two passes), within issue 52's memory target at the recommender shapes
KEPT_LOGITS_ELEMENTS = 2**21


def kept_columns(num_rows: int, num_columns: int, chunk_size: int) -> int:
    """How many leading columns (whole chunks of ``chunk_size``) of a ``[T, C]`` block of
    logits fit :data:`KEPT_LOGITS_ELEMENTS`: all ``C``, some chunks, or none."""
    if num_rows * num_columns <= KEPT_LOGITS_ELEMENTS:
        return num_columns
    return min(num_columns, KEPT_LOGITS_ELEMENTS // max(num_rows * chunk_size, 1) * chunk_size)


def kept_chunk(kept: Tensor, num_rows: int, start: int, end: int) -> Tensor:
    """The ``[T, end - start]`` logits of the chunk ``[start, end)`` in the flat buffer of
    :func:`chunked_softmax_sums` (each chunk's block contiguous, in order)."""
    return kept[num_rows * start : num_rows * end].view(num_rows, end - start)


def shift_cells_(
    logits: Tensor, start: int, end: int, cell_column: Tensor | None, cell_shift: Tensor | None
) -> Tensor:
    """In place: adds ``cell_shift[t]`` (fp32 ``[T]``, ``-inf`` allowed) to the logit of row
    ``t`` in column ``cell_column[t]`` (long ``[T]``, a class id; negative: none) where that
    class is in the chunk ``[start, end)`` of ``logits`` ``[T, end - start]``: one cell per row,
    such as an in-batch candidate that is the row's own target. No-op when ``cell_column`` is
    ``None``."""
    if cell_column is None:
        return logits
    inside = (cell_column >= start) & (cell_column < end)
    local = (cell_column - start).clamp(0, end - start - 1)
    rows = torch.arange(logits.shape[0], device=logits.device)
    shift = torch.where(inside, cell_shift.to(logits.dtype), 0.0)
    return logits.index_put_((rows, local), shift, accumulate=True)


def row_sums_without_padding(
    logits: Tensor, start: int, end: int, padding_idx: int | None
) -> Tensor:
    """Sums ``[T]`` of a chunk's logits ``[T, end - start]`` over its classes other than
    ``padding_idx`` (whose logit is ``-inf``)."""
    if padding_idx is None or not start <= padding_idx < end:
        return logits.sum(dim=1)
    local = padding_idx - start
    return logits[:, :local].sum(dim=1) + logits[:, local + 1 :].sum(dim=1)


def unit_rows_backward_(weight: Tensor, grad: Tensor, chunk_size: int) -> Tensor:
    """In place, chunk by chunk: turns ``grad`` ``[N, D]``, a gradient with respect to
    ``unit_rows(weight)``, into the gradient with respect to ``weight`` ``[N, D]`` (the
    vector-Jacobian product of :func:`unit_rows`, so never an ``[N, D]`` temporary)."""
    for start, end in class_chunks(weight.shape[0], chunk_size):
        grad[start:end] = unit_rows_vjp(weight[start:end], grad[start:end])
    return grad


def unit_rows_vjp(rows: Tensor, grad_unit: Tensor) -> Tensor:
    """The gradient with respect to ``rows`` ``[C, D]`` of a loss whose gradient with respect to
    ``unit_rows(rows)`` is ``grad_unit`` ``[C, D]``; fp32 (fp64 for fp64 rows)."""
    rows = widened(rows.detach()).requires_grad_()
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(unit_rows(rows), rows, widened(grad_unit))
    return grad


def smoothing_share(label_smoothing: float, num_classes: int, padding_idx: int | None) -> float:
    """``eps / N'``: label smoothing's share of each of the ``N'`` classes other than
    ``padding_idx``."""
    return label_smoothing / (num_classes - (padding_idx is not None))


def smoothed_cross_entropy(
    lse: Tensor,
    target_logit: Tensor,
    logit_sum: Tensor | None,
    label_smoothing: float,
    num_classes: int,
    padding_idx: int | None,
) -> Tensor:
    """Per-row loss ``lse - (1 - eps) o_y - (eps / N') sum_{c != padding_idx} o_c`` (``[T]``)
    from its three per-row parts; ``logit_sum`` is read only when ``eps > 0``."""
    loss = lse - (1.0 - label_smoothing) * target_logit
    if label_smoothing:
        loss = loss - smoothing_share(label_smoothing, num_classes, padding_idx) * logit_sum
    return loss


@torch.library.custom_op("lightning_sampled::chunked_softmax_sums", mutates_args=())
def chunked_softmax_sums(
    z: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    target: Tensor | None,
    chunk_size: int,
    padding_idx: int | None,
    normalize: bool,
    logit_sums: bool,
    dtype: torch.dtype,
    cell_column: Tensor | None = None,
    cell_shift: Tensor | None = None,
    keep_columns: int = 0,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The per-row sums the cross-entropy's forward needs, one ``[T, chunk_size]`` block of logits
    at a time: the log-sum-exp over the classes, the target's logit (``0`` for a target outside
    ``[0, N)``, as a sharded table's ``-1`` is, and for every row when ``target`` is ``None``)
    and, with ``logit_sums``, the sum of the logits over the classes other than ``padding_idx``
    (else zeros). Each fp32 ``[T]``; ``z`` ``[T, D]``, ``weight`` ``[N, D]``, ``bias`` ``[N]``
    or ``None``, ``target`` long ``[T]`` or ``None``, matmuls in ``dtype``; ``cell_column`` and
    ``cell_shift`` ``[T]`` shift one logit per row first
    (:func:`shift_cells_`; the target's logit is read before the shift). Fourth: the shifted
    logits of the first ``keep_columns`` classes (whole chunks, :func:`kept_columns`), fp32,
    flat ``[T * keep_columns]`` (:func:`kept_chunk`), for :func:`chunked_softmax_grads` to
    read instead of recomputing them.

    A custom op, opaque to ``torch.compile``: traced as plain torch, the chunk loop unrolls and
    inductor's scheduler runs every chunk's matmul before the reductions that consume them, so
    all ``N / chunk_size`` blocks, the whole ``[T, N]`` logits, are alive at once.
    """
    num_rows, num_classes = z.shape[0], weight.shape[0]
    rows = torch.arange(num_rows, device=z.device)
    workspace = new_workspace(z, num_classes, chunk_size)
    kept = torch.empty(num_rows * keep_columns, device=z.device)
    chunk_lse = []
    target_logit = torch.zeros(num_rows, device=z.device, dtype=torch.float32)
    logit_sum = torch.zeros(num_rows, device=z.device, dtype=torch.float32)
    for start, end in class_chunks(num_classes, chunk_size):
        keep = end <= keep_columns  # written where backward reads them
        logits = chunk_logits(
            z, weight, bias, start, end, padding_idx, dtype,
            kept[num_rows * start :] if keep else workspace, normalize=normalize,
        )  # fmt: skip
        if target is not None:
            inside = (target >= start) & (target < end)
            local = (target - start).clamp(0, end - start - 1)
            target_logit = torch.where(inside, logits[rows, local], target_logit)
        shift_cells_(logits, start, end, cell_column, cell_shift)
        if logit_sums:
            logit_sum += row_sums_without_padding(logits, start, end, padding_idx)
        row_max = logits.amax(dim=1)
        out = workspace[: logits.numel()].view_as(logits) if keep else None
        chunk_sum = exp_shifted_(logits, row_max, out).sum(dim=1)
        chunk_lse.append(row_max + chunk_sum.log())
    lse = torch.logsumexp(torch.stack(chunk_lse, dim=1), dim=1)
    return lse, target_logit, logit_sum, kept


@chunked_softmax_sums.register_fake
def _(z, weight, bias, target, chunk_size, padding_idx, normalize, logit_sums, dtype, *rest):
    keep_columns = rest[2] if len(rest) > 2 else 0
    sums = tuple(z.new_empty(z.shape[0], dtype=torch.float32) for _ in range(3))
    return *sums, z.new_empty(z.shape[0] * keep_columns, dtype=torch.float32)


@torch.library.custom_op("lightning_sampled::chunked_softmax_grads", mutates_args=())
def chunked_softmax_grads(
    g: Tensor,
    zg: Tensor,
    z: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    lse: Tensor,
    chunk_size: int,
    padding_idx: int | None,
    normalize: bool,
    smoothing: float,
    need_z: bool,
    need_w: bool,
    need_b: bool,
    cell_column: Tensor | None = None,
    cell_shift: Tensor | None = None,
    kept: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The softmax part of the cross-entropy's gradients, one ``[T, chunk_size]`` block of
    probabilities at a time (a custom op, opaque to ``torch.compile``, for the reason
    :func:`chunked_softmax_sums` gives); the chunks whose shifted logits forward ``kept`` (its
    fourth output) are read, not recomputed.

    With ``P = softmax(z W^T + b) - smoothing`` (``0`` in the ``padding_idx`` column), ``g`` the
    per-row incoming gradient ``[T]`` and ``zg = z * g`` ``[T, D]`` in the matmul dtype, returns
    fp32 ``(P W [T, D], P^T zg [N, D], P^T g [N])``, where ``W`` is the scored class table
    (:func:`scored_rows`), so the table's term is the gradient with respect to its unit rows when
    ``normalize``. An output not asked for (``need_z``, ``need_w``, ``need_b``) is empty. The
    target's term and the factor ``g`` of the first are left to the caller. ``lse`` ``[T]`` is
    the forward's log-normaliser; ``cell_column`` and ``cell_shift`` as in
    :func:`chunked_softmax_sums` (the shifted logits are the ones softmaxed).
    """
    dtype = zg.dtype
    f32 = dict(device=z.device, dtype=torch.float32)
    grad_z = torch.zeros(z.shape if need_z else 0, **f32)
    grad_w = torch.zeros(weight.shape if need_w else 0, **f32)
    grad_b = torch.zeros(weight.shape[0] if need_b else 0, **f32)
    workspace = new_workspace(z, weight.shape[0], chunk_size)
    num_rows, keep_columns = z.shape[0], 0 if kept is None else kept.numel() // z.shape[0]
    with torch.autocast(z.device.type, enabled=False):
        for start, end in class_chunks(weight.shape[0], chunk_size):
            if end <= keep_columns:
                logits = kept_chunk(kept, num_rows, start, end)
                probs = exp_shifted_(logits, lse, workspace[: logits.numel()].view_as(logits))
            else:
                logits = chunk_logits(
                    z, weight, bias, start, end, padding_idx, dtype, workspace,
                    normalize=normalize,
                )  # fmt: skip
                shift_cells_(logits, start, end, cell_column, cell_shift)
                probs = exp_shifted_(logits, lse)
            if smoothing:
                probs.sub_(smoothing)
                if padding_idx is not None and start <= padding_idx < end:
                    probs[:, padding_idx - start] = 0.0
            if need_b:
                grad_b[start:end] = probs.T @ g
            probs = probs.to(dtype)
            w_c = scored_rows(weight[start:end], normalize).to(dtype)
            if need_z and dtype == torch.float32:
                grad_z.addmm_(probs, w_c)
            elif need_z:
                grad_z += (probs @ w_c).float()
            if need_w and dtype == torch.float32:
                torch.mm(probs.T, zg, out=grad_w[start:end])
            elif need_w:
                grad_w[start:end] = (probs.T @ zg).float()
    return grad_z, grad_w, grad_b


@chunked_softmax_grads.register_fake
def _(g, zg, z, weight, bias, lse, chunk_size, padding_idx, normalize, smoothing, *need_cells):
    need_z, need_w, need_b = need_cells[:3]
    return (
        z.new_empty(z.shape if need_z else 0, dtype=torch.float32),
        z.new_empty(weight.shape if need_w else 0, dtype=torch.float32),
        z.new_empty(weight.shape[0] if need_b else 0, dtype=torch.float32),
    )


def folded_softmax_grads(
    ctx: torch.autograd.function.FunctionCtx,
    g: Tensor,
    z: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    lse: Tensor,
    padding_idx: int | None = None,
    normalize: bool = False,
    smoothing: float = 0.0,
    cells: tuple[Tensor | None, Tensor | None] = (None, None),
    kept: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The backward that :class:`ChunkedCrossEntropy` and :class:`ChunkedLogSumExp` share: the
    per-row gradient ``g`` ``[T]`` folded into ``zg = g z`` (in ``ctx.dtype``) and
    :func:`chunked_softmax_grads` in ``ctx.chunk_size`` chunks for the inputs (``z``,
    ``weight``, ``bias``) whose gradient ``ctx`` needs; ``cells`` is ``(cell_column,
    cell_shift)`` and ``kept`` the logits forward kept. Returns ``(zg, P W, P^T zg, P^T g)``."""
    zg = (z.float() * g[:, None]).to(ctx.dtype)
    need_z, need_w, need_b = ctx.needs_input_grad[:3]
    grads = chunked_softmax_grads(
        g,
        zg,
        z,
        weight,
        bias,
        lse,
        ctx.chunk_size,
        padding_idx,
        normalize,
        smoothing,
        need_z,
        need_w,
        need_b,
        *cells,
        kept,
    )
    return zg, *grads


class ChunkedCrossEntropy(torch.autograd.Function):
    """Per-row exact cross-entropy of ``softmax(z W^T + b)`` in class chunks.

    With ``label_smoothing = eps`` the target distribution is ``(1 - eps)`` on ``y`` plus
    ``eps / N'`` on each of the ``N'`` classes other than ``padding_idx``, so the loss of a row is
    ``lse - (1 - eps) o_y - (eps / N') sum_{c != padding_idx} o_c`` (``eps = 0``: the NLL
    ``lse - o_y``). With ``normalize`` the class vectors are :func:`unit_rows`, chunk by chunk.

    Forward inputs: ``z`` ``[T, D]``, ``weight`` ``[N, D]``, ``bias`` ``[N]`` or ``None``,
    ``target`` long ``[T]``, ``chunk_size``, ``padding_idx``, ``normalize``, ``label_smoothing``,
    ``shards``. Output: fp32 ``[T]``.

    The loops over the chunks are the custom ops :func:`chunked_softmax_sums` and
    :func:`chunked_softmax_grads`, so that under ``torch.compile`` too (which traces this
    function's forward and backward into its graphs) no more than one ``[T, chunk_size]`` block
    of logits is alive at a time.

    With ``shards`` (a :class:`~lightning_sampled.sharding.collectives.RankReduction`) ``weight``
    and ``bias`` are this rank's rows of a table of ``shards.num_classes`` classes, ``z`` the
    queries of every rank (the same on each), ``target`` the local row of each target or ``-1``
    where another rank holds it, and ``padding_idx`` local: each rank sums over its own rows and
    the per-row sums are combined over the ranks, so every rank returns the same losses. In
    backward the incoming gradient is summed over the ranks first (each rank's loss reads its own
    rows of the output), the local rows get their exact gradient, and ``z`` a partial one that
    the gather of the queries sums over the ranks.
    """

    @staticmethod
    def forward(
        ctx, z, weight, bias, target, chunk_size, padding_idx, normalize, label_smoothing, shards
    ):
        dtype = compute_dtype(z)
        # the whole table's classes and padding class, which label smoothing spreads over
        whole = (weight.shape[0], padding_idx) if shards is None else shards.whole_table
        lse, target_logit, logit_sum, _ = chunked_softmax_sums(
            z,
            weight,
            bias,
            target,
            chunk_size,
            padding_idx,
            normalize,
            bool(label_smoothing),
            dtype,
        )
        if shards is not None:
            lse = shards.logsumexp(lse)
            shards.sum_(target_logit)
            if label_smoothing:
                shards.sum_(logit_sum)
        ctx.save_for_backward(z, weight, bias, target, lse)
        ctx.chunk_size, ctx.padding_idx, ctx.dtype = chunk_size, padding_idx, dtype
        ctx.normalize, ctx.label_smoothing, ctx.shards = normalize, label_smoothing, shards
        ctx.whole = whole
        return smoothed_cross_entropy(lse, target_logit, logit_sum, label_smoothing, *whole)

    @staticmethod
    def backward(ctx, grad_out):
        z, weight, bias, target, lse = ctx.saved_tensors
        need_z, need_w, need_b = ctx.needs_input_grad[:3]
        normalize, eps, shards = ctx.normalize, ctx.label_smoothing, ctx.shards
        # d loss_t / d logit_tc = g_t * (softmax_tc - (1 - eps) [c == y_t] - eps / N' [c != pad]).
        # The per-row factor g_t is folded into z (for the class gradient) and applied once at
        # the end (for dz), and the target term is added once outside the chunk loop, so each
        # chunk costs two matmuls and a few in-place passes over its [T, C] probabilities. With
        # normalize, the class gradient is first taken with respect to the unit rows.
        g = grad_out.float()
        if shards is not None:
            g = shards.sum_(g.clone())
        smoothing = smoothing_share(eps, *ctx.whole)
        zg, grad_z, grad_w, grad_b = folded_softmax_grads(
            ctx, g, z, weight, bias, lse, ctx.padding_idx, normalize, smoothing
        )
        with torch.autocast(z.device.type, enabled=False):
            hit = 1.0 - eps
            # the target term, of the rows whose target is in this table (all, unless sharded)
            owned = None if shards is None else (target >= 0).nonzero()[:, 0]
            ids = target if owned is None else target[owned]
            if need_z:
                target_rows = scored_rows(weight[ids], normalize).float()
                if owned is None:
                    grad_z.sub_(target_rows, alpha=hit)
                else:
                    grad_z.index_add_(0, owned, target_rows, alpha=-hit)
                grad_z.mul_(g[:, None])
            if need_w:
                grad_w.index_add_(0, ids, selected(zg, owned).float(), alpha=-hit)
                if normalize:
                    unit_rows_backward_(weight, grad_w, ctx.chunk_size)
            if need_b:
                grad_b.index_add_(0, ids, selected(g, owned), alpha=-hit)
        return (
            grad_z.to(z.dtype) if need_z else None,
            grad_w.to(weight.dtype) if need_w else None,
            grad_b.to(bias.dtype) if need_b else None,
            None,
            None,
            None,
            None,
            None,
            None,
        )


class ChunkedLogSumExp(torch.autograd.Function):
    """Per-row ``logsumexp(z W^T + b)`` ``[T]`` in chunks of the ``C`` columns, one logit per row
    shifted first (:func:`shift_cells_`): the normaliser of candidates that every row shares, such
    as a batch's distinct targets, without holding the ``[T, C]`` logits or their gradient.

    Forward inputs: ``z`` ``[T, D]``, ``weight`` ``[C, D]`` (the candidates' vectors as scored),
    ``bias`` ``[C]`` (fp32 column terms: a bias and a correction; differentiable) or ``None``,
    ``cell_column`` long ``[T]`` and ``cell_shift`` fp32 ``[T]`` (or both ``None``),
    ``chunk_size``. Output: fp32 ``[T]``; a row whose every logit is ``-inf`` gives ``-inf``
    and no gradient.

    The passes are :class:`ChunkedCrossEntropy`'s custom ops: two matmuls in backward (``dz = P
    W``, ``dW = P^T (g z)``) after one that recomputes the chunk's logits, and a few in-place
    passes over its ``[T, C]`` block; the per-row gradient ``g`` is folded into ``z``. The
    logits of the leading chunks that fit :data:`KEPT_LOGITS_ELEMENTS` (every chunk at a
    language model's batch) are kept from forward, and backward reads them instead of
    recomputing them: three products for those chunks instead of four.
    """

    @staticmethod
    def forward(ctx, z, weight, bias, cell_column, cell_shift, chunk_size):
        dtype = compute_dtype(z)
        keep = kept_columns(z.shape[0], weight.shape[0], chunk_size)
        lse, _, _, kept = chunked_softmax_sums(
            z, weight, bias, None, chunk_size, None, False, False, dtype, cell_column,
            cell_shift, keep,
        )  # fmt: skip
        ctx.save_for_backward(z, weight, bias, cell_column, cell_shift, lse, kept)
        ctx.chunk_size, ctx.dtype = chunk_size, dtype
        return lse

    @staticmethod
    def backward(ctx, grad_out):
        z, weight, bias, cell_column, cell_shift, lse, kept = ctx.saved_tensors
        need_z, need_w, need_b = ctx.needs_input_grad[:3]
        g = grad_out.float()
        _, grad_z, grad_w, grad_b = folded_softmax_grads(
            ctx, g, z, weight, bias, lse, cells=(cell_column, cell_shift), kept=kept
        )
        return (
            grad_z.mul_(g[:, None]).to(z.dtype) if need_z else None,
            grad_w.to(weight.dtype) if need_w else None,
            grad_b.to(bias.dtype) if need_b else None,
            None,
            None,
            None,
        )


def chunked_logsumexp(
    z: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    cell_column: Tensor | None = None,
    cell_shift: Tensor | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    """:class:`ChunkedLogSumExp`: ``logsumexp(z W^T + b)`` ``[T]`` of queries ``z`` ``[T, D]``
    over ``C`` shared candidates ``weight`` ``[C, D]`` with column terms ``bias`` ``[C]``, the
    logit of row ``t`` in column ``cell_column[t]`` shifted by ``cell_shift[t]`` (long and fp32
    ``[T]``; a negative column: none), in chunks of ``chunk_size`` columns (default
    :func:`resolve_chunk_size`)."""
    if weight.shape[0] == 0:
        return torch.full_like(z[:, 0], -math.inf, dtype=torch.float32)
    size = resolve_chunk_size(chunk_size, z.shape[0], weight.shape[0])
    return ChunkedLogSumExp.apply(z, weight, bias, cell_column, cell_shift, size)


def selected(x: Tensor, rows: Tensor | None) -> Tensor:
    """``x[rows]``, or ``x`` itself when ``rows`` is ``None`` (all of them)."""
    return x if rows is None else x[rows]


def chunked_nll(
    z: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    target: Tensor,
    chunk_size: int,
    padding_idx: int | None = None,
    *,
    normalize: bool = False,
    label_smoothing: float = 0.0,
    shards: RankReduction | None = None,
) -> Tensor:
    """Exact per-row NLL ``[T]`` (fp32) of ``target`` ``[T]`` under ``softmax(z W^T + b)``, or with
    ``label_smoothing`` the smoothed cross-entropy of :class:`ChunkedCrossEntropy`; with
    ``normalize`` ``W`` is replaced by its unit rows; with ``shards`` ``W`` is this rank's part
    of a table split across ranks (:class:`ChunkedCrossEntropy`)."""
    return ChunkedCrossEntropy.apply(
        z, weight, bias, target, chunk_size, padding_idx, normalize, label_smoothing, shards
    )


@torch.no_grad()
def chunked_topk(
    z: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    k: int,
    chunk_size: int,
    padding_idx: int | None = None,
    exclude: Tensor | None = None,
    *,
    normalize: bool = False,
) -> tuple[Tensor, Tensor]:
    """Exact top-``k`` classes of each row of ``z`` ``[T, D]`` by a running merge over chunks.

    Args:
        exclude: optional long ``[T, E]`` class ids to skip per row; negative entries are padding.
        normalize: score the unit class vectors (:func:`unit_rows`).

    Returns:
        ``(values, indices)``, fp32 ``[T, k]`` and long ``[T, k]``, in decreasing score order.
    """
    dtype = compute_dtype(z)
    num_rows, num_classes = z.shape[0], weight.shape[0]
    workspace = new_workspace(z, num_classes, chunk_size)
    best_v = torch.full((num_rows, 0), -math.inf, device=z.device)
    best_i = torch.zeros((num_rows, 0), dtype=torch.long, device=z.device)
    for start, end in class_chunks(num_classes, chunk_size):
        logits = chunk_logits(
            z, weight, bias, start, end, padding_idx, dtype, workspace, normalize=normalize
        )
        if exclude is not None:
            hit = (exclude >= start) & (exclude < end)
            row_idx = torch.arange(num_rows, device=z.device)[:, None].expand_as(exclude)
            logits[row_idx[hit], exclude[hit] - start] = -math.inf
        chunk_v, chunk_i = logits.topk(min(k, end - start), dim=1)
        merged_v = torch.cat([best_v, chunk_v], dim=1)
        merged_i = torch.cat([best_i, chunk_i + start], dim=1)
        best_v, pos = merged_v.topk(min(k, merged_v.shape[1]), dim=1)
        best_i = merged_i.gather(1, pos)
    return best_v, best_i
