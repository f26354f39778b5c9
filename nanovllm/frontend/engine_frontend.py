"""What every front end holds: the config, the tokenizer, an engine client and the two processors."""

import logging
import time
from contextlib import suppress
from dataclasses import replace
from itertools import count

from transformers import PreTrainedTokenizerBase

from nanovllm.config import Config
from nanovllm.core.structured_output import grammar_vocabulary
from nanovllm.engine.data_parallel_client import DataParallelClient
from nanovllm.engine.engine_client import EngineClient, EngineDeadError
from nanovllm.engine.messages import EngineCoreRequest
from nanovllm.frontend.generation_defaults import generation_config_path, generation_defaults
from nanovllm.frontend.input_processor import InputProcessor, ProcessedPrompt, Prompt
from nanovllm.frontend.model_source import resolve_model
from nanovllm.frontend.output_processor import OutputProcessor, ParentRequest, RequestState
from nanovllm.frontend.start_up_log import log_start_up
from nanovllm.frontend.token_texts import TokenTexts
from nanovllm.frontend.tokenizer import eos_token_ids, load_tokenizer
from nanovllm.sampling_params import INT64_MIN, SamplingParams
from nanovllm.utils.heap import freeze_start_up_objects
from nanovllm.utils.log_setup import configure_logging


def completion_seed(seed: int, index: int) -> int:
    """Completion `index`'s seed: seed + index, wrapped around within signed 64 bits."""
    return (seed + index - INT64_MIN) % (1 << 64) + INT64_MIN


def completion_params(params: SamplingParams, index: int) -> SamplingParams:
    """The settings of completion `index` of a request: one completion each, seed + index when seeded,
    logprobs computed when a best_of ranking needs them, prompt logprobs by the first only."""
    if params.num_completions == 1:
        return params
    ranks = params.num_completions > params.n
    return replace(
        params,
        n=1,
        best_of=None,
        seed=None if params.seed is None else completion_seed(params.seed, index),
        logprobs=0 if ranks and params.logprobs is None else params.logprobs,
        prompt_logprobs=params.prompt_logprobs if index == 0 else None,
    )


logger = logging.getLogger(__name__)


class EngineFrontend:
    """Text on this side, token ids on the engine core's.

    Starts the core for `model`, a model folder or a Hugging Face Hub id (`resolve_model`), with the
    `Config` fields as keywords (an unknown one is a ValueError that names it), through a client
    of `client_class` (a `DataParallelClient` of several core processes with data_parallel_size > 1), which it
    talks to from then on, and logs what started (`log_start_up`).
    `eos_token_ids` are the end-of-sequence ids found in the folder, which the core stops on.
    """

    def __init__(self, model: str, client_class: type[EngineClient], **kwargs):
        configure_logging()
        start = time.perf_counter()
        self.config = Config.from_kwargs(resolve_model(model), **kwargs)
        if self.config.node_rank != 0:
            raise ValueError(
                f"node_rank={self.config.node_rank} runs no engine, only its share of the ranks: start that node with "
                "`nanovllm serve MODEL --headless --node-rank K ...` and this engine with node_rank=0"
            )
        # what requests that leave a sampling value out get: the generation config's, if it has one
        self.sampling_defaults = generation_defaults(self.config)
        if self.sampling_defaults:
            logger.info(
                "sampling defaults from %s: %s; requests that set a value keep theirs (generation_config='vllm', "
                "or --generation-config vllm, turns these off)",
                generation_config_path(self.config),
                ", ".join(f"{key}={value}" for key, value in self.sampling_defaults.items()),
            )
        self.tokenizer = load_tokenizer(self.config)
        self.eos_token_ids = eos_token_ids(self.config, self.tokenizer)
        vocabulary = (
            None
            if self.tokenizer is None
            else grammar_vocabulary(self.tokenizer, self.config.model_config.vocab_size, self.eos_token_ids)
        )
        if self.config.data_parallel_size > 1:
            client_class = DataParallelClient  # each replica's core in a process of its own
        self.client = client_class(self.config, self.eos_token_ids, vocabulary)
        self.input_processor = InputProcessor(self.tokenizer, self.client.info)
        self.token_texts = (
            None if self.tokenizer is None else TokenTexts(self.tokenizer, self.config.model_config.vocab_size)
        )
        self.output_processor = OutputProcessor()
        self._request_ids = count()
        log_start_up(model, self.config, self.client.info, time.perf_counter() - start)
        freeze_start_up_objects()

    def get_default_sampling_params(self) -> SamplingParams:
        """The settings of a request that sets none: the engine's defaults, with the generation config's
        sampling values over them."""
        return SamplingParams(**self.sampling_defaults)

    def get_tokenizer(self) -> PreTrainedTokenizerBase | None:
        """The model folder's tokenizer (None with skip_tokenizer_init)."""
        return self.tokenizer

    def _check(
        self, prompt: Prompt | ProcessedPrompt, params: SamplingParams
    ) -> tuple[ProcessedPrompt, SamplingParams]:
        """The checked prompt and settings; ValueError if the request cannot be served."""
        return self.input_processor.process(prompt, params)

    def _submit(self, prompt: ProcessedPrompt, params: SamplingParams) -> ParentRequest:
        """Hand a checked request to the core, one core request per completion; returns its state."""
        request_id = str(next(self._request_ids))
        completions = []
        for index in range(params.num_completions):
            core_id = request_id if params.num_completions == 1 else f"{index}_{request_id}"
            completions.append(
                RequestState(
                    core_id,
                    index,
                    prompt.token_ids,
                    completion_params(params, index),
                    self.tokenizer,
                    show_logprobs=params.logprobs is not None,
                    token_texts=self.token_texts,
                )
            )
        parent = ParentRequest(request_id, prompt.text, prompt.token_ids, params, completions)
        self.output_processor.add_request(parent)
        sent = []
        try:
            for completion in completions:
                self.client.add_request(EngineCoreRequest(completion.request_id, prompt.token_ids, completion.params))
                sent.append(completion.request_id)
        except BaseException:
            # all of the request or none of it: the completions already sent are dropped again
            self.output_processor.finish(request_id, "abort")
            if sent:
                with suppress(EngineDeadError):
                    self.client.abort(sent)
            raise
        return parent

    def _abort(self, request_id: str) -> ParentRequest | None:
        """End a live request with "abort" and drop its completions in the core; None if it already ended."""
        parent, dropped = self.output_processor.finish(request_id, "abort")
        if dropped:
            with suppress(EngineDeadError):  # a core that is gone runs nothing more anyway
                self.client.abort(dropped)
        return parent
