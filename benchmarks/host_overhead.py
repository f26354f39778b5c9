"""Host (CPU) time of one decode step, phase by phase, beside the GPU time it adds to.

A decode step's Python work runs on the CPU around the GPU's forward pass:
the scheduler picks the batch, the runner packs its inputs (`DecodeBuffers.load`),
builds the sampling tensors (while the forward already runs on the GPU) and,
once the sampled ids are back, `postprocess` records them. Everything but the
sampling tensors delays the next forward, so it adds to every step unless it is
hidden under the GPU's work. This runs those phases without a model, on the
throughput workload's first N requests (Qwen3-0.6B shape, block size 256), and
prints the median per phase beside the H100 memory roofline of the same step:
the time the GPU needs at best, which the critical host work adds to.

    python benchmarks/host_overhead.py [--batch-sizes 1 64 256] [--steps 200]
"""

import argparse
import platform
import statistics
import time

import torch
from throughput import model_bytes, workload, write_model_dir

from nanovllm.config import Config
from nanovllm.engine.decode_buffers import DecodeBuffers
from nanovllm.engine.sampling_batch import sampling_tensors
from nanovllm.engine.scheduler import Scheduler
from nanovllm.engine.sequence import Sequence
from nanovllm.sampling_params import SamplingParams

H100_HBM = 3.35e12  # bytes/s, the data sheet's figure for the H100 80GB HBM3
PHASES = ("schedule", "prepare", "sampling tensors", "postprocess")
CRITICAL = ("schedule", "prepare", "postprocess")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def to_cpu(values: list, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def decoding_scheduler(config: Config, num_seqs: int) -> Scheduler:
    """A scheduler whose first `num_seqs` workload requests have their prompts in the cache."""
    scheduler = Scheduler(config)
    prompts, _ = workload()
    params = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=2048)
    for prompt in prompts[:num_seqs]:
        scheduler.add(Sequence(prompt, params, config.kvcache_block_size))
    while scheduler.waiting or any(not seq.num_completion_tokens for seq in scheduler.running):
        batch = scheduler.schedule()
        scheduler.postprocess(batch, [7] * len(batch.sampled_seqs))
    return scheduler


def time_phases(config: Config, num_seqs: int, steps: int) -> dict[str, float]:
    """Median seconds per phase over `steps` decode steps of `num_seqs` sequences."""
    scheduler = decoding_scheduler(config, num_seqs)
    buffers = DecodeBuffers(config.max_num_seqs, config.max_blocks_per_seq, config.kvcache_block_size,
                            torch.device("cpu"))
    vocab_size = config.hf_config.vocab_size
    times = {phase: [] for phase in PHASES}
    for step in range(steps):
        token_ids = [(step * 31 + i) % 10000 for i in range(num_seqs)]
        t0 = time.perf_counter()
        batch = scheduler.schedule()
        t1 = time.perf_counter()
        buffers.load(batch.seqs, len(batch.seqs))
        t2 = time.perf_counter()
        sampling_tensors(batch.sampled_seqs, vocab_size, config.eos_token_ids, to_cpu)
        t3 = time.perf_counter()
        scheduler.postprocess(batch, token_ids)
        t4 = time.perf_counter()
        assert not batch.is_prefill and len(batch.seqs) == num_seqs
        for phase, seconds in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            times[phase].append(seconds)
    return {phase: statistics.median(values) for phase, values in times.items()}


def roofline_step(context_tokens: int, weight_bytes: int, kv_bytes_per_token: int) -> float:
    """Seconds an H100 needs at least for a decode step that holds this many tokens of context."""
    return (weight_bytes + context_tokens * kv_bytes_per_token) / H100_HBM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 64, 256])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    config = Config(write_model_dir("0.6b"), device="cpu", load_format="dummy", skip_tokenizer_init=True,
                    num_kvcache_blocks=4096)
    weight_bytes, kv_bytes = model_bytes("0.6b")
    print(f"machine: {cpu_name()}, Python {platform.python_version()}, torch {torch.__version__}")
    print(f"{'seqs':>5} | " + " | ".join(f"{p:>16}" for p in PHASES) + " | critical path | H100 roofline step")
    for num_seqs in args.batch_sizes:
        medians = time_phases(config, num_seqs, args.steps)
        prompts, _ = workload()
        context = sum(len(p) for p in prompts[:num_seqs]) + num_seqs * args.steps // 2
        critical = sum(medians[p] for p in CRITICAL)
        limit = roofline_step(context, weight_bytes, kv_bytes)
        print(f"{num_seqs:>5} | " + " | ".join(f"{medians[p] * 1e3:13.3f} ms" for p in PHASES)
              + f" | {critical * 1e3:10.3f} ms | {limit * 1e3:.3f} ms (host adds {critical / limit:.0%})")


if __name__ == "__main__":
    main()
