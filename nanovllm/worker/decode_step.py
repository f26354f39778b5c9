"""A decode step's device work, from its input buffers to its sampled ids: what the decode CUDA graphs capture."""

import torch

from nanovllm.layers.fusion import fused_on_cuda
from nanovllm.layers.sampler import sample_with_temperatures


@fused_on_cuda
def resolve_placeholders(input_ids: torch.Tensor, src_rows: torch.Tensor, last_sampled: torch.Tensor) -> torch.Tensor:
    """Each row's token id: its input id, or where `src_rows` >= 0 the previous step's sample in that row
    (one generated kernel on CUDA instead of a compare, a gather and a select)."""
    # input_ids, src_rows: [tokens]; last_sampled: [max_num_seqs] -> [tokens]
    return torch.where(src_rows < 0, input_ids, last_sampled[src_rows])


class DeviceInputForward:
    """The model over a step's tokens, each placeholder's id taken from the previous step's samples
    on the device (inside the decode graphs too). Holds no reference to the runner, so that graphs
    capturing it form no cycle that would keep an engine's memory alive after it is dropped."""

    def __init__(self, model: torch.nn.Module, last_sampled: torch.Tensor):
        self.model = model
        self.last_sampled = last_sampled

    def __call__(self, input_ids: torch.Tensor, src_rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # input_ids, src_rows, positions: [tokens] -> hidden states [tokens, hidden]
        return self.model(resolve_placeholders(input_ids, src_rows, self.last_sampled), positions)


class DecodeStep:
    """One token per row through the model and, with `samples` (one rank, whose LM head gathers
    nothing), the LM head and the common sampling too: argmax at temperature 0, else a Gumbel-max
    draw from the row's seed, each row's id written to `last_sampled[row]`. Captured in a graph, a
    step of greedy or plain-temperature rows is then one replay. The hidden states are returned (not
    the logits, which would hold a [rows, vocab] tensor per captured size): the runner computes the
    logits from them for a step that needs the full sampler, whose ids then overwrite these."""

    def __init__(self, forward: DeviceInputForward, samples: bool):
        self.forward = forward
        self.samples = samples

    def __call__(self, input_ids: torch.Tensor, src_rows: torch.Tensor, positions: torch.Tensor,
                 temperatures: torch.Tensor, seeds: torch.Tensor, sample: bool = True) -> torch.Tensor:
        """`sample=False` skips the sampling where no graph needs it: an eager step that the full
        sampler samples."""
        # input_ids, src_rows, positions, temperatures, seeds: [rows] -> hidden states [rows, hidden]
        hidden_states = self.forward(input_ids, src_rows, positions)
        if self.samples and sample:
            logits = self.forward.model.compute_logits(hidden_states)  # [rows, vocab]
            sample_with_temperatures(logits, temperatures, seeds, out=self.forward.last_sampled[:logits.size(0)])
        return hidden_states
