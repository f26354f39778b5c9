"""Grammar masks applied to logits: the Triton kernel on CUDA, its PyTorch reference elsewhere."""

import torch


def apply_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor, masked_rows: torch.Tensor) -> None:
    """Set to -inf, in place, the logits of `masked_rows` that their bitmask rows forbid (bit j of word w
    allows token 32 w + j); tokens past the mask's 32 x words are left as they are."""
    # logits: [rows, vocab]; bitmask: [rows, words] int32; masked_rows: [n] int32, on the logits' device
    if logits.is_cuda:
        from nanovllm.kernels.triton_bitmask import apply_bitmask_ as apply_on_device

        apply_on_device(logits, bitmask, masked_rows)
        return
    rows = masked_rows.long()
    vocab = min(logits.size(1), bitmask.size(1) * 32)
    bits = torch.arange(32, dtype=torch.int32, device=logits.device)
    allowed = ((bitmask[rows].unsqueeze(-1) >> bits) & 1).flatten(1)[:, :vocab].bool()  # [n, vocab]
    logits[rows, :vocab] = logits[rows, :vocab].masked_fill(~allowed, float("-inf"))
