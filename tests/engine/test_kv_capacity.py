"""The capacity an engine reports, on tiny models of each kind of cache, against what their specs say: blocks
of one size for every cache group, sliding groups holding their window, two state slots per sequence."""

import pytest

from nanovllm import LLM

from helpers.gemma_models import WINDOW, save_gemma3
from helpers.qwen3_5_models import FIELDS, LAYER_TYPES, save_qwen3_5

BS = 16
MAX_MODEL_LEN = 256
GIB = 1 << 30
CACHE_GB = 0.002  # 2,147,483 bytes
# tiny models: 2 KV heads of 16 values, fp32
TOKEN_LAYER_BYTES = 2 * 2 * 16 * 4  # K and V of one token in one layer


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory):
    return save_gemma3(tmp_path_factory.mktemp("tiny-gemma3"))


@pytest.fixture(scope="module")
def qwen3_5_dir(tmp_path_factory):
    return save_qwen3_5(tmp_path_factory.mktemp("tiny-qwen3_5"))


def engine_info(model_dir, **kwargs):
    llm = LLM(model_dir, block_size=BS, max_model_len=MAX_MODEL_LEN, cpu_kvcache_gb=CACHE_GB, **kwargs)
    info = llm.client.info
    llm.close()
    return info


def test_gemma3_blocks_hold_one_layer_each_and_sliding_layers_only_their_window(gemma3_dir):
    # five sliding layers to one global: six cache groups of one layer, so a block is 16 tokens of one layer
    info = engine_info(gemma3_dir)
    assert info.num_kvcache_blocks == int(CACHE_GB * GIB) // (BS * TOKEN_LAYER_BYTES)
    full_blocks = MAX_MODEL_LEN // BS
    # a decoding sequence reads the window's 24 positions, which span at most 3 blocks of 16
    window_blocks = (WINDOW + BS - 1) // BS + 1
    per_sequence = full_blocks + 5 * window_blocks
    assert info.max_concurrency == pytest.approx(info.num_kvcache_blocks / per_sequence)
    sliding, full = info.kv_groups
    assert (sliding.kind, sliding.num_layers) == (f"sliding window {WINDOW}", 5)
    assert (full.kind, full.num_layers) == ("full attention", 1)
    assert full.tokens == int(info.max_concurrency * full_blocks) * BS
    assert info.max_request_tokens == MAX_MODEL_LEN


def test_keeping_every_token_holds_fewer_sequences_by_what_the_windows_save(gemma3_dir):
    grouped = engine_info(gemma3_dir)
    every = engine_info(gemma3_dir, disable_hybrid_kv_cache_manager=True)
    # one group of all six layers: blocks six times the size, each sequence holding all 16 of them
    assert every.num_kvcache_blocks == int(CACHE_GB * GIB) // (BS * 6 * TOKEN_LAYER_BYTES)
    assert every.max_concurrency == pytest.approx(every.num_kvcache_blocks / (MAX_MODEL_LEN // BS))
    assert [(g.kind, g.num_layers) for g in every.kv_groups] == [("full attention", 6)]
    # 6 x 16 layer-blocks a sequence against 16 + 5 x 3
    assert grouped.max_concurrency / every.max_concurrency == pytest.approx(96 / 31, rel=0.02)


def test_qwen3_5_slots_take_the_budgets_share_two_states_take_of_a_sequence(qwen3_5_dir):
    info = engine_info(qwen3_5_dir, max_num_seqs=64)
    linear_layers = LAYER_TYPES.count("linear_attention")
    nk, nv, dk, dv = (
        FIELDS[f"linear_{name}"] for name in ("num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim")
    )
    conv_channels, conv_width = 2 * nk * dk + nv * dv, FIELDS["linear_conv_kernel_dim"] - 1
    slot_bytes = linear_layers * (conv_channels * conv_width + nv * dk * dv) * 4  # conv state and fp32 state
    full_layers = len(LAYER_TYPES) - linear_layers
    block_bytes = BS * full_layers * TOKEN_LAYER_BYTES
    budget = int(CACHE_GB * GIB)
    slots = min(3 * 64, 2 * budget // ((MAX_MODEL_LEN // BS) * block_bytes + 2 * slot_bytes))
    assert info.num_state_slots == slots
    assert info.num_kvcache_blocks == (budget - slots * slot_bytes) // block_bytes
    assert info.max_concurrency == pytest.approx(min(info.num_kvcache_blocks / (MAX_MODEL_LEN // BS), slots))
    assert [(g.kind, g.num_layers) for g in info.kv_groups] == [("full attention", full_layers)]
