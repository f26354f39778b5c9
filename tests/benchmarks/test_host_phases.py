"""benchmarks/throughput.py's host phases (`--profile`): each phase of rank 0's loop is timed while attached,
and detaching leaves every method as it was, a step recorder's wrapper included."""

from pathlib import Path

import pytest

from nanovllm import LLM, SamplingParams

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def throughput(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import throughput

    return throughput


def test_every_phase_is_timed_and_detaching_puts_back_what_was_there(throughput, qwen3_dir):
    llm = LLM(qwen3_dir, device="cpu", block_size=16, num_kvcache_blocks=64, max_model_len=256)
    executor = llm.client.core.executor
    recorders_wrapper = executor.launch_forward = lambda *args, **kwargs: type(executor).launch_forward(
        executor, *args, **kwargs
    )
    phases = throughput.HostPhases(llm)
    llm.generate([[1, 2, 3], [4, 5]], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    phases.detach()
    assert all(seconds > 0 for seconds in phases.seconds.values()), phases.seconds
    assert vars(executor)["launch_forward"] is recorders_wrapper
    assert "launch_sampling" not in vars(executor) and "schedule" not in vars(llm.client.core.scheduler)
    assert phases.summary(4, 0.01).startswith("wall time 2.50 ms per step; by phase (ms): scheduling ")
