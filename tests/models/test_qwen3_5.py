"""Qwen3.5 against transformers' own class on a tiny random model (three Gated DeltaNet layers to one gated
full-attention layer, twice): the config's fields and cache specs; the model run directly on hand-made
caches (a packed prefill of several prompts from zero states, a prompt in two chunks and then token-by-token
decode from the states the chunks left in their slots) gives transformers' logits; a Gated DeltaNet split
over two ranks adds up to the whole one; and the engine's greedy tokens equal transformers' in small prefill
chunks, in a second turn read from the prefix cache, through preemption, from an image-text checkpoint and
at two ranks."""

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoConfig, Qwen3_5ForCausalLM, Qwen3_5TextConfig

from nanovllm import LLM
from nanovllm.cache.specs import FullAttention, RecurrentState
from nanovllm.layers import linear
from nanovllm.layers.attention import Attention
from nanovllm.layers.fp8_linear import store_fp8_weights
from nanovllm.layers.gated_delta_net import GatedDeltaNet
from nanovllm.layers.recurrent_state import RecurrentLayer
from nanovllm.models.blocks import DecoderForCausalLM
from nanovllm.models.model_config import ModelConfig
from nanovllm.utils.context import Context, forward_context
from nanovllm.utils.loader import load_model
from nanovllm.utils.parallel import tensor_parallel
from nanovllm.worker.kv_cache import LayerKVCache

from helpers.family_checks import (
    ENGINE,
    GREEDY,
    assert_preempted_requests_match_transformers,
    assert_second_turn_matches_transformers,
    greedy,
)
from helpers.hf_reference import hf_greedy
from helpers.prompts import random_prompts
from helpers.qwen3_5_models import LAYER_TYPES, save_qwen3_5, save_qwen3_5_image_text

CONV_CHANNELS = 2 * 2 * 16 + 4 * 8  # q and k of two key heads, v of four value heads
BLOCK_SIZE = 16


@pytest.fixture(scope="module")
def qwen3_5_dir(tmp_path_factory):
    return save_qwen3_5(tmp_path_factory.mktemp("tiny-qwen3_5"))


@pytest.fixture(scope="module")
def qwen3_5_image_text_dir(tmp_path_factory):
    return save_qwen3_5_image_text(tmp_path_factory.mktemp("tiny-qwen3_5-image-text"))


@pytest.fixture(scope="module")
def hf_model(qwen3_5_dir):
    return Qwen3_5ForCausalLM.from_pretrained(qwen3_5_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def model_config(qwen3_5_dir) -> ModelConfig:
    return ModelConfig.from_hf(AutoConfig.from_pretrained(qwen3_5_dir))


def our_model(model_dir: str, model_config: ModelConfig) -> DecoderForCausalLM:
    model = DecoderForCausalLM(model_config)
    load_model(model, model_dir)
    return model.eval()


def hf_logits(hf_model, tokens: list[int]) -> torch.Tensor:
    """transformers' logits [len(tokens), vocab] for one sequence from its start."""
    with torch.inference_mode():
        return hf_model(torch.tensor([tokens])).logits[0]


def test_the_config_names_the_layer_kinds_their_sizes_and_cache_specs(model_config):
    assert model_config.layer_types == tuple(LAYER_TYPES)
    state = RecurrentState(shapes=((CONV_CHANNELS, 3), (4, 16, 8)), dtypes=(None, "float32"))
    assert model_config.layer_specs == ((state,) * 3 + (FullAttention(2, 16),)) * 2
    assert model_config.rotary_dim == 4  # a quarter of each 16-dimensional head
    assert model_config.attn_output_gate and model_config.qk_norm and model_config.norm_unit_offset
    sizes = (
        model_config.linear_num_key_heads,
        model_config.linear_num_value_heads,
        model_config.linear_key_head_dim,
        model_config.linear_value_head_dim,
        model_config.linear_conv_kernel_dim,
    )
    assert sizes == (2, 4, 16, 8, 4)


def test_transformers_defaults_and_ours_agree():
    hf = Qwen3_5TextConfig(architectures=["Qwen3_5ForCausalLM"])
    ours = ModelConfig.from_hf(SimpleNamespace(architectures=hf.architectures))
    assert ModelConfig.from_hf(hf) == ours
    assert ours.layer_types[:4] == ("linear_attention",) * 3 + ("full_attention",) and ours.rotary_dim == 64


def test_an_image_text_checkpoint_reads_its_text_config_and_skips_the_vision_tower():
    text_config = SimpleNamespace(num_hidden_layers=2, full_attention_interval=2, linear_num_value_heads=16)
    config = ModelConfig.from_hf(
        SimpleNamespace(architectures=["Qwen3_5ForConditionalGeneration"], text_config=text_config)
    )
    assert config.layer_types == ("linear_attention", "full_attention") and config.linear_num_value_heads == 16
    assert config.checkpoint_names.prefixes["model.language_model."] == "model."
    assert config.checkpoint_names.prefixes["model.visual."] is None


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"linear_num_value_heads": 3}, "multiple of linear_num_key_heads"),
        ({"linear_conv_kernel_dim": 1}, "at least 2"),
        ({"layer_types": ["linear_attention", "sliding_attention"]}, "layer_types must name 2 layers"),
    ],
)
def test_sizes_and_layer_types_the_layers_cannot_run_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf(SimpleNamespace(architectures=["Qwen3_5ForCausalLM"], num_hidden_layers=2, **fields))


