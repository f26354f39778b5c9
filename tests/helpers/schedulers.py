"""Schedulers on a stand-in config of 4-token blocks, and requests for them."""

from types import SimpleNamespace

from nanovllm.core.request import Request
from nanovllm.core.scheduler import Scheduler
from nanovllm.sampling_params import SamplingParams

BS = 4  # tokens per KV block
EOS = 1


def make_scheduler(
    num_blocks=16, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64, chunked=False, prefix_caching=True
):
    """A scheduler of `num_blocks` blocks; the other arguments set its config's fields."""
    config = SimpleNamespace(
        max_num_seqs=max_num_seqs,
        token_budget=max_num_batched_tokens,
        context_len=max_model_len,
        enable_chunked_prefill=chunked,
        kv_block_size=BS,
        device_type="cpu",
        speculative=None,
        enable_prefix_caching=prefix_caching,
    )
    return Scheduler(config, num_blocks, (EOS,))


def make_req(request_id, token_ids, **params):
    """A request of `token_ids` whose SamplingParams take `params` (max_tokens 100 unless given)."""
    params.setdefault("max_tokens", 100)
    return Request(request_id, list(token_ids), SamplingParams(**params), BS)
