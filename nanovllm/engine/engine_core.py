"""The engine core: token ids in, token ids out, one overlapped step at a time."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from nanovllm.config import Config
from nanovllm.core.request import Request
from nanovllm.core.runner_output import ModelRunnerOutput
from nanovllm.core.scheduler import Scheduler
from nanovllm.core.scheduler_output import SchedulerOutput
from nanovllm.core.structured_output import StructuredOutputs
from nanovllm.engine.kv_capacity import group_capacities, longest_request, max_concurrency
from nanovllm.engine.messages import EngineCoreInfo, EngineCoreOutput, EngineCoreRequest, EngineStats
from nanovllm.spec_decode.proposer_factory import make_proposer
from nanovllm.worker.executor_factory import make_executor

if TYPE_CHECKING:
    from nanovllm.worker.pending_output import PendingOutput


@dataclass
class _InFlight:
    """A launched step whose sampled ids the host has not read yet."""

    scheduled: SchedulerOutput
    pending: "PendingOutput | None"


class EngineCore:
    """Owns the scheduler and the model runner and drives them so that the device never waits for the host.

    Each `step()` schedules and launches step n+1 before it reads back step n's
    sampled ids: the device runs n+1 while the host confirms n's tokens, applies
    the stopping rules, and (back in the caller) turns them into text. Requests
    come in as token ids; outputs go out as new token ids per request.
    `vocabulary` describes the tokens for grammar-constrained requests (None:
    structured outputs are refused).
    """

    def __init__(self, config: Config, eos_token_ids: tuple[int, ...], vocabulary=None):
        self.executor = make_executor(config, eos_token_ids)
        self.structured = StructuredOutputs(vocabulary)
        self.proposer = make_proposer(config, self.executor.num_kvcache_blocks)
        num_blocks, num_state_slots = self.executor.num_kvcache_blocks, self.executor.num_state_slots
        self.scheduler = Scheduler(config, num_blocks, eos_token_ids, self.structured, self.proposer, num_state_slots)
        self.info = EngineCoreInfo(
            num_blocks,
            config.kv_block_size,
            config.context_len,
            config.model_config.vocab_size,
            self.executor.kv_cache_dtype_name,
            self.executor.start_up,
            max_concurrency(config, num_blocks, num_state_slots),
            group_capacities(config, num_blocks, num_state_slots),
            longest_request(config, num_blocks),
            num_state_slots,
        )
        self._block_size = config.kv_block_size
        self._in_flight: _InFlight | None = None

    def add_request(self, request: EngineCoreRequest) -> None:
        """Queue a request the front end has checked."""
        self.scheduler.add_request(
            Request(request.request_id, request.prompt_token_ids, request.sampling_params, self._block_size)
        )

    def abort(self, request_ids: list[str]) -> None:
        """Drop requests; what a step in flight samples for them is discarded."""
        self.scheduler.abort(request_ids)

    def has_work(self) -> bool:
        """Whether a step remains to run or to read back."""
        return self.scheduler.has_requests() or self._in_flight is not None

    def stats(self) -> EngineStats:
        return self.scheduler.stats()

    def check_workers(self) -> None:
        """RuntimeError if a tensor-parallel worker has died (which an idle core would not notice)."""
        self.executor.check_workers()

    def step(self) -> list[EngineCoreOutput]:
        """Schedule and launch the next step, then read back the one before it and return its outputs."""
        outputs = []
        if self._in_flight is not None and self.scheduler.needs_confirmed_tokens():
            # Synchronous fallback: penalties and speculative decoding's proposals need the tokens
            # of the step in flight on the host to build the next step (the proposer also needs to
            # know which drafts were kept), so that step is read back first.
            outputs = self._finish_in_flight()
        scheduled = self.scheduler.schedule()
        waits_for_tokens = self._in_flight is not None  # an empty step is then expected
        launched = None
        if not scheduled.is_empty:
            if self._in_flight is not None and self.structured.constrains(scheduled.sampled_req_ids):
                # A grammar's mask needs the token in flight: launch this step's forward pass, read
                # the step in flight back and advance the matchers while it runs, then sample.
                forward = self.executor.launch_forward(scheduled, constrained=True)
                outputs = self._finish_in_flight()
                pending = self.executor.launch_sampling(forward, self.structured.bitmasks(scheduled.sampled_req_ids))
            else:
                pending = self.executor.execute(scheduled, self.structured.bitmasks(scheduled.sampled_req_ids))
            launched = _InFlight(scheduled, pending)
        if self._in_flight is not None:
            outputs = self._finish_in_flight()
        assert launched is not None or waits_for_tokens or not self.scheduler.has_requests(), (
            "requests are live but no step could be scheduled"
        )
        self._in_flight = launched
        return outputs

    def _finish_in_flight(self) -> list[EngineCoreOutput]:
        """Wait for the launched step's samples and fold them into the requests."""
        step, self._in_flight = self._in_flight, None
        result = step.pending.result() if step.pending is not None else ModelRunnerOutput([])
        return self.scheduler.update(step.scheduled, result)

    def reset(self) -> list[str]:
        """After a failed step: drop the step in flight and every live request; returns their ids."""
        self._in_flight = None
        return self.scheduler.abort_all()

    def shutdown(self) -> None:
        """Free the decode graphs (a draft model's too) and stop tensor-parallel workers now rather than when
        the core is collected."""
        self.executor.close()
        if self.proposer is not None:
            self.proposer.close()
