"""The public entry point for offline generation."""

from time import perf_counter

from tqdm.auto import tqdm

from nanovllm.engine.engine_client import InprocClient
from nanovllm.frontend.engine_frontend import EngineFrontend
from nanovllm.frontend.input_processor import Prompt
from nanovllm.frontend.output_processor import RequestState
from nanovllm.sampling_params import SamplingParams


class LLM(EngineFrontend):
    """Offline batched generation: `LLM(model_dir, **config).generate(prompts, params)`.

    The engine core runs in the caller's thread. With `tensor_parallel_size > 1`
    it also owns worker processes; `close()`, deleting the object or leaving
    the interpreter stops them.
    """

    def __init__(self, model: str, **kwargs):
        super().__init__(model, InprocClient, **kwargs)

    def close(self) -> None:
        """Stop tensor-parallel workers now rather than when the engine is collected."""
        self.client.shutdown()

    def add_request(self, prompt: Prompt, sampling_params: SamplingParams) -> RequestState:
        """Queue one request; returns its state, which each `step()` advances. A request that
        cannot be served raises ValueError and queues nothing."""
        return self._submit(self._check(prompt, sampling_params))

    def abort(self, request_id: str) -> None:
        """Cancel a request (no-op if it already finished): it ends with "abort" and its KV blocks are
        freed before the next step."""
        self._abort(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished_requests()

    def step(self) -> list[RequestState]:
        """Launch the next step and fold in the outputs of the one before it; returns the requests
        those outputs changed."""
        processed = self.output_processor.process(self.client.get_outputs())
        if processed.to_abort:
            self.client.abort(processed.to_abort)
        return processed.updated

    def generate(
        self,
        prompts: list[Prompt],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[dict]:
        """Complete every prompt; returns one dict per prompt, in prompt order:
        `text`, `token_ids`, `finish_reason` ("stop" or "length") and, when
        the request asked for them, `logprobs` (a {token id: log-probability}
        dict per completion token: the chosen token and the top alternatives).

        Every prompt is checked before any is queued, so one bad prompt raises
        ValueError (naming its index) without running or losing the others.
        """
        if sampling_params is None:
            sampling_params = SamplingParams()
        if not isinstance(sampling_params, list):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(sampling_params)} sampling params")
        requests = []
        for i, (prompt, params) in enumerate(zip(prompts, sampling_params)):
            try:
                requests.append(self._check(prompt, params))
            except ValueError as e:
                raise ValueError(f"prompt {i}: {e}") from None
        states = [self._submit(request) for request in requests]
        self._run_until_done(len(states), use_tqdm)
        return [self.output(state) for state in states]

    @staticmethod
    def output(state: RequestState) -> dict:
        """What `generate` returns for one request."""
        out = {"text": state.text, "token_ids": state.token_ids, "finish_reason": state.finish_reason}
        if state.params.logprobs is not None:
            out["logprobs"] = state.logprobs
        return out

    def _run_until_done(self, total: int, use_tqdm: bool) -> None:
        with tqdm(total=total, desc="Generating", dynamic_ncols=True, disable=not use_tqdm) as bar:
            start, num_tokens = perf_counter(), 0
            while self.has_unfinished_requests():
                updated = self.step()
                num_tokens += len(updated)
                finished = sum(state.finished for state in updated)
                if finished:
                    bar.set_postfix_str(f"{num_tokens / (perf_counter() - start):,.0f} output tok/s")
                    bar.update(finished)
