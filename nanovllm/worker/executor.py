"""The interface the engine core drives a device through (one model runner, or rank 0's with tensor-parallel
workers), and the handle of a step between its two launches (`LaunchedForward`).

Imports nothing of the device side at run time: the runners import this module, and the engine core gets
them through `executor_factory`.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the engine core imports this module without torch
    import torch

    from nanovllm.core.scheduler_output import SchedulerOutput
    from nanovllm.core.structured_output import GrammarBitmasks
    from nanovllm.worker.pending_output import PendingOutput, PromptScores
    from nanovllm.worker.start_up_report import StartUpReport


@dataclass
class LaunchedForward:
    """A step whose forward pass is queued and whose sampling is not: what `launch_sampling` needs."""

    out: "SchedulerOutput"
    # [sampling rows, vocab] on rank 0, None on the other ranks; but where every rank drew in the decode step
    # and rank 0 reads no logits after it, each rank's slice [sampling rows, vocab / ranks]; None where
    # nothing samples
    logits: "torch.Tensor | None"
    sampled_in_step: bool  # the decode step drew every row itself
    prompt_scores: "PromptScores | None"
    num_logprobs: int | None = None  # with `sampled_in_step`: the most alternatives a row's logprobs list
    # a verify step's drafts on the device, [requests, queries - 1] each: the ids after each request's last
    # token, and which of them are drafts (the rest pad); None where the step checked them itself
    drafts_on_device: "tuple[torch.Tensor, torch.Tensor] | None" = None


class Executor(ABC):
    """Runs the model steps the scheduler plans.

    `num_kvcache_blocks` is the KV capacity start-up found,
    `num_state_slots` the recurrent-state slots (0 on a model without
    recurrent layers; the same on every rank) and `kv_cache_dtype_name` the
    cache's element type ("bfloat16", "fp8_e4m3" ...); `start_up` what rank
    0's runner measured while starting.
    """

    num_kvcache_blocks: int
    num_state_slots: int
    kv_cache_dtype_name: str
    start_up: "StartUpReport"

    def execute(self, out: "SchedulerOutput", grammar: "GrammarBitmasks | None" = None) -> "PendingOutput | None":
        """Launch one step without waiting for the device; the handle of its outputs (None when it samples
        nothing)."""
        return self.launch_sampling(self.launch_forward(out, grammar is not None), grammar)

    @abstractmethod
    def launch_forward(self, out: "SchedulerOutput", constrained: bool = False) -> LaunchedForward:
        """Launch a step's forward pass alone (`constrained`: some sampling row is held to a grammar), so
        that its grammar masks can be filled once the step before it is read back; the handle
        `launch_sampling` takes."""

    @abstractmethod
    def launch_sampling(
        self, step: LaunchedForward, grammar: "GrammarBitmasks | None" = None
    ) -> "PendingOutput | None":
        """Launch the sampling of a step `launch_forward` launched; the handle of its outputs (None when
        it samples nothing)."""

    def check_workers(self) -> None:
        """RuntimeError if a process the executor depends on has died; an idle engine calls it, as no step
        would tell. One runner in the caller's process has none."""

    @abstractmethod
    def close(self) -> None:
        """Free the device's graphs and stop any worker now rather than when the executor is collected."""
