"""Cost of one sampler pass per feature, on a batch of full-vocabulary logits.

Each row times `Sampler` on random logits [batch, vocab] (Qwen3's vocabulary by
default) with one more feature switched on than the row before, so the
difference between rows is what that feature costs. Truncation and logprobs
come first: on CUDA they are drawn by threshold search from the raw logits
(`kernels/triton_top_logits.py`); seeds and penalties then take the full
sampler. Runs on CUDA when there is a GPU, else on CPU.

    .venv/bin/python benchmarks/sampler.py [--vocab 151936] [--batch 1 64 256] [--repeats 20]
"""

import argparse
import time

import torch

from nanovllm.sample.metadata import SamplingTensors
from nanovllm.sample.penalties import PenaltyTensors
from nanovllm.sample.sampler import Sampler


def settings(batch: int, vocab: int, device: torch.device) -> dict[str, SamplingTensors | None]:
    """Feature sets, each adding to the one before."""
    full = lambda value, dtype=torch.float32: torch.full((batch,), value, dtype=dtype, device=device)
    rows = torch.arange(batch, device=device)
    penalties = PenaltyTensors(
        full(1.1),
        full(0.2),
        full(0.1),
        torch.randint(0, vocab, (batch, 1000), device=device),
        torch.randint(0, vocab, (batch, 200), device=device),
    )
    steps = {
        "greedy (fast path)": None,
        "temperature": dict(temperatures=full(0.8)),
        "+ logprobs=5": dict(num_logprobs=5),
        "+ min_p": dict(min_p=full(0.05)),
        "+ top_k 20, top_p 0.95": dict(top_k=full(20, torch.int64), top_p=full(0.95)),
        "+ seeds on every row (full sampler)": dict(
            seeded_rows=rows, seeds=rows * 31, positions=full(1200, torch.int64)
        ),
        "+ penalties (1000 prompt, 200 output tokens)": dict(penalties=penalties),
    }
    out, accumulated = {}, {}
    for name, extra in steps.items():
        if extra is not None:
            accumulated.update(extra)
        out[name] = SamplingTensors(**accumulated) if extra is not None else None
    return out


def time_ms(fn, repeats: int, device: torch.device) -> float:
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"sampler on {name}, vocab {args.vocab}: ms per call")
    sampler = Sampler()
    with torch.inference_mode():
        for batch in args.batch:
            logits = torch.randn(batch, args.vocab, device=device, dtype=torch.bfloat16) * 3
            print(f"\nbatch {batch}")
            for label, tensors in settings(batch, args.vocab, device).items():
                ms = time_ms(lambda: sampler(logits, tensors).token_ids.tolist(), args.repeats, device)
                print(f"  {label:<48} {ms:8.3f}")


if __name__ == "__main__":
    main()
