"""The sampler: greedy rows, Gumbel-max frequencies (chi-square), truncation, seeds, bans, logprobs."""

import numpy as np
import pytest
import torch

from nanovllm import LLM, SamplingParams
from nanovllm.sample.metadata import SamplingTensors
from nanovllm.sample.sampler import Sampler, sample_with_temperatures
from nanovllm.sample.truncation import apply_min_p, apply_top_k_top_p

from helpers.chi_square import chi_square_p_value
from helpers.gpu_cases import gpu_prompts

VOCAB = 12
DRAWS = 40000
# a p-value below this fails; with fixed seeds the tests are deterministic
ALPHA = 1e-3


# the CPU's sort-based truncation, and on CUDA the threshold search and the Gumbel-max kernel
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")],
    ),
]


def draws_of(logits: torch.Tensor, device: str = "cpu", **settings) -> torch.Tensor:
    """Sample DRAWS times from one row of logits, as DRAWS rows of a batch on `device`."""
    # one-element settings apply to every row; longer ones are given per row
    tensors = SamplingTensors(**{k: (v.repeat(DRAWS) if v.numel() == 1 else v).to(device) for k, v in settings.items()})
    return Sampler()(logits.repeat(DRAWS, 1).to(device), tensors).token_ids.cpu()


@pytest.fixture
def logits():
    torch.manual_seed(0)
    return torch.randn(VOCAB) * 1.5


def test_zero_temperature_is_argmax():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    ids = Sampler()(logits, SamplingTensors(temperatures=torch.zeros(6))).token_ids
    assert torch.equal(ids, logits.argmax(-1))


def test_no_tensors_means_all_greedy():
    torch.manual_seed(0)
    logits = torch.randn(5, 50, dtype=torch.bfloat16)
    assert torch.equal(Sampler()(logits).token_ids, logits.float().argmax(-1))


def test_mixed_batch_keeps_greedy_rows_greedy():
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    tensors = SamplingTensors(temperatures=torch.tensor([0.0, 1.0, 0.0, 1.0]))
    for _ in range(20):
        ids = Sampler()(logits, tensors).token_ids
        assert ids[0] == logits[0].argmax() and ids[2] == logits[2].argmax()


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_frequencies_follow_softmax_of_scaled_logits(logits, temperature):
    torch.manual_seed(1)
    ids = draws_of(logits, temperatures=torch.tensor([temperature]))
    assert chi_square_p_value(ids, torch.softmax(logits / temperature, -1)) > ALPHA


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_temperature_sampling_on_gpu_follows_softmax(logits):
    torch.manual_seed(2)
    tensors = SamplingTensors(temperatures=torch.full((DRAWS,), 0.7, device="cuda"))
    ids = Sampler()(logits.cuda().repeat(DRAWS, 1), tensors).token_ids.cpu()
    assert chi_square_p_value(ids, torch.softmax(logits / 0.7, -1)) > ALPHA


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_temperature_sampling_replayed_in_a_cuda_graph_draws_from_the_seeds_refilled_before_each_replay(logits):
    # a decode graph samples inside itself, its noise from per-row seeds the decode buffers refill
    # each step: replays must follow softmax(logits / T), each from its own seeds
    torch.manual_seed(3)
    rows, replays = 64, DRAWS // 64
    batch = logits.cuda().repeat(rows, 1)
    temperatures = torch.full((rows,), 0.7, dtype=torch.float64, device="cuda")
    seeds = torch.randint(0, 2**62, (rows,), device="cuda")
    ids = torch.empty(rows, dtype=torch.int64, device="cuda")
    sample_with_temperatures(batch, temperatures, seeds, ids)  # compile before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sample_with_temperatures(batch, temperatures, seeds, ids)
    draws = []
    for _ in range(replays):
        seeds.copy_(torch.randint(0, 2**62, (rows,), device="cuda"))
        graph.replay()
        draws.append(ids.clone())
    draws = torch.stack(draws).cpu()  # [replays, rows]
    assert not all(torch.equal(draws[0], d) for d in draws[1:])
    assert chi_square_p_value(draws.flatten(), torch.softmax(logits / 0.7, -1)) > ALPHA


