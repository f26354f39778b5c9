"""The engine loop: tokenize, schedule, run, record — until every request is done."""

import json
import os
from time import perf_counter

from tqdm.auto import tqdm
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from nanovllm.config import Config
from nanovllm.engine.detokenizer import IncrementalDetokenizer
from nanovllm.engine.model_runner import ModelRunner
from nanovllm.engine.scheduler import Scheduler
from nanovllm.engine.sequence import Sequence
from nanovllm.engine.worker import TensorParallelRunner
from nanovllm.sampling_params import SamplingParams

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")

Prompt = str | list[int]


def load_tokenizer(model: str) -> PreTrainedTokenizerBase:
    """The folder's tokenizer, or FileNotFoundError when it has no tokenizer files."""
    if not any(os.path.isfile(os.path.join(model, name)) for name in _TOKENIZER_FILES):
        raise FileNotFoundError(f"no tokenizer files ({', '.join(_TOKENIZER_FILES)}) in {model!r}")
    return AutoTokenizer.from_pretrained(model)


def _as_ids(value) -> set[int]:
    if value is None:
        return set()
    return {value} if isinstance(value, int) else set(value)


def eos_token_ids(model: str, hf_config, tokenizer: PreTrainedTokenizerBase | None) -> tuple[int, ...]:
    """Every id that ends a completion: the tokenizer's, the config's and the generation config's."""
    ids = _as_ids(getattr(hf_config, "eos_token_id", None))
    if tokenizer is not None:
        ids |= _as_ids(tokenizer.eos_token_id)
    path = os.path.join(model, "generation_config.json")
    if os.path.isfile(path):
        with open(path) as f:
            ids |= _as_ids(json.load(f).get("eos_token_id"))
    return tuple(sorted(ids))


class LLMEngine:
    """Owns the tokenizer, the scheduler and the model runner, and drives them step by step.

    With `tensor_parallel_size > 1` the runner also owns worker processes;
    `close()`, deleting the engine or leaving the interpreter stops them.
    """

    def __init__(self, model: str, **kwargs):
        self.config = Config.from_kwargs(model, **kwargs)
        self.tokenizer = None if self.config.skip_tokenizer_init else load_tokenizer(model)
        self.config.eos_token_ids = eos_token_ids(model, self.config.hf_config, self.tokenizer)
        runner_class = TensorParallelRunner if self.config.tensor_parallel_size > 1 else ModelRunner
        self.model_runner = runner_class(self.config)
        self.scheduler = Scheduler(self.config)

    def close(self) -> None:
        """Stop tensor-parallel workers now rather than when the engine is collected."""
        self.model_runner.close()

    def tokenize(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt given as text or as ids, checked against the vocabulary."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("skip_tokenizer_init=True: prompts must be lists of token ids, not text")
            token_ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            token_ids = list(prompt)
            vocab_size = self.config.hf_config.vocab_size
            bad = [t for t in token_ids if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
        else:
            raise ValueError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        if not token_ids:
            raise ValueError("the prompt is empty; give at least one token")
        return token_ids

    def check_params(self, sampling_params: SamplingParams) -> None:
        """Refuse settings that name tokens outside this model's vocabulary."""
        if not isinstance(sampling_params, SamplingParams):
            raise ValueError(f"sampling params must be a SamplingParams, got {type(sampling_params).__name__}")
        if sampling_params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer, but skip_tokenizer_init=True; use stop_token_ids")
        vocab_size = self.config.hf_config.vocab_size
        bad = [t for t in sampling_params.stop_token_ids if t >= vocab_size]
        if bad:
            raise ValueError(f"stop_token_ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
        if sampling_params.logprobs is not None and sampling_params.logprobs > vocab_size:
            raise ValueError(f"logprobs={sampling_params.logprobs} asks for more alternatives than the "
                             f"vocabulary's {vocab_size} tokens")

    def check_fits(self, token_ids: list[int], sampling_params: SamplingParams) -> None:
        """Refuse up front a request that could never finish within the model or the KV cache."""
        config = self.config
        if len(token_ids) > config.max_model_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens but max_model_len is {config.max_model_len}; "
                f"shorten the prompt or raise max_model_len"
            )
        final_len = min(len(token_ids) + sampling_params.max_tokens, config.max_model_len)
        blocks = (final_len + config.kvcache_block_size - 1) // config.kvcache_block_size
        if blocks > config.num_kvcache_blocks:
            raise ValueError(
                f"the request needs {blocks} KV-cache blocks ({final_len} tokens) but the cache holds only "
                f"{config.num_kvcache_blocks}; lower max_tokens or give the KV cache more memory "
                f"(num_kvcache_blocks, cpu_kvcache_gb or gpu_memory_utilization)"
            )

    def make_sequence(self, prompt: Prompt, sampling_params: SamplingParams) -> Sequence:
        """A checked, not yet queued sequence; ValueError if the request cannot be served."""
        self.check_params(sampling_params)
        token_ids = self.tokenize(prompt)
        self.check_fits(token_ids, sampling_params)
        detokenizer = None if self.tokenizer is None else IncrementalDetokenizer(
            self.tokenizer, len(token_ids), sampling_params.skip_special_tokens)
        return Sequence(token_ids, sampling_params, self.config.kvcache_block_size, detokenizer)

    def add_request(self, prompt: Prompt, sampling_params: SamplingParams) -> Sequence:
        """Queue one request; a request that cannot be served raises ValueError and queues nothing."""
        seq = self.make_sequence(prompt, sampling_params)
        self.scheduler.add(seq)
        return seq

    def step(self) -> tuple[list[Sequence], int]:
        """Run one step; returns the sequences it finished and its token count
        (positive for a prefill or mixed step, minus the batch size for a decode)."""
        batch = self.scheduler.schedule()
        num_tokens = sum(batch.num_scheduled_tokens) if batch.is_prefill else -len(batch.seqs)
        token_ids, logprobs = self.model_runner.run(batch)
        self.scheduler.postprocess(batch, token_ids, logprobs)
        return [seq for seq in batch.seqs if seq.is_finished], num_tokens

    def is_finished(self) -> bool:
        return self.scheduler.is_finished()

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
        seqs = []
        for i, (prompt, params) in enumerate(zip(prompts, sampling_params)):
            try:
                seqs.append(self.make_sequence(prompt, params))
            except ValueError as e:
                raise ValueError(f"prompt {i}: {e}") from None
        for seq in seqs:
            self.scheduler.add(seq)
        self._run_until_done(len(seqs), use_tqdm)
        return [self.output(seq) for seq in seqs]

    @staticmethod
    def output(seq: Sequence) -> dict:
        """What `generate` returns for one sequence."""
        out = {"text": seq.output_text, "token_ids": seq.completion_token_ids, "finish_reason": seq.finish_reason}
        if seq.params.logprobs is not None:
            out["logprobs"] = seq.logprobs
        return out

    def _run_until_done(self, total: int, use_tqdm: bool) -> None:
        with tqdm(total=total, desc="Generating", dynamic_ncols=True, disable=not use_tqdm) as bar:
            prefill_tps = decode_tps = 0.0
            while not self.is_finished():
                start = perf_counter()
                finished, num_tokens = self.step()
                elapsed = perf_counter() - start
                if num_tokens > 0:
                    prefill_tps = num_tokens / elapsed
                else:
                    decode_tps = -num_tokens / elapsed
                bar.set_postfix_str(f"prefill {prefill_tps:,.0f} tok/s, decode {decode_tps:,.0f} tok/s")
                bar.update(len(finished))
