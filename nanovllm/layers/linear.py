"""Linear layers split across tensor-parallel ranks, each parameter with its own loader.

Column-parallel layers split their output features, row-parallel layers split
their input features and all-reduce the partial sums. A parameter's
`weight_loader(param, loaded, shard_id=None)` copies this rank's slice of a
checkpoint tensor into it, reading only that slice; fused layers (qkv, gate/up)
take one checkpoint tensor per `shard_id`.

A layer may hold its weight in FP8 (`layers/fp8_linear.py` makes it so): `weight`
float8 and `weight_scale` one fp32 scale per `weight_block` of it, sharded as the
weight's rows and columns are (`kernels/fp8_weights.py` has the layout).
"""

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from nanovllm.kernels.fp8_gemm import block_scaled_mm_linear, scaled_mm_linear, takes_block_scaled_mm
from nanovllm.kernels.fp8_weights import dequantize_to, fp8_linear
from nanovllm.layers.all_reduce import all_reduce, gemv_ranks_sum, summed_in_gemv
from nanovllm.layers.fusion import fused_on_cuda
from nanovllm.utils.loader import shard
from nanovllm.utils.parallel import kv_heads_per_rank, tp_rank, tp_size

if TYPE_CHECKING:
    from nanovllm.kernels.triton_all_reduce import ProductSum


def divide(numerator: int, denominator: int, what: str) -> int:
    """`numerator / denominator`, or a clear error when the split is uneven."""
    if numerator % denominator:
        raise ValueError(f"{what} ({numerator}) is not divisible by tensor_parallel_size ({denominator})")
    return numerator // denominator


# the most rows a product sends to the Triton GEMV, which reads W once for all of them: up to it (its kernel's
# limit) the GEMV beats cuBLAS on every projection of Qwen3-0.6B and -8B (`benchmarks/gemv.py --rows`)
GEMV_MAX_ROWS = 16
# a block-FP8 weight for products of more rows on CUDA that cuBLASLt's block scaling does not take (not Hopper,
# blocks other than 128 x 128): one generated kernel reads the FP8 values and writes the 16-bit weight, then
# cuBLAS multiplies in 16 bits
_dequantize_weight = fused_on_cuda(dequantize_to)


def uses_gemv(x: torch.Tensor) -> bool:
    """Whether x W^T (+ bias) goes through the Triton GEMV: a few rows on CUDA (a decode step of one or a
    few sequences, a speculative verify step), where it reads W faster than cuBLAS does for products of a
    decoder layer's size."""
    return x.is_cuda and 1 <= x.size(0) <= GEMV_MAX_ROWS


def one_row_on_cuda(x: torch.Tensor) -> bool:
    """Whether x is a single row on CUDA (a one-sequence decode step): the rows for which the GEMV reads a
    norm or an activation in front of the product (`fused_projection.py`), and the MoE kernels the norm in
    front of the experts, themselves."""
    return x.is_cuda and x.size(0) == 1


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """x W^T (+ b); a few rows on CUDA through the Triton GEMV (`uses_gemv`); written to `out` when given."""
    # x: [tokens, in]; weight: [out, in] -> [tokens, out]
    if uses_gemv(x):
        from nanovllm.kernels.triton_gemv import gemv  # Triton is needed on CUDA only

        return gemv(x, weight, out, bias)
    if x.is_cpu and x.size(0) <= GEMV_MAX_ROWS:
        # (W x^T)^T: the CPU's GEMM takes a few rows faster this way round than as x W^T, and one as fast
        y = torch.mm(weight, x.t()) if bias is None else torch.addmm(bias.unsqueeze(1), weight, x.t())  # [out, tokens]
        return y.t().contiguous() if out is None else out.copy_(y.t())
    if out is None:
        return F.linear(x, weight, bias)
    return torch.mm(x, weight.T, out=out) if bias is None else torch.addmm(bias, x, weight.T, out=out)


def load_fused_rows(param: nn.Parameter, loaded, shard_sizes: dict, shard_id, rank: int, ranks: int) -> None:
    """Copy into `param` rank `rank`'s rows (of `ranks` ranks) of the shards `loaded` holds: shard `shard_id`,
    the shards of a tuple of ids one after another, or with None every shard of `shard_sizes` (id -> the whole
    shard's rows, in the order `param` holds each shard's rows of this rank). A block-FP8 scale holds one row
    per `rows_per_entry` rows of the weight."""
    parts = tuple(shard_sizes) if shard_id is None else shard_id if isinstance(shard_id, tuple) else (shard_id,)
    unknown = [part for part in parts if part not in shard_sizes]
    if unknown:
        raise KeyError(f"unknown shard {unknown[0]!r}; expected one of {list(shard_sizes)}")
    unit = getattr(param, "rows_per_entry", 1)
    offset, start = 0, 0  # where each shard begins in this rank's parameter, and in the loaded tensor
    for sid, full_size in shard_sizes.items():
        full_size //= unit
        size = full_size // ranks
        if sid in parts:
            param.data.narrow(0, offset, size).copy_(shard(loaded, 0, start + rank * size, size))
            start += full_size
        offset += size


