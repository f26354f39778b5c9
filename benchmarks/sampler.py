"""Cost of one sampler pass per feature, on a batch of full-vocabulary logits.

Each row times `Sampler` on random logits [batch, vocab] (Qwen3's vocabulary by
default) with one more feature switched on than the row before, so the
difference between rows is what that feature costs. On CUDA a last row times
top-k 20 and top-p 0.95 drawn by threshold search instead of a sort
(`kernels/triton_truncation.py`). Runs on CUDA when there is a GPU, else on CPU.

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
        "+ min_p": dict(min_p=full(0.05)),
        "+ top_k, top_p (one sort)": dict(top_k=full(50, torch.int64), top_p=full(0.9)),
        "+ seeds on every row": dict(seeded_rows=rows, seeds=rows * 31, positions=full(1200, torch.int64)),
        "+ penalties (1000 prompt, 200 output tokens)": dict(penalties=penalties),
        "+ logprobs=5": dict(num_logprobs=5),
    }
    out, accumulated = {}, {}
    for name, extra in steps.items():
        if extra is not None:
            accumulated.update(extra)
        out[name] = SamplingTensors(**accumulated) if extra is not None else None
    return out


def truncated_draw(logits: torch.Tensor) -> torch.Tensor:
    """Temperature 0.6, top-k 20 and top-p 0.95 on every row, drawn on the device without a sort
    (`truncation_thresholds`, then the Gumbel-max kernel among the logits at or above them)."""
    from nanovllm.kernels.triton_sampling import gumbel_max_sample
    from nanovllm.kernels.triton_truncation import truncation_thresholds

    rows = logits.size(0)
    full = lambda value, dtype=torch.float32: torch.full((rows,), value, dtype=dtype, device=logits.device)
    temperatures = full(0.6)
    thresholds = truncation_thresholds(logits, temperatures, full(20, torch.int64), full(0.95), full(0.0))
    return gumbel_max_sample(logits, temperatures, full(7, torch.int64), thresholds=thresholds)


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
            if device.type == "cuda":
                ms = time_ms(lambda: truncated_draw(logits).tolist(), args.repeats, device)
                print(f"  {'top_k 20, top_p 0.95 by threshold search':<48} {ms:8.3f}")


if __name__ == "__main__":
    main()
