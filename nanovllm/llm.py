"""The public entry point for offline generation."""

import copy
from collections.abc import Sequence

from tqdm.auto import tqdm

from nanovllm.engine.engine_client import InprocClient
from nanovllm.entrypoints.reasoning import READS_SPECIAL_TOKENS, REASONING_PARSERS, split_reasoning
from nanovllm.frontend.chat import render_chat
from nanovllm.frontend.engine_frontend import EngineFrontend
from nanovllm.frontend.input_processor import ProcessedPrompt, Prompt, is_single_prompt
from nanovllm.frontend.output_processor import ParentRequest
from nanovllm.outputs import RequestOutput
from nanovllm.sampling_params import SamplingParams
from nanovllm.utils.heap import unfreeze_objects

Conversation = list[dict]


class LLM(EngineFrontend):
    """Offline batched generation: `LLM(model, **config).generate(prompts, params)`.

    `model` is a local model folder or a Hugging Face Hub id ("Qwen/Qwen3-0.6B"), `config` the
    `nanovllm.config.Config` fields. Start-up is logged on the `nanovllm` logger (model, device, memory,
    timings; `nanovllm.utils.log_setup` says where the log goes). The engine core runs in the caller's
    thread. With `tensor_parallel_size > 1` it also owns worker processes; `close()`, deleting the object
    or leaving the interpreter stops them. With `data_parallel_size > 1` each replica's core runs in a process
    of its own instead, which `close()` stops.
    """

    def __init__(self, model: str, **kwargs):
        super().__init__(model, InprocClient, **kwargs)

    def close(self) -> None:
        """Free the decode graphs and stop tensor-parallel workers now rather than when the engine is
        collected."""
        self.client.shutdown()
        unfreeze_objects()

    def add_request(self, prompt: Prompt, sampling_params: SamplingParams) -> str:
        """Queue one request and return its id; each `step()` advances it. A request that cannot be
        served raises ValueError and queues nothing."""
        return self._submit(*self._check(prompt, sampling_params)).request_id

    def abort(self, request_id: str) -> None:
        """Cancel a request (no-op if it already finished): it ends with "abort" and its KV blocks are
        freed before the next step."""
        self._abort(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        """Launch the next step and fold in the outputs of the one before it; returns, for each request
        those outputs changed, everything it has so far."""
        return [parent.output() for parent in self._advance()]

    def _advance(self) -> list[ParentRequest]:
        processed = self.output_processor.process(self.client.get_outputs())
        if processed.to_abort:
            self.client.abort(processed.to_abort)
        return processed.updated

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Complete one prompt or a list of them: text, token ids, or {"prompt": text} /
        {"prompt_token_ids": ids} dicts. Returns one RequestOutput per prompt, in prompt order.

        `sampling_params` is one SamplingParams for all prompts or one per
        prompt (default: `get_default_sampling_params()`). Every prompt is checked before any
        is queued, so one bad prompt raises ValueError (naming its index)
        without running or losing the others.
        """
        batch = [prompts] if is_single_prompt(prompts) else list(prompts)
        return self._run(batch, sampling_params, use_tqdm)

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict | None = None,
        tools: list[dict] | None = None,
        reasoning_parser: str | None = None,
    ) -> list[RequestOutput]:
        """Reply to one conversation (a list of {"role", "content"} messages) or a list of them, each
        rendered with the tokenizer's chat template (or `chat_template`); one RequestOutput each.

        A message's content is a string or a list of OpenAI content parts: text parts are joined one per
        line, and any other part (an image ...) is a ValueError, as this is a text-only model. `tools`
        (OpenAI tool dicts) are passed to the template, which describes them to the model.

        With `reasoning_parser` ("qwen3", "deepseek_r1" or "openai_gptoss", the server's `--reasoning-parser`) each
        completion's reasoning goes in its `reasoning_content` and its `text` is the answer alone, split as the
        server splits a chat reply; a completion held to a grammar (`structured_outputs`) is all answer.
        """
        if reasoning_parser is not None and reasoning_parser not in REASONING_PARSERS:
            raise ValueError(
                f"unknown reasoning_parser {reasoning_parser!r}; the parsers are {', '.join(REASONING_PARSERS)}"
            )
        conversations = [messages] if not messages or isinstance(messages[0], dict) else list(messages)
        prompts = []
        for conversation in conversations:
            text = render_chat(
                self.tokenizer,
                conversation,
                add_generation_prompt,
                continue_final_message,
                chat_template,
                chat_template_kwargs,
                tools,
            )
            # the rendered template already holds the special tokens the model expects
            prompts.append(ProcessedPrompt(text, self.input_processor.tokenize(text, add_special_tokens=False)))
        params = self._params_per_prompt(len(prompts), sampling_params)
        if reasoning_parser in READS_SPECIAL_TOKENS:  # harmony's channels are special tokens
            params = [_keeping_special_tokens(p) for p in params]
        outputs = self._run(prompts, params, use_tqdm)
        if reasoning_parser is not None:
            for output, output_params in zip(outputs, params):
                # a grammar holds the reply from its first token: it has no reasoning
                if output_params.structured_outputs is None:
                    _split_reasoning(output, reasoning_parser, self.tokenizer)
        return outputs

    def _params_per_prompt(self, num_prompts: int, sampling_params) -> list[SamplingParams]:
        """One SamplingParams per prompt from what the caller gave: none (the defaults), one for all, or a
        list of one each."""
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * num_prompts
        if len(sampling_params) != num_prompts:
            raise ValueError(f"got {num_prompts} prompts but {len(sampling_params)} sampling params")
        return list(sampling_params)

    def _run(self, prompts: list, sampling_params, use_tqdm: bool) -> list[RequestOutput]:
        checked = []
        for i, (prompt, params) in enumerate(zip(prompts, self._params_per_prompt(len(prompts), sampling_params))):
            try:
                checked.append(self._check(prompt, params))
            except ValueError as e:
                raise ValueError(f"prompt {i}: {e}") from None
        parents = [self._submit(prompt, params) for prompt, params in checked]
        return self._run_until_done(parents, use_tqdm)

    def _run_until_done(self, parents: list[ParentRequest], use_tqdm: bool) -> list[RequestOutput]:
        """Step until every request has finished; each request's output is made as it finishes, while the
        device runs the next step, rather than all at the end."""
        index = {id(parent): i for i, parent in enumerate(parents)}
        outputs: list[RequestOutput | None] = [None] * len(parents)
        with tqdm(total=len(parents), desc="Generating", dynamic_ncols=True, disable=not use_tqdm) as bar:
            while self.has_unfinished_requests():
                finished = [parent for parent in self._advance() if parent.finished]
                for parent in finished:
                    outputs[index[id(parent)]] = parent.output()
                bar.update(len(finished))
        # any request that finished without a step of its own still gets its output
        return [output or parent.output() for output, parent in zip(outputs, parents)]


def _keeping_special_tokens(params: SamplingParams) -> SamplingParams:
    """A copy of `params` whose text keeps the special tokens."""
    kept = copy.copy(params)
    kept.skip_special_tokens = False
    return kept


def _split_reasoning(output: RequestOutput, parser: str, tokenizer) -> None:
    """Each completion of `output` split into its `reasoning_content` and its answer (`text`)."""
    for completion in output.outputs:
        reasoning, answer = split_reasoning(completion.text, parser, completion.token_ids, tokenizer)
        completion.reasoning_content, completion.text = reasoning, answer or ""
