"""Prometheus metrics of the server: load, KV-cache use, token counts and latencies."""

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from nanovllm.frontend.online_engine import OnlineEngine
from nanovllm.frontend.output_processor import RequestOutput

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


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
        self.ttft = make(Histogram, "time_to_first_token_seconds", "Time from arrival to the first token.",
                         buckets=_LATENCY_BUCKETS)
        self.itl = make(Histogram, "inter_token_latency_seconds", "Time between successive tokens of a request.",
                        buckets=_LATENCY_BUCKETS)
        self.model_name = model_name
        self.finished = Counter("nanovllm:request_success", "Finished requests by finish reason.",
                                labelnames=["model_name", "finished_reason"], registry=self.registry)

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

    def observe(self, output: RequestOutput) -> None:
        """Record an output: its tokens, TTFT or inter-token latency, and how it finished."""
        now = time.perf_counter()
        if output.token_ids:
            self.metrics.generation_tokens.inc(len(output.token_ids))
            if self.last is None:
                self.metrics.ttft.observe(now - self.start)
            else:
                self.metrics.itl.observe((now - self.last) / len(output.token_ids))
            self.last = now
        if output.finished:
            self.finish(output.finish_reason)

    def finish(self, reason: str) -> None:
        """Count the request as finished for `reason`."""
        self.metrics.finished.labels(self.metrics.model_name, reason).inc()