def test_seeded_frequencies_follow_softmax(logits):
    # one draw per seed: across seeds the hash noise must act as Exp(1) noise
    ids = draws_of(
        logits,
        temperatures=torch.tensor([0.8]),
        positions=torch.tensor([5]),
        seeds=torch.arange(DRAWS) * 7919,
        seeded_rows=torch.arange(DRAWS),
    )
    assert chi_square_p_value(ids, torch.softmax(logits / 0.8, -1)) > ALPHA


def test_same_seed_and_position_draw_the_same_token_anywhere_in_the_batch(logits):
    batch = logits.repeat(6, 1)
    temperatures = torch.ones(6)

    def draw(rows, seeds, positions):
        return Sampler()(
            batch,
            SamplingTensors(
                temperatures=temperatures,
                seeded_rows=torch.tensor(rows),
                seeds=torch.tensor(seeds),
                positions=torch.tensor(positions),
            ),
        ).token_ids

    for seed in range(20):
        alone = draw([0], [seed], [3])[0]
        assert draw([4, 1], [99, seed], [3, 3])[1] == alone
    by_seed = [int(draw([0], [seed], [3])[0]) for seed in range(40)]
    by_position = [int(draw([0], [7], [pos])[0]) for pos in range(40)]
    assert len(set(by_seed)) > 3 and len(set(by_position)) > 3


