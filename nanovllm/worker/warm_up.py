"""Start-up steps: made-up requests run through the model before serving, on CUDA.

`warm_up` runs before the KV cache is sized: the largest prefill the config
allows and sampling at the most rows a step samples set the activation peak
the sizing leaves room for, and the kernels that compile on first use compile
then rather than under a request. `warm_up_cached_prefix` runs once the cache
is bound, for the prefill kernel's variant that reads a cached prefix. A
start-up step's requests have no blocks unless given some: they store nothing.
"""

from collections.abc import Callable

import torch

from nanovllm.config import Config
from nanovllm.core.scheduler_output import SchedulerOutput
from nanovllm.sample.metadata import SamplingTensors
from nanovllm.sample.sampler import Sampler
from nanovllm.sampling_params import SamplingParams

# runs one start-up step to its end and forgets its samples (the runner's `_run_start_up_step`)
StartUpRunner = Callable[[SchedulerOutput], None]


def start_up_step(
    token_ids: list[list[int]], num_computed_tokens: list[int], block_tables: list[list[list[int]]]
) -> SchedulerOutput:
    """A step of made-up requests that each compute `token_ids[i]` and sample (start-up compiles and sizing);
    `block_tables[i]` holds request i's table of each cache group."""
    n = len(token_ids)
    req_ids = [f"start-up-{i}" for i in range(n)]
    return SchedulerOutput(
        req_ids,
        token_ids,
        num_computed_tokens,
        block_tables,
        [True] * n,
        req_ids,
        [SamplingParams(temperature=1.0, max_tokens=1)] * n,
        [0] * n,
    )


def warm_up(run: StartUpRunner, sampler: Sampler, config: Config, max_sampling_rows: int, device: torch.device) -> None:
    """The steps whose peak the KV-cache sizing must leave room for: the largest prefill the config allows,
    and sampling for the most rows a step samples (the largest decode batch, or its drafts too); the peak
    memory statistics are reset first, so that they hold this peak."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    # no step holds more than max_num_batched_tokens tokens: a longer prompt is chunked
    max_len = min(config.context_len, config.token_budget)
    num_seqs = max(1, min(config.token_budget // max_len, config.max_num_seqs))
    no_blocks = [[] for _ in config.kv_layout.groups]  # an empty table per cache group: nothing is stored
    run(start_up_step([[0] * max_len] * num_seqs, [0] * num_seqs, [no_blocks] * num_seqs))
    # kernels whose tiles depend on the token count (a mixture of experts' grouped GEMMs) compile now, one
    # prompt per power of two, rather than in the middle of the first step of each size, which the compile stalls
    for num_tokens in _powers_of_two(16, max_len // 2):
        run(start_up_step([[0] * num_tokens], [0], [no_blocks]))
    _warm_up_sampler(sampler, max_sampling_rows, config.model_config.vocab_size, config.torch_dtype, device)
    torch.cuda.empty_cache()


def warm_up_cached_prefix(run: StartUpRunner, num_groups: int) -> None:
    """A step over a cached prefix, once the cache of `num_groups` cache groups is bound."""
    # The prefill kernel has a second variant for queries over a cached prefix
    # (prefix-cache hits, and every mixed step of decodes and prompt chunks);
    # compile it now rather than in the middle of the first request that needs it.
    # Every group's table is block 0, which the first request to get it overwrites before reading it.
    run(start_up_step([[0, 0]], [1], [[[0]] * num_groups]))


def _warm_up_sampler(sampler: Sampler, rows: int, vocab_size: int, dtype: torch.dtype, device: torch.device) -> None:
    """The sampler over `rows` rows of zero logits: plain, then with every truncation and logprobs, then with
    a grammar mask."""
    logits = torch.zeros(rows, vocab_size, dtype=dtype, device=device)  # [rows, vocab]
    ones = torch.ones(rows, device=device)  # [rows]
    sampler(logits, SamplingTensors(temperatures=ones))
    # the truncation, logprobs and grammar-mask kernels compile now rather than under the first request
    # that asks for them, which would wait for the compile with the device idle
    truncating = dict(top_k=ones.long(), top_p=ones / 2, min_p=ones / 10, num_logprobs=1)
    sampler(logits, SamplingTensors(temperatures=ones, **truncating))
    words = (vocab_size + 31) // 32
    masking = dict(
        bitmask=torch.full((rows, words), -1, dtype=torch.int32, device=device),  # [rows, words]
        bitmask_rows=torch.zeros(1, dtype=torch.int32, device=device),  # [1]
    )
    sampler(logits, SamplingTensors(temperatures=ones, **masking))


def _powers_of_two(low: int, high: int) -> list[int]:
    """The powers of two from `low` to `high`, both included where they are powers of two."""
    return [1 << e for e in range(low.bit_length() - 1, high.bit_length()) if low <= 1 << e <= high]