class HandMadeCaches:
    """`model`'s caches, made by hand: `num_seqs` sequences, sequence i in state slot i and in its own run of
    contiguous blocks; the model is stepped with contexts built as the runner builds them."""

    def __init__(self, model: DecoderForCausalLM, num_seqs: int, blocks_per_seq: int = 4):
        self.model, self.blocks_per_seq = model, blocks_per_seq
        for layer in model.modules():
            if isinstance(layer, RecurrentLayer):
                conv = torch.zeros(num_seqs + 1, CONV_CHANNELS, 3)
                layer.bind_state_cache((conv, torch.zeros(num_seqs + 1, 4, 16, 8)))
            elif isinstance(layer, Attention):
                shape = (num_seqs * blocks_per_seq, BLOCK_SIZE, layer.num_kv_heads, layer.head_dim)
                layer.bind_kv_cache(LayerKVCache(torch.zeros(shape), torch.zeros(shape)))
        tables = torch.arange(num_seqs * blocks_per_seq, dtype=torch.int32).view(num_seqs, blocks_per_seq)
        self.block_tables = tables

    def _slots(self, seq: int, positions: list[int]) -> list[int]:
        return [seq * self.blocks_per_seq * BLOCK_SIZE + p for p in positions]  # the sequence's blocks are contiguous

    def prefill(self, chunks: list[tuple[int, list[int], int]]) -> torch.Tensor:
        """Logits [tokens, vocab] of one varlen step of (sequence, new tokens, position of the first) chunks."""
        seqs = [seq for seq, _, _ in chunks]
        lengths_q = [len(tokens) for _, tokens, _ in chunks]
        lengths_k = [start + len(tokens) for _, tokens, start in chunks]
        positions = [list(range(start, start + len(tokens))) for _, tokens, start in chunks]
        context = Context(
            is_prefill=True,
            slot_mapping=torch.tensor([s for seq, p in zip(seqs, positions) for s in self._slots(seq, p)]),
            cu_seqlens_q=_cumulative(lengths_q),
            cu_seqlens_k=_cumulative(lengths_k),
            max_seqlen_q=max(lengths_q),
            max_seqlen_k=max(lengths_k),
            seqlens_q=lengths_q,
            seqlens_k=lengths_k,
            block_tables=self.block_tables[seqs] if any(start for _, _, start in chunks) else None,
            state_slots=torch.tensor(seqs),
        )
        tokens = [t for _, chunk, _ in chunks for t in chunk]
        return self._run(context, tokens, [p for chunk in positions for p in chunk])

    def decode(self, rows: list[tuple[int, int, int]]) -> torch.Tensor:
        """Logits [rows, vocab] of one decode step of (sequence, token, its position) rows."""
        seqs = [seq for seq, _, _ in rows]
        positions = [position for _, _, position in rows]
        context = Context(
            is_prefill=False,
            slot_mapping=torch.tensor([self._slots(seq, [p])[0] for seq, p in zip(seqs, positions)]),
            context_lens=torch.tensor([p + 1 for p in positions], dtype=torch.int32),
            max_seqlen_k=max(positions) + 1,
            block_tables=self.block_tables[seqs],
            state_slots=torch.tensor(seqs),
        )
        return self._run(context, [token for _, token, _ in rows], positions)

    def _run(self, context: Context, tokens: list[int], positions: list[int]) -> torch.Tensor:
        with torch.inference_mode(), forward_context(context):
            return self.model.compute_logits(self.model(torch.tensor(tokens), torch.tensor(positions)))