def renormalised(logits: torch.Tensor, kept: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax((logits / temperature).masked_fill(~kept, float("-inf")), -1)


@pytest.mark.parametrize(
    "setting, kept",
    [
        ({"top_k": torch.tensor([4])}, lambda s: s >= s.topk(4).values[-1]),
        ({"top_p": torch.tensor([0.6])}, None),
        ({"min_p": torch.tensor([0.2])}, lambda s: s.softmax(-1) >= 0.2 * s.softmax(-1).max()),
    ],
)
@pytest.mark.parametrize("device", DEVICES)
def test_truncation_keeps_only_the_allowed_set_and_its_renormalised_distribution(logits, setting, kept, device):
    temperature = 0.9
    scaled = logits / temperature
    if kept is None:
        # top-p by its definition: the most likely tokens until their mass reaches p
        order = scaled.argsort(descending=True)
        mass_before = torch.softmax(scaled, -1)[order].cumsum(0) - torch.softmax(scaled, -1)[order]
        allowed = torch.zeros(VOCAB, dtype=torch.bool)
        allowed[order[mass_before < 0.6]] = True
    else:
        allowed = kept(scaled)
    assert 1 < int(allowed.sum()) < VOCAB
    torch.manual_seed(2)
    ids = draws_of(logits, device, temperatures=torch.tensor([temperature]), **setting)
    assert allowed[ids].all()
    assert chi_square_p_value(ids, renormalised(logits, allowed, temperature)) > ALPHA


def test_rows_keep_their_own_truncation_settings():
    torch.manual_seed(3)
    logits = torch.randn(3, 40)
    top_k = torch.tensor([1, 40, 5])
    top_p = torch.tensor([1.0, 0.3, 1.0])
    min_p = torch.tensor([0.0, 0.0, 0.5])
    filtered = apply_top_k_top_p(apply_min_p(logits, min_p), top_k, top_p)
    expected = [
        apply_top_k_top_p(apply_min_p(logits[i : i + 1], min_p[i : i + 1]), top_k[i : i + 1], top_p[i : i + 1])
        for i in range(3)
    ]
    assert torch.equal(filtered, torch.cat(expected))
    assert int(filtered[0].isfinite().sum()) == 1


def test_banned_tokens_are_never_drawn():
    torch.manual_seed(4)
    logits = torch.randn(2, 6)
    banned = torch.tensor([[0, 0, 1], [int(logits[0].argmax()), 2, int(logits[1].argmax())]])
    for temperatures in (torch.zeros(2), torch.ones(2)):
        for _ in range(200):
            ids = Sampler()(logits, SamplingTensors(temperatures=temperatures, banned=banned)).token_ids
            assert ids[0] not in (banned[1, 0], 2) and ids[1] != banned[1, 2]


@pytest.mark.parametrize("device", DEVICES)
def test_grammar_masks_and_bans_hold_beside_truncation(device):
    pytest.importorskip("xgrammar")
    torch.manual_seed(6)
    logits = torch.randn(3, 40, device=device)
    allowed = [[3, 7, 30], [], [5]]  # row 1 is not constrained
    words = np.zeros((3, 2), dtype=np.uint32)
    for row, ids in enumerate(allowed):
        for token_id in ids:
            words[row, token_id // 32] |= np.uint32(1 << (token_id % 32))
    banned = int(logits[1].argmax())
    tensors = SamplingTensors(
        temperatures=torch.tensor([1.0, 1.0, 0.0], device=device),
        top_k=torch.tensor([2, 40, 40], device=device),
        banned=torch.tensor([[1], [banned]], device=device),
        bitmask=torch.from_numpy(words.view(np.int32)).to(device),
        bitmask_rows=torch.tensor([0, 2], dtype=torch.int32, device=device),
    )
    top_two_allowed = set(logits[0, allowed[0]].topk(2).indices.tolist())
    for _ in range(100):
        ids = Sampler()(logits.clone(), tensors).token_ids.tolist()
        assert allowed[0].index(ids[0]) in top_two_allowed and ids[1] != banned and ids[2] == 5


@pytest.mark.parametrize("device", DEVICES)
def test_logprobs_come_from_the_raw_logits(device):
    torch.manual_seed(5)
    logits = torch.randn(3, 30, device=device)
    tensors = SamplingTensors(
        temperatures=torch.tensor([0.0, 2.0, 0.5], device=device),
        top_k=torch.tensor([30, 2, 30], device=device),
        num_logprobs=4,
    )
    out = Sampler()(logits, tensors)
    assert out.token_ids[0] == logits[0].argmax() and out.token_ids[1] in logits[1].topk(2).indices
    reference = torch.log_softmax(logits, -1)
    assert torch.equal(out.logprob_token_ids[:, 0], out.token_ids)
    assert torch.equal(out.logprob_token_ids[:, 1:], reference.topk(4).indices)
    assert torch.allclose(out.logprobs, reference.gather(1, out.logprob_token_ids))


@pytest.mark.gpu
def test_every_sampling_feature_runs_on_gpu_and_seeds_reproduce(qwen3_dir):
    llm = LLM(qwen3_dir, device="cuda", block_size=16, max_model_len=512)
    params = [
        SamplingParams(
            temperature=0.8,
            top_k=20,
            top_p=0.9,
            min_p=0.05,
            seed=3,
            repetition_penalty=1.1,
            frequency_penalty=0.2,
            presence_penalty=0.1,
            logprobs=2,
            min_tokens=4,
            stop_token_ids=[7],
            stop=["w9 w9"],
            max_tokens=24,
        ),
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
    ]
    first = llm.generate(gpu_prompts()[:2], params, use_tqdm=False)
    again = llm.generate(gpu_prompts()[2:4] + gpu_prompts()[:1], params[1:] * 2 + params[:1], use_tqdm=False)
    assert again[-1].outputs[0].token_ids == first[0].outputs[0].token_ids
    assert len(first[0].outputs[0].logprobs) == len(first[0].outputs[0].token_ids)
    assert first[0].outputs[0].finish_reason in ("stop", "length") and first[1].outputs[0].finish_reason == "length"
