"""Grammar masks on their way to the device, through pinned host memory, without the host waiting."""

import torch

from nanovllm.core.structured_output import GrammarBitmasks


class GrammarMaskBuffers:
    """Two pinned host buffers, used in turn, for a step's grammar masks ([rows, words] int32, a bit per
    token) and the sampling rows they hold ([rows] int32), made at the first constrained step.

    A copy from pageable memory would make the host wait for the forward pass in
    flight; the buffers alternate so that a fill never touches memory whose copy
    the device may still have queued.
    """

    def __init__(self, max_rows: int, device: torch.device):
        self.max_rows = max_rows
        self.device = device
        self._hosts: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._turn = 0

    def to_device(self, grammar: GrammarBitmasks) -> tuple[torch.Tensor, torch.Tensor]:
        """The grammar masks and the rows they hold, filled on the host and queued for the device."""
        # masks: [num_rows, words] int32; rows: [len(grammar.rows)] int32
        words = (grammar.vocab_size + 31) // 32
        if not self._hosts or self._hosts[0][0].size(1) != words:
            self._hosts = [self._pinned(words) for _ in range(2)]
        masks, rows = self._hosts[self._turn]
        self._turn ^= 1
        masks, rows = grammar.fill(masks[: grammar.num_rows]), rows[: len(grammar.rows)]
        rows.numpy()[:] = grammar.rows
        return masks.to(self.device, non_blocking=True), rows.to(self.device, non_blocking=True)

    def _pinned(self, words: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One host buffer: masks [max_rows, words] and rows [max_rows], pinned on CUDA."""
        pin = self.device.type == "cuda"
        return (
            torch.empty(self.max_rows, words, dtype=torch.int32, pin_memory=pin),
            torch.empty(self.max_rows, dtype=torch.int32, pin_memory=pin),
        )
