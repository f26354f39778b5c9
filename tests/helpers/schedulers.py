"""Schedulers on a stand-in config of 4-token blocks, and requests for them."""

from types import SimpleNamespace

from nanovllm.cache.layout import CacheLayout, cache_layout
from nanovllm.cache.specs import FullAttention
from nanovllm.core.request import Request
from nanovllm.core.scheduler import Scheduler
from nanovllm.sampling_params import SamplingParams

BS = 4  # tokens per KV block
EOS = 1


# two layers of full attention: one cache group
FULL_ATTENTION = cache_layout((FullAttention(1, 8),) * 2)


def make_scheduler(
    num_blocks=16,
    max_num_seqs=8,
    max_num_batched_tokens=64,
    max_model_len=64,
    chunked=False,
    prefix_caching=True,
    layout: CacheLayout = FULL_ATTENTION,
    lookback=0,
    num_state_slots=0,
    conservativeness=0.0,
    speculative=None,
):
    """A scheduler of `num_blocks` blocks for the cache groups of `layout`; the other arguments set its
    config's fields (`speculative`: a SpeculativeConfig, whose proposer the caller sets). It admits while
    prompts fit (`conservativeness` 0) unless told otherwise."""
    config = SimpleNamespace(
        max_num_seqs=max_num_seqs,
        token_budget=max_num_batched_tokens,
        context_len=max_model_len,
        enable_chunked_prefill=chunked,
        kv_block_size=BS,
        device_type="cpu",
        speculative=speculative,
        enable_prefix_caching=prefix_caching,
        kv_layout=layout,
        kv_lookback=lookback,
        schedule_conservativeness=conservativeness,
    )
    return Scheduler(config, num_blocks, (EOS,), num_state_slots=num_state_slots)


def make_req(request_id, token_ids, **params):
    """A request of `token_ids` whose SamplingParams take `params` (max_tokens 100 unless given)."""
    params.setdefault("max_tokens", 100)
    return Request(request_id, list(token_ids), SamplingParams(**params), BS)


def block_hash(manager, block_id):
    """The prefix hash block `block_id` is registered under, -1 while it is not."""
    key = manager.blocks[block_id].key
    return -1 if key is None else key[1]


def held_blocks(manager):
    """Ids of the blocks some request holds."""
    return {block.block_id for block in manager.blocks if block.ref_count > 0}


def hit_blocks(manager, req, group=0):
    """The blocks of `group` that the prefix cache would give `req`."""
    return manager.cached_prefix(req).tables[group]
