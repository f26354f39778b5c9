"""Tiny engines for tests, and what their steps record: the order of launches and read-backs, the batches,
the preemptions, the drafts kept."""

from nanovllm import LLM

BLOCK = 16  # tokens per KV block of the tiny engines


def engine(model_dir, **kwargs) -> LLM:
    """A tiny engine: 16-token blocks, 64 of them, a 256-token context; `kwargs` override."""
    return LLM(model_dir, block_size=BLOCK, max_model_len=256, **{"num_kvcache_blocks": 64, **kwargs})


def record_order(llm: LLM) -> list[tuple[str, int]]:
    """A list that fills with ("launch", n) as the core launches step n's forward pass, ("sample", n) as
    it launches its sampling and ("read", n) as it reads the step back."""
    runner, events = llm.client.core.executor, []
    launch_forward, launch_sampling = runner.launch_forward, runner.launch_sampling

    def launching(out, *args, **kwargs):
        events.append(("launch", sum(kind == "launch" for kind, _ in events)))
        return launch_forward(out, *args, **kwargs)

    def sampling(step, *grammar):
        n = sum(kind == "launch" for kind, _ in events) - 1  # a step's sampling follows its own forward pass
        events.append(("sample", n))
        pending = launch_sampling(step, *grammar)
        if pending is not None:
            result = pending.result
            pending.result = lambda: events.append(("read", n)) or result()
        return pending

    runner.launch_forward, runner.launch_sampling = launching, sampling
    return events


def record_batches(llm) -> list:
    """A list that fills with (num_scheduled_tokens, samples, is_prefill) of every step the engine runs."""
    batches = []
    runner = llm.client.core.executor
    launch_forward = runner.launch_forward

    def recording_launch(out, *args, **kwargs):
        batches.append((out.num_scheduled_tokens, list(out.samples), not out.is_decode))
        return launch_forward(out, *args, **kwargs)

    runner.launch_forward = recording_launch
    return batches


def record_preemptions(llm) -> list:
    """A list that fills with each sequence the scheduler preempts."""
    preempted = []
    original = llm.client.core.scheduler._preempt

    def recording_preempt(seq):
        preempted.append(seq)
        original(seq)

    llm.client.core.scheduler._preempt = recording_preempt
    return preempted


def acceptance(llm) -> tuple[int, int]:
    """(drafts checked, drafts kept) since the engine started."""
    stats = llm.client.core.stats()
    return stats.spec_decode_num_draft_tokens, stats.spec_decode_num_accepted_tokens
