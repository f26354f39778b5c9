"""CUDA graphs on a GPU: replays of padded batches, and of batches that grow at once, equal eager steps;
decode steps read their input ids from the previous step's samples on the device."""

import pytest

from nanovllm import LLM

from helpers.gpu_cases import GPU_GREEDY, gpu_prompts
from helpers.hf_reference import hf_greedy
from helpers.prompts import token_ids
from helpers.stepping import completions_of, run_steps

pytestmark = pytest.mark.gpu


def test_cuda_graphs_equal_eager_with_padded_batches(qwen3_dir):
    # 7 and 19 requests replay the graphs of 8 and 20 (max_num_seqs) with padded slots
    for n in (7, 19):
        batch = gpu_prompts(seed=n) * 3
        graphed = LLM(qwen3_dir, block_size=16, max_model_len=512, max_num_seqs=20)
        assert graphed.client.core.executor.graphs.sizes == [1, 2, 4, 8, 16, 20]
        eager = LLM(qwen3_dir, block_size=16, max_model_len=512, max_num_seqs=20, enforce_eager=True)
        assert eager.client.core.executor.graphs is None
        assert token_ids(graphed.generate(batch[:n], GPU_GREEDY, use_tqdm=False)) == token_ids(
            eager.generate(batch[:n], GPU_GREEDY, use_tqdm=False)
        )


def test_cuda_graphs_pad_a_batch_that_grows_at_once(qwen3_dir):
    # One sequence decodes alone (graph of 1), then 19 join at once: the graph of 20
    # pads rows where the steps of 1 left a slot, a length and a -1-padded block table,
    # in whichever of the two host buffers the step lands.
    batch = (gpu_prompts(seed=11) * 3)[:20]

    def run(llm):
        ids = [llm.add_request(batch[0], GPU_GREEDY)]
        outputs = run_steps(llm, {}, steps=4)
        ids += [llm.add_request(p, GPU_GREEDY) for p in batch[1:]]
        return [c.token_ids for c in completions_of(run_steps(llm, outputs), ids)]

    kwargs = dict(block_size=16, max_model_len=512, max_num_seqs=20)
    assert run(LLM(qwen3_dir, **kwargs)) == run(LLM(qwen3_dir, enforce_eager=True, **kwargs))


def record_src_rows(llm) -> list:
    """A list that fills with the rows each step takes from the previous step's samples on the device."""
    runner = llm.client.core.executor
    original, recorded = runner._src_rows, []
    runner._src_rows = lambda out: recorded.append(original(out)) or recorded[-1]
    return recorded


def test_device_side_input_ids_in_graphs_equal_eager_and_transformers(qwen3_dir):
    # Every decode step after the first reads its input ids from the previous step's
    # samples on the device, inside the graph when one is replayed.
    batch = gpu_prompts(seed=14)
    graphed = LLM(qwen3_dir, block_size=16, max_model_len=512)
    src_rows = record_src_rows(graphed)
    eager = LLM(qwen3_dir, block_size=16, max_model_len=512, enforce_eager=True)
    expected = hf_greedy(qwen3_dir, batch, GPU_GREEDY.max_tokens)
    assert token_ids(graphed.generate(batch, GPU_GREEDY, use_tqdm=False)) == expected
    assert token_ids(eager.generate(batch, GPU_GREEDY, use_tqdm=False)) == expected
    from_device = [rows for rows in src_rows if rows and all(r >= 0 for r in rows)]
    assert len(from_device) >= GPU_GREEDY.max_tokens - 2
