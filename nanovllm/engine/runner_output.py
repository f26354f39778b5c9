"""What the model runner gives back for one step, and the handle that waits for it."""

from dataclasses import dataclass

import torch

from nanovllm.layers.sampler import SamplerOutput


@dataclass
class ModelRunnerOutput:
    """Per request that sampled, in batch order: its new token id and, where asked for, its logprobs."""

    sampled_token_ids: list[int]
    logprobs: list[dict[int, float] | None] | None = None


class PendingOutput:
    """A launched step's sampler outputs on their way to the host.

    The copies to (pinned) host memory are queued behind the step on its stream
    and an event marks their end, so `result()` waits for this step alone and
    never for work launched after it.
    """

    def __init__(self, output: SamplerOutput, logprob_counts: list[int | None]):
        # the sampler's fresh tensors: nothing launched later writes them
        self._token_ids = output.token_ids.to("cpu", non_blocking=True)
        self._logprob_ids = self._logprobs = None
        if output.logprobs is not None:
            self._logprob_ids = output.logprob_token_ids.to("cpu", non_blocking=True)
            self._logprobs = output.logprobs.to("cpu", non_blocking=True)
        self._logprob_counts = logprob_counts
        self._event = None
        if output.token_ids.is_cuda:
            self._event = torch.cuda.Event()
            self._event.record()

    def result(self) -> ModelRunnerOutput:
        """Wait for the copies, then the token ids and logprob dicts as Python values."""
        if self._event is not None:
            self._event.synchronize()
        return ModelRunnerOutput(self._token_ids.tolist(), self._logprob_dicts())

    def _logprob_dicts(self) -> list[dict[int, float] | None] | None:
        if self._logprobs is None:
            return None
        ids, values = self._logprob_ids.tolist(), self._logprobs.tolist()
        return [None if k is None else dict(zip(row_ids[: 1 + k], row_values[: 1 + k]))
                for k, row_ids, row_values in zip(self._logprob_counts, ids, values)]
