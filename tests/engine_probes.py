"""Tiny engines for tests, and what their steps record: the order of launches and read-backs, the batches."""

from nanovllm import LLM

BLOCK = 16  # tokens per KV block of the tiny engines


def engine(model_dir, **kwargs) -> LLM:
    """A tiny engine: 16-token blocks, 64 of them, a 256-token context; `kwargs` override."""
    return LLM(model_dir, kvcache_block_size=BLOCK, max_model_len=256, **{"num_kvcache_blocks": 64, **kwargs})


def record_order(llm: LLM) -> list[tuple[str, int]]:
    """A list that fills with ("launch", n) and ("read", n) as the core launches and reads back steps."""
    runner, events = llm.client.core.executor, []
    original = runner.execute

    def execute(out, *grammar):
        n = sum(kind == "launch" for kind, _ in events)
        events.append(("launch", n))
        pending = original(out, *grammar)
        if pending is not None:
            result = pending.result
            pending.result = lambda: events.append(("read", n)) or result()
        return pending

    runner.execute = execute
    return events


def record_batches(llm) -> list:
    """A list that fills with (num_scheduled_tokens, samples, is_prefill) of every step the engine runs."""
    batches = []
    runner = llm.client.core.executor
    original = runner.execute

    def recording_execute(out, *grammar):
        batches.append((out.num_scheduled_tokens, list(out.samples), not out.is_decode))
        return original(out, *grammar)

    runner.execute = recording_execute
    return batches
