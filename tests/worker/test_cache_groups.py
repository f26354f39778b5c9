"""A model runner over a model of two cache groups (Gemma 2: sliding and full layers) gives the logits of the
same model run with one group of full tables, when the sliding group's table holds -1 for the blocks behind
every window and those blocks hold NaN: through a first prompt chunk, a chunk over a cached prefix and
decode steps, with the PyTorch kernels and the Triton ones (interpreted without a GPU). A draft model of two
groups keeps a table per group for each request and proposes its greedy tokens."""

import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM

from nanovllm.config import Config
from nanovllm.core.scheduler_output import SchedulerOutput
from nanovllm.sampling_params import SamplingParams
from nanovllm.spec_decode.draft_model_proposer import DraftModelProposer
from nanovllm.worker.model_runner import ModelRunner

from helpers.hf_reference import hf_greedy
from helpers.prompts import random_prompts
from helpers.tiny_models import save_tiny_tokenizer, tiny_config

WINDOW, BLOCK, BLOCKS = 24, 16, 16
CHUNKS = (40, 20)  # the prompt's two chunks: the second reads the first from the cache
DECODES = 6
GREEDY = SamplingParams(temperature=0.0, max_tokens=DECODES + 1, ignore_eos=True)


@pytest.fixture(scope="module")
def gemma2_dir(tmp_path_factory):
    """Four layers (sliding, full, sliding, full): blocks of two layers, a sliding group and a full one."""
    path = tmp_path_factory.mktemp("tiny-gemma2-groups")
    fields = dict(tiny_config(), num_hidden_layers=4, sliding_window=WINDOW, query_pre_attn_scalar=16)
    torch.manual_seed(0)
    Gemma2ForCausalLM(Gemma2Config(**fields)).to(torch.float32).save_pretrained(path)
    save_tiny_tokenizer(path)
    return str(path)


def step(token_ids: list[int], start: int, tables: list[list[int]], samples: bool = True) -> SchedulerOutput:
    """One request computing `token_ids` from position `start`, with one block table per cache group."""
    sampled = ["r"] if samples else []
    return SchedulerOutput(
        ["r"], [token_ids], [start], [tables], [samples], sampled, [GREEDY] * len(sampled), [0] * len(sampled)
    )


class Run:
    """A runner whose steps record their logits; `tables(start, end)` are the request's tables for a step
    that computes positions start .. end - 1."""

    def __init__(self, runner: ModelRunner, tables):
        self.runner, self.tables, self.logits = runner, tables, []
        compute_logits = runner.model.compute_local_logits
        runner.model.compute_local_logits = lambda *args: self.logits.append(compute_logits(*args)) or self.logits[-1]

    def generate(self, prompt: list[int]) -> list[int]:
        """Greedy tokens after `prompt`, prefilled in CHUNKS, then decoded one step each."""
        first, second = CHUNKS
        self.runner.execute(step(prompt[:first], 0, self.tables(0, first), samples=False))
        tokens = self._sampled(step(prompt[first:], first, self.tables(first, first + second)))
        for position in range(first + second, first + second + DECODES):
            tokens += self._sampled(step(tokens[-1:], position, self.tables(position, position + 1)))
        return tokens

    def _sampled(self, out: SchedulerOutput) -> list[int]:
        return [int(ids[0]) for ids in self.runner.execute(out).result().sampled_token_ids]


def engine_config(model_dir: str, backend: str, **settings) -> Config:
    # Triton's kernels run on the GPU where there is one, else interpreted; eager, so that every step's LM
    # head runs where the test records it
    device = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"
    return Config(
        model_dir,
        device=device,
        enforce_eager=True,
        attention_backend=backend,
        block_size=BLOCK,
        num_kvcache_blocks=BLOCKS,
        max_model_len=128,
        **settings,
    )


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.slow)])
def test_a_sliding_groups_freed_blocks_are_never_read(gemma2_dir, backend):
    prompt = random_prompts([sum(CHUNKS)], seed=3)[0]
    num_blocks = (sum(CHUNKS) + DECODES + BLOCK - 1) // BLOCK

    one_group = engine_config(gemma2_dir, backend, disable_hybrid_kv_cache_manager=True)
    assert len(one_group.kv_layout.groups) == 1
    reference = Run(ModelRunner(one_group), lambda start, end: [list(range(num_blocks))])
    expected = reference.generate(prompt)

    config = engine_config(gemma2_dir, backend)
    sliding, full = config.kv_layout.groups
    assert (sliding.window, sliding.layers, full.window, full.layers) == (WINDOW, (0, 2), None, (1, 3))
    runner = ModelRunner(config)
    sliding_blocks, full_blocks = list(range(num_blocks)), list(range(num_blocks, 2 * num_blocks))

    def tables(start: int, end: int) -> list[list[int]]:
        # the sliding group's blocks wholly before the window of the step's first query went back to the pool,
        # where another request's K/V (here NaN) fills them
        kept_from = sliding.first_kept_position(start, 0) // BLOCK
        freed = sliding_blocks[:kept_from]
        runner.kv_cache.values[:, freed] = float("nan")
        return [[-1] * kept_from + sliding_blocks[kept_from:], full_blocks]

    # a -1 read as an index would reach the pool's last block
    runner.kv_cache.values[:, -1] = float("nan")
    assert tables(sum(CHUNKS), sum(CHUNKS) + 1)[0][:2] == [-1, -1]
    grouped = Run(runner, tables)
    assert grouped.generate(prompt) == expected
    assert len(grouped.logits) == len(reference.logits) == 1 + DECODES
    for got, want in zip(grouped.logits, reference.logits):
        assert not got.isnan().any()
        torch.testing.assert_close(got, want)


def test_a_draft_model_of_two_cache_groups_proposes_its_greedy_tokens(gemma2_dir):
    settings = {"method": "draft_model", "model": gemma2_dir, "num_speculative_tokens": 3}
    config = Config(gemma2_dir, device="cpu", block_size=BLOCK, max_model_len=128, speculative_config=settings)
    proposer = DraftModelProposer(config, BLOCKS)
    assert len(proposer.runner.config.kv_layout.groups) == 2
    prompt = random_prompts([30], seed=4)[0]
    expected = hf_greedy(gemma2_dir, [prompt], 6)[0]
    assert proposer.propose([prompt], [3], ["a"]) == [expected[:3]]
    # the target kept every draft and sampled the next token: the later drafts cross the window
    assert proposer.propose([prompt + expected[:4]], [2], ["a"]) == [expected[4:6]]
    # 35 tokens held (the confirmed ones and the first draft): three blocks in each group, none shared
    tables = proposer.caches["a"].block_tables
    assert [len(table) for table in tables] == [3, 3] and len(set(tables[0] + tables[1])) == 6
    assert len(proposer.free_blocks) == BLOCKS - 6
    proposer.release("a")
    assert sorted(proposer.free_blocks) == list(range(BLOCKS))
    proposer.close()
