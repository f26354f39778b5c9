"""Server metrics: token counters, latency histograms and finish reasons, and the engine's load at scrape time."""

from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from nanovllm.engine.messages import EngineStats
from nanovllm.frontend.output_processor import RequestOutput
from nanovllm.entrypoints.metrics import RequestTimer, ServerMetrics


def samples(metrics: ServerMetrics) -> dict:
    text = metrics.render().decode()
    return {(s.name, s.labels.get("finished_reason")): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def output(tokens, reason=None):
    return RequestOutput(request_id=0, token_ids=tokens, text="", num_prompt_tokens=4,
                         num_completion_tokens=0, finish_reason=reason)


def test_render_reads_engine_load_now():
    engine = SimpleNamespace(stats=lambda: EngineStats(num_running=3, num_waiting=2, kv_cache_usage=0.25))
    got = samples(ServerMetrics(engine, "m"))
    assert got[("nanovllm:num_requests_running", None)] == 3
    assert got[("nanovllm:num_requests_waiting", None)] == 2
    assert got[("nanovllm:kv_cache_usage_perc", None)] == 0.25


def test_request_timer_counts_tokens_latencies_and_reasons():
    metrics = ServerMetrics(SimpleNamespace(stats=EngineStats), "m")
    timer = RequestTimer(metrics, num_prompt_tokens=4)
    for out in (output([7]), output([]), output([8, 9]), output([10], "length")):
        timer.observe(out)
    RequestTimer(metrics, num_prompt_tokens=2).finish("abort")
    got = samples(metrics)
    assert got[("nanovllm:prompt_tokens_total", None)] == 6
    assert got[("nanovllm:generation_tokens_total", None)] == 4
    assert got[("nanovllm:time_to_first_token_seconds_count", None)] == 1
    # an output with no tokens is no gap between tokens
    assert got[("nanovllm:inter_token_latency_seconds_count", None)] == 2
    assert got[("nanovllm:request_success_total", "length")] == 1
    assert got[("nanovllm:request_success_total", "abort")] == 1


def test_two_servers_in_one_process_keep_apart():
    engine = SimpleNamespace(stats=EngineStats)
    a, b = ServerMetrics(engine, "a"), ServerMetrics(engine, "b")
    RequestTimer(a, num_prompt_tokens=5)
    assert samples(a)[("nanovllm:prompt_tokens_total", None)] == 5
    assert samples(b)[("nanovllm:prompt_tokens_total", None)] == 0
