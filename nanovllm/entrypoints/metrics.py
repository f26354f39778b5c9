"""Prometheus metrics of the server: load, KV-cache use, prefix cache, preemptions, speculative decoding's
acceptance, tokens and latencies.

Names and types follow vLLM's (`vllm:` becomes `nanovllm:`), so a vLLM Grafana
dashboard works once its prefix is changed.
"""

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily

from nanovllm.frontend.online_engine import OnlineEngine
from nanovllm.outputs import RequestOutput

_LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_REQUEST_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class _EngineCounters:
    """Counters the engine core keeps since start-up, read at each scrape."""

    def __init__(self, engine: OnlineEngine, model_name: str):
        self.engine = engine
        self.model_name = model_name

    def collect(self):
        stats = self.engine.stats()
        for name, doc, value in (
            ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", stats.prefix_cache_queries),
            ("prefix_cache_hits", "Prompt tokens the prefix cache held.", stats.prefix_cache_hits),
            ("num_preemptions", "Requests preempted (their KV blocks freed, to be recomputed).", stats.num_preemptions),
            ("spec_decode_num_drafts", "Request-steps that checked speculative drafts.", stats.spec_decode_num_drafts),
            ("spec_decode_num_draft_tokens", "Speculative draft tokens checked.", stats.spec_decode_num_draft_tokens),
            (
                "spec_decode_num_accepted_tokens",
                "Speculative draft tokens kept.",
                stats.spec_decode_num_accepted_tokens,
            ),
        ):
            family = CounterMetricFamily(f"nanovllm:{name}", doc, labels=["model_name"])
            family.add_metric([self.model_name], value)
            yield family
        per_position = CounterMetricFamily(
            "nanovllm:spec_decode_num_accepted_tokens_per_pos",
            "Speculative draft tokens kept, by their position among a step's drafts (0: the first).",
            labels=["model_name", "position"],
        )
        for position, value in enumerate(stats.spec_decode_num_accepted_tokens_per_pos):
            per_position.add_metric([self.model_name, str(position)], value)
        yield per_position


class ServerMetrics:
    """One registry per server, so that several servers in one process keep apart."""

    def __init__(self, engine: OnlineEngine, model_name: str):
        self.engine = engine
        self.registry = CollectorRegistry()
        labels = {"labelnames": ["model_name"], "registry": self.registry}

        def make(kind, name: str, doc: str, **extra):
            return kind(f"nanovllm:{name}", doc, **labels, **extra).labels(model_name)

        self.running = make(Gauge, "num_requests_running", "Requests in the running batch.")
        self.waiting = make(Gauge, "num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_cache_usage = make(Gauge, "kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0 to 1).")
        self.prompt_tokens = make(Counter, "prompt_tokens", "Prompt tokens of admitted requests.")
        self.generation_tokens = make(Counter, "generation_tokens", "Tokens generated.")
        self.ttft = make(
            Histogram, "time_to_first_token_seconds", "Time from arrival to the first token.", buckets=_LATENCY_BUCKETS
        )
        self.itl = make(
            Histogram,
            "inter_token_latency_seconds",
            "Time between successive arrivals of a request's new tokens (one step's, or several when the server lags).",
            buckets=_LATENCY_BUCKETS,
        )
        self.e2e = make(
            Histogram, "e2e_request_latency_seconds", "Time from arrival to the last token.", buckets=_REQUEST_BUCKETS
        )
        self.model_name = model_name
        self.finished = Counter(
            "nanovllm:request_success",
            "Finished requests by finish reason.",
            labelnames=["model_name", "finished_reason"],
            registry=self.registry,
        )
        self.registry.register(_EngineCounters(engine, model_name))

    def render(self) -> bytes:
        """The text exposition format, with the engine's load read now."""
        stats = self.engine.stats()
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_cache_usage.set(stats.kv_cache_usage)
        return generate_latest(self.registry)


class RequestTimer:
    """Times one request's outputs as the server receives them."""

    def __init__(self, metrics: ServerMetrics, num_prompt_tokens: int):
        self.metrics = metrics
        self.start = time.perf_counter()
        self.last: float | None = None
        metrics.prompt_tokens.inc(num_prompt_tokens)

    def observe(self, outputs: list[RequestOutput]) -> None:
        """Record outputs that arrived together: their tokens, TTFT or the gap since the last tokens,
        and how the request finished."""
        now = time.perf_counter()
        num_tokens = sum(len(c.token_ids) for output in outputs for c in output.outputs)
        if num_tokens:
            self.metrics.generation_tokens.inc(num_tokens)
            if self.last is None:
                self.metrics.ttft.observe(now - self.start)
            else:
                self.metrics.itl.observe(now - self.last)
            self.last = now
        if outputs[-1].finished:
            reasons = [c.finish_reason for output in outputs for c in output.outputs if c.finish_reason]
            self.finish(reasons[0] if reasons else "stop")

    def finish(self, reason: str) -> None:
        """Count the request as finished for `reason`, with its end-to-end latency."""
        self.metrics.e2e.observe(time.perf_counter() - self.start)
        self.metrics.finished.labels(self.metrics.model_name, reason).inc()