def _cumulative(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def unbound_prefill(model: DecoderForCausalLM, prompts: list[list[int]]) -> torch.Tensor:
    """Logits of the prompts packed in one varlen step of a model whose caches are not bound yet (the runner's
    start-up step): every sequence from zero states, nothing stored."""
    lengths = [len(p) for p in prompts]
    context = Context(
        is_prefill=True,
        cu_seqlens_q=_cumulative(lengths),
        cu_seqlens_k=_cumulative(lengths),
        max_seqlen_q=max(lengths),
        max_seqlen_k=max(lengths),
        seqlens_q=lengths,
        seqlens_k=lengths,
    )
    positions = [p for n in lengths for p in range(n)]
    with torch.inference_mode(), forward_context(context):
        tokens = torch.tensor([t for p in prompts for t in p])
        return model.compute_logits(model(tokens, torch.tensor(positions)))


PROMPTS = random_prompts([5, 20, 37])


def test_prompts_packed_in_one_step_before_the_caches_exist_give_transformers_logits(
    qwen3_5_dir, model_config, hf_model
):
    logits = unbound_prefill(our_model(qwen3_5_dir, model_config), PROMPTS)
    for prompt, ours in zip(PROMPTS, logits.split([len(p) for p in PROMPTS])):
        torch.testing.assert_close(ours, hf_logits(hf_model, prompt), atol=1e-4, rtol=1e-4)


def test_prompts_in_slots_out_of_order_give_transformers_logits_and_leave_their_states(
    qwen3_5_dir, model_config, hf_model
):
    model = our_model(qwen3_5_dir, model_config)
    caches = HandMadeCaches(model, num_seqs=3)
    slots = [2, 0, 1]
    logits = caches.prefill([(slot, prompt, 0) for slot, prompt in zip(slots, PROMPTS)])
    for prompt, ours in zip(PROMPTS, logits.split([len(p) for p in PROMPTS])):
        torch.testing.assert_close(ours, hf_logits(hf_model, prompt), atol=1e-4, rtol=1e-4)
    layer = next(m for m in model.modules() if isinstance(m, GatedDeltaNet))
    # each slot holds its own sequence's state, the scratch slot (3) nothing
    assert all(layer.recurrent_state[slot].abs().sum() > 0 for slot in slots)
    assert layer.recurrent_state[3].abs().sum() == 0 and layer.conv_state[3].abs().sum() == 0


def test_chunks_then_decode_steps_continue_from_the_slots_and_give_transformers_logits(
    qwen3_5_dir, model_config, hf_model
):
    """Two sequences: each prompt in two chunks (the second of one in a step with the first of the other),
    then eight decode steps of both, their rows in the other order than their slots."""
    first, second = random_prompts([30, 19], seed=4)
    first_next, second_next = random_prompts([8, 8], seed=5)  # the tokens each decode step feeds
    caches = HandMadeCaches(our_model(qwen3_5_dir, model_config), num_seqs=2)
    chunks = [caches.prefill([(0, first[:13], 0)]), caches.prefill([(0, first[13:], 13), (1, second[:6], 0)])]
    chunks.append(caches.prefill([(1, second[6:], 6)]))
    prefill = torch.cat(chunks)  # first's 30 tokens, then second's 19
    steps = []
    for i, (a, b) in enumerate(zip(first_next, second_next)):
        steps.append(caches.decode([(1, b, len(second) + i), (0, a, len(first) + i)]))
    decode = torch.stack(steps)  # [steps, 2 rows, vocab]
    want_first = hf_logits(hf_model, first + first_next)
    want_second = hf_logits(hf_model, second + second_next)
    torch.testing.assert_close(prefill[:30], want_first[:30], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(prefill[30:], want_second[:19], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(decode[:, 1], want_first[30:], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(decode[:, 0], want_second[19:], atol=1e-4, rtol=1e-4)


def test_a_gated_delta_net_split_over_two_ranks_adds_up_to_the_whole(qwen3_5_dir, model_config, monkeypatch):
    """Each rank loads its heads' rows of the projections, convolution channels, A_log and dt_bias and
    out_proj's columns from the checkpoint; the ranks' partial outputs (before out_proj's all-reduce) sum to
    the unsplit layer's output, for a prefill and a decode step after it."""
    monkeypatch.setattr(linear.RowParallelLinear, "all_reduce", lambda self, y: y)
    torch.manual_seed(0)
    x = torch.randn(9, 64)
    outputs = []
    for rank, ranks in [(0, 1), (0, 2), (1, 2)]:
        with tensor_parallel(rank, ranks):
            layer = our_model(qwen3_5_dir, model_config).model.layers[0].linear_attn
        layer.bind_state_cache((torch.zeros(2, CONV_CHANNELS // ranks, 3), torch.zeros(2, 4 // ranks, 16, 8)))
        prefill = Context(is_prefill=True, cu_seqlens_q=_cumulative([8]), max_seqlen_q=8, state_slots=torch.tensor([0]))
        decode = Context(is_prefill=False, state_slots=torch.tensor([0]))
        with torch.inference_mode():
            with forward_context(prefill):
                y_prefill, _ = layer(x[:8], None)
            with forward_context(decode):
                y_decode, _ = layer(x[8:], None)
        outputs.append(torch.cat((y_prefill, y_decode)))
    whole, *parts = outputs
    torch.testing.assert_close(sum(parts), whole, atol=1e-5, rtol=1e-5)


ENGINE_PROMPTS = random_prompts([5, 20, 45], seed=6)


def test_greedy_tokens_in_small_prefill_chunks_equal_transformers(qwen3_5_dir):
    expected = hf_greedy(qwen3_5_dir, ENGINE_PROMPTS, GREEDY.max_tokens)
    assert greedy(qwen3_5_dir, ENGINE_PROMPTS, max_num_batched_tokens=16) == expected


@pytest.mark.gpu
def test_the_triton_kernels_give_transformers_tokens_on_the_gpu(qwen3_5_dir):
    """On CUDA the convolution and the delta rule run in the Triton kernels: whole prompts of up to 100 tokens
    (two 64-token chunks of the delta rule), prompts cut every 16 tokens, decode steps in CUDA graphs."""
    prompts = ENGINE_PROMPTS + random_prompts([100], seed=8)
    expected = hf_greedy(qwen3_5_dir, prompts, GREEDY.max_tokens)
    assert greedy(qwen3_5_dir, prompts, device="cuda") == expected
    assert greedy(qwen3_5_dir, prompts, device="cuda", max_num_batched_tokens=16) == expected


@pytest.mark.gpu
def test_a_second_turn_on_the_gpu_reads_the_first_from_the_prefix_cache(qwen3_5_dir):
    assert_second_turn_matches_transformers(qwen3_5_dir, device="cuda")


def test_a_second_turn_reads_the_first_from_the_prefix_cache(qwen3_5_dir):
    """The second turn resends the first's prompt and answer: it starts from the state snapshot at a block
    boundary of the first, reads those tokens' K/V from the cache, and gives transformers' tokens."""
    prompt, follow_up = random_prompts([40, 7], seed=7)
    llm = LLM(qwen3_5_dir, **ENGINE)
    [first] = llm.generate([prompt], GREEDY, use_tqdm=False)
    second_turn = prompt + first.outputs[0].token_ids + follow_up
    [second] = llm.generate([second_turn], GREEDY, use_tqdm=False)
    llm.close()
    assert second.num_cached_tokens > 0 and second.num_cached_tokens % ENGINE["block_size"] == 0
    assert second.outputs[0].token_ids == hf_greedy(qwen3_5_dir, [second_turn], GREEDY.max_tokens)[0]


def test_preempted_requests_resume_with_transformers_tokens(qwen3_5_dir):
    assert_preempted_requests_match_transformers(qwen3_5_dir)


def test_an_image_text_checkpoint_runs_as_its_language_model(qwen3_5_image_text_dir):
    expected = hf_greedy(qwen3_5_image_text_dir, ENGINE_PROMPTS, GREEDY.max_tokens)
    assert greedy(qwen3_5_image_text_dir, ENGINE_PROMPTS) == expected


@pytest.mark.slow
def test_two_ranks_equal_transformers(qwen3_5_dir):
    expected = hf_greedy(qwen3_5_dir, ENGINE_PROMPTS, GREEDY.max_tokens)
    assert greedy(qwen3_5_dir, ENGINE_PROMPTS, tensor_parallel_size=2, device="cpu") == expected


def _one_token_at_a_time(layer: GatedDeltaNet, x: torch.Tensor, states: tuple[torch.Tensor, torch.Tensor]):
    """The layer's outputs [tokens, hidden] over one sequence's tokens `x` in single-token decode steps from
    `states` (its slot's conv and recurrent state), and the states after each token ([tokens, ...] each)."""
    layer.bind_state_cache(tuple(s.clone()[None] for s in states))  # the sequence alone, in slot 0
    outputs, after = [], ([], [])
    for token in x:
        with torch.inference_mode(), forward_context(Context(is_prefill=False, state_slots=torch.tensor([0]))):
            outputs.append(layer(token[None], None)[0])
        for kept, state in zip(after, (layer.conv_state, layer.recurrent_state)):
            kept.append(state[0].clone())
    return torch.cat(outputs), tuple(torch.stack(kept) for kept in after)


def test_steps_with_drafts_leave_the_state_after_each_query_as_single_token_steps_do(qwen3_5_dir, model_config):
    """A verify step of Q queries per sequence (two sequences, in slots out of order) gives the outputs and,
    in the per-position states, the state after each query that Q single-token decode steps give, and leaves
    the live slots as they were; a varlen step leaves the state after each of a sequence's first Q tokens
    there too (a shorter sequence's last one past its end) besides its live slot."""
    torch.manual_seed(0)
    queries, slots = 4, [1, 0]
    layer = our_model(qwen3_5_dir, model_config).model.layers[0].linear_attn
    zeros = (torch.zeros(CONV_CHANNELS, 3), torch.zeros(4, 16, 8))
    prompts = [torch.randn(6, 64), torch.randn(2, 64)]  # the longer one has more tokens than queries, the other fewer
    single = [_one_token_at_a_time(layer, x, zeros) for x in prompts]
    live = (torch.zeros(3, CONV_CHANNELS, 3), torch.zeros(3, 4, 16, 8))
    steps = (torch.full((2, queries, CONV_CHANNELS, 3), float("nan")), torch.full((2, queries, 4, 16, 8), float("nan")))
    layer.bind_state_cache(live)
    layer.bind_draft_states(steps)
    prefill = Context(
        is_prefill=True, cu_seqlens_q=_cumulative([6, 2]), max_seqlen_q=6, state_slots=torch.tensor(slots)
    )
    with torch.inference_mode(), forward_context(prefill):
        layer(torch.cat(prompts), None)
    for row, (slot, (_, after)) in enumerate(zip(slots, single)):
        for state, step_states, want in zip(live, steps, after):
            torch.testing.assert_close(state[slot], want[-1], atol=1e-5, rtol=1e-5)
            recorded = want[torch.arange(queries).clamp(max=want.size(0) - 1)]
            torch.testing.assert_close(step_states[row], recorded, atol=1e-5, rtol=1e-5)
    before = tuple(state.clone() for state in live)
    drafts = torch.randn(2, queries, 64)  # each sequence's last token and three drafts, one after another
    verify = Context(is_prefill=False, queries_per_seq=queries, state_slots=torch.tensor(slots))
    with torch.inference_mode(), forward_context(verify):
        out = layer(drafts.flatten(0, 1), None)[0].view(2, queries, -1)
    for state, untouched in zip(live, before):
        torch.testing.assert_close(state, untouched, atol=0, rtol=0)
    for row, slot in enumerate(slots):
        want_out, after = _one_token_at_a_time(layer, drafts[row], tuple(state[slot] for state in before))
        torch.testing.assert_close(out[row], want_out, atol=1e-5, rtol=1e-5)
        for step_states, want in zip(steps, after):
            torch.testing.assert_close(step_states[row], want, atol=1e-5, rtol=1e-5)


def test_block_fp8_layers_leave_the_gated_delta_nets_b_and_a_in_full_precision(model_config):
    # b and a have one row per value head, 4 here: never whole 16-row blocks, which refused the model when they
    # shared one fused projection with q, k, v and z
    model = DecoderForCausalLM(model_config)
    store_fp8_weights(model, (16, 16))
    layer = model.model.layers[0].linear_attn
    assert layer.in_proj_qkvz.weight.dtype == torch.float8_e4m3fn and layer.in_proj_qkvz.weight_block == (16, 16)
    assert layer.in_proj_ba.weight.dtype == torch.float32 and layer.in_proj_ba.weight_scale is None
    assert layer.out_proj.weight.dtype == torch.float8_e4m3fn