class LinearBase(nn.Module):
    """y = x W^T (+ b), with W stored as this rank's shard along `tp_dim` (None = replicated)."""

    # a layer that stays in the model's dtype when the decoder's projections go FP8 (`fp8_linear.fp8_layers`)
    keeps_full_precision = False

    def __init__(self, input_size: int, output_size: int, bias: bool, tp_dim: int | None):
        super().__init__()
        self.tp_dim = tp_dim
        self.output_size = output_size  # the whole layer's, as the checkpoint holds it
        self.tp_rank = tp_rank()
        self.tp_size = tp_size() if tp_dim is not None else 1
        if tp_dim == 0:
            output_size = divide(output_size, self.tp_size, "output features")
        elif tp_dim == 1:
            input_size = divide(input_size, self.tp_size, "input features")
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        # FP8 weights: [ceil(out / block[0]), ceil(in / block[1])] fp32 scales, and the block they scale
        self.weight_scale: nn.Parameter | None = None
        self.weight_block: tuple[int, int] | None = None

    def weight_loader(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        # a row-parallel layer's bias has no dimension 1, nor its per-channel FP8 scales a split one:
        # every rank reads all of them
        tp_dim = getattr(param, "tp_dim", self.tp_dim)
        if tp_dim is not None and tp_dim < param.dim():
            size = param.size(tp_dim)
            param.data.copy_(shard(loaded, tp_dim, self.tp_rank * size, size))
        else:
            param.data.copy_(loaded[:])

    def scale_loader(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        """Load FP8 weight scales: per block, per output channel ([out, 1]), or per tensor ([1] or [],
        which stands for the same scale on each of its tensor's rows)."""
        loaded = loaded[...]
        if loaded.numel() == 1:
            loaded = loaded.reshape(1, 1).expand(self.loaded_rows(shard_id), 1)
        self.weight_loader(param, loaded, shard_id)

    def loaded_rows(self, shard_id) -> int:
        """Rows of the checkpoint tensor of `shard_id` (None: the whole layer's)."""
        return self.output_size if shard_id is None else self.shard_sizes[shard_id]

    def fp8_weights(self) -> dict:
        """The GEMV's arguments for this layer's FP8 weight (none for a full-precision one)."""
        return {} if self.weight_scale is None else dict(weight_scale=self.weight_scale, weight_block=self.weight_block)

    def project(
        self, x: torch.Tensor, bias: torch.Tensor | None, ranks_sum: "ProductSum | None" = None
    ) -> torch.Tensor:
        """x W^T (+ bias), W in FP8 where the layer holds it so: a few rows on CUDA through the GEMV, more
        rows of a 16-bit model on FP8 tensor cores (per-channel scales, or 128 x 128 blocks on Hopper), with
        other block scales (whole blocks) by a 16-bit GEMM of W dequantized, the rest in PyTorch. With
        `ranks_sum` (one row on CUDA), the GEMV sums the product over the tensor-parallel ranks too."""
        # x: [tokens, in] -> [tokens, out]
        if ranks_sum is not None or (self.weight_scale is not None and uses_gemv(x)):
            from nanovllm.kernels.triton_gemv import gemv  # Triton is needed on CUDA only

            return gemv(x, self.weight, bias=bias, ranks_sum=ranks_sum, **self.fp8_weights())
        if self.weight_scale is None:
            return linear(x, self.weight, bias)
        per_channel = self.weight_block == (1, self.weight.size(1))
        if x.is_cuda and x.dtype in (torch.bfloat16, torch.float16):
            if per_channel:
                return scaled_mm_linear(x, self.weight, self.weight_scale, bias)
            if takes_block_scaled_mm(self.weight, self.weight_block):
                return block_scaled_mm_linear(x, self.weight, self.weight_scale, bias)
            if self._whole_blocks():
                return linear(x, _dequantize_weight(self.weight, self.weight_scale, self.weight_block, x.dtype), bias)
        # as the GEMV would: one row, and a few of per-channel weights, unquantized
        quantize_x = x.size(0) > (1 if not per_channel else GEMV_MAX_ROWS)
        return fp8_linear(x, self.weight, self.weight_scale, self.weight_block, bias, quantize_x=quantize_x)

    def _whole_blocks(self) -> bool:
        """Whether the FP8 weight's rows and columns are whole blocks of its scales."""
        rows, columns = self.weight_block
        return self.weight.size(0) % rows == 0 and self.weight.size(1) % columns == 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(x, self.bias)


class ReplicatedLinear(LinearBase):
    """The whole weight on every rank."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__(input_size, output_size, bias, tp_dim=None)


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks; no communication."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__(input_size, output_size, bias, tp_dim=0)


class FusedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of one input stored as one weight.

    `shard_sizes` maps each checkpoint tensor's shard id to its full output size;
    on each rank the fused weight holds every shard's slice, in that order.
    """

    def __init__(self, input_size: int, shard_sizes: dict, bias: bool = False):
        super().__init__(input_size, sum(shard_sizes.values()), bias)
        self.shard_sizes = shard_sizes

    def weight_loader(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        """Load one shard's checkpoint tensor, a tuple of shards' held one after another (Qwen3.5 stores the
        q|k|v of its Gated DeltaNet so, beside z, b and a), or with `shard_id` None one that holds every shard
        (Phi-3 stores q|k|v and gate|up so): each shard's slice for this rank (`load_fused_rows`)."""
        load_fused_rows(param, loaded, self.shard_sizes, shard_id, self.tp_rank, self.tp_size)


class MergedColumnParallelLinear(FusedColumnParallelLinear):
    """gate and up projections in one matmul; shard ids 0 and 1."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False):
        super().__init__(input_size, dict(enumerate(output_sizes)), bias)


class QKVParallelLinear(FusedColumnParallelLinear):
    """q, k and v projections in one matmul; heads and KV heads split across ranks. With `output_gate` q's
    rows hold each head's q and then its output gate, 2 * head_dim a head (Qwen3.5's q_proj)."""

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool = False,
        output_gate: bool = False,
    ):
        divide(num_heads, tp_size(), "attention heads")
        heads_per_rank, self.kv_repeats = kv_heads_per_rank(num_kv_heads, tp_size())
        self.num_kv_heads = num_kv_heads
        q_rows = num_heads * head_dim * (2 if output_gate else 1)
        # with repeated KV heads the layer is built as if the checkpoint held every repeat
        kv_rows = heads_per_rank * tp_size() * head_dim
        super().__init__(hidden_size, {"q": q_rows, "k": kv_rows, "v": kv_rows}, bias)

    def loaded_rows(self, shard_id) -> int:
        if shard_id is None:  # q|k|v in one tensor
            return sum(map(self.loaded_rows, self.shard_sizes))
        rows = self.shard_sizes[shard_id]
        return rows // self.kv_repeats if shard_id in ("k", "v") else rows

    def weight_loader(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        """As `FusedColumnParallelLinear`'s, with each KV head repeated first where ranks outnumber them."""
        if self.kv_repeats > 1:
            loaded = self._kv_heads_repeated(loaded, shard_id, getattr(param, "rows_per_entry", 1))
        super().weight_loader(param, loaded, shard_id)

    def _kv_heads_repeated(self, loaded, shard_id, unit: int) -> torch.Tensor:
        """`loaded` (the checkpoint's rows of `shard_id`: one shard, a tuple of them, or None for q|k|v) with
        the rows of each KV head repeated `kv_repeats` times, in place."""
        parts = (
            tuple(self.shard_sizes) if shard_id is None else shard_id if isinstance(shard_id, tuple) else (shard_id,)
        )
        pieces = loaded[...].split([self.loaded_rows(part) // unit for part in parts])
        return torch.cat(
            [
                piece.unflatten(0, (self.num_kv_heads, -1)).repeat_interleave(self.kv_repeats, 0).flatten(0, 1)
                if part in ("k", "v")
                else piece
                for part, piece in zip(parts, pieces)
            ]
        )


class RowParallelLinear(LinearBase):
    """Input features split across ranks; partial outputs summed by all-reduce, or, without
    `reduce_results`, left to the layer after it to sum (with the norm it runs)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, reduce_results: bool = True):
        super().__init__(input_size, output_size, bias, tp_dim=1)
        self.reduce_results = reduce_results

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.all_reduce(self.project(x, self.rank_bias(), self.ranks_sum_in_gemv(x)))

    def rank_bias(self) -> torch.Tensor | None:
        """The bias this rank adds: all of it on rank 0, none elsewhere, so the all-reduce counts it once."""
        return self.bias if self.tp_rank == 0 else None

    def ranks_sum_in_gemv(self, x: torch.Tensor) -> "ProductSum | None":
        """For input rows `x` that the GEMV multiplies and can sum over the ranks itself, what it sums
        through (with or without `reduce_results`: the layer after finds the sum, `summed_in_gemv`)."""
        return None if self.tp_size == 1 else gemv_ranks_sum(x.size(0), self.output_size, x.dtype, x.device)

    def all_reduce(self, y: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's partial output `y`, in place (`y` itself without `reduce_results`, or
        where the GEMV summed it already)."""
        return all_reduce(y) if self.tp_size > 1 and self.reduce_results and not summed_in_gemv(y) else y
