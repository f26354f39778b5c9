"""Server metrics: token counters, latency histograms and finish reasons, and the engine's load at scrape time."""

from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from nanovllm.engine.messages import EngineStats
from nanovllm.entrypoints.metrics import RequestTimer, ServerMetrics
from nanovllm.outputs import CompletionOutput, RequestOutput


def samples(metrics: ServerMetrics) -> dict:
    text = metrics.render().decode()
    return {
        (s.name, s.labels.get("finished_reason")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def output(tokens, reason=None):
    completion = CompletionOutput(0, "", tokens, None, None, reason)
    return RequestOutput("0", None, [1, 2, 3, 4], None, [completion], finished=reason is not None)


def test_render_reads_engine_load_and_counters_now():
    stats = EngineStats(
        num_running=3,
        num_waiting=2,
        kv_cache_usage=0.25,
        prefix_cache_queries=40,
        prefix_cache_hits=32,
        num_preemptions=5,
        spec_decode_num_drafts=7,
        spec_decode_num_draft_tokens=20,
        spec_decode_num_accepted_tokens=11,
        spec_decode_num_accepted_tokens_per_pos=[6, 4, 1],
    )
    got = samples(ServerMetrics(SimpleNamespace(stats=lambda: stats), "m"))
    assert got[("nanovllm:num_requests_running", None)] == 3
    assert got[("nanovllm:num_requests_waiting", None)] == 2
    assert got[("nanovllm:kv_cache_usage_perc", None)] == 0.25
    assert got[("nanovllm:prefix_cache_queries_total", None)] == 40
    assert got[("nanovllm:prefix_cache_hits_total", None)] == 32
    assert got[("nanovllm:num_preemptions_total", None)] == 5
    assert got[("nanovllm:spec_decode_num_drafts_total", None)] == 7
    assert got[("nanovllm:spec_decode_num_draft_tokens_total", None)] == 20
    assert got[("nanovllm:spec_decode_num_accepted_tokens_total", None)] == 11
    text = ServerMetrics(SimpleNamespace(stats=lambda: stats), "m").render().decode()
    assert 'nanovllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="2"} 1.0' in text


def test_request_timer_counts_tokens_latencies_and_reasons():
    metrics = ServerMetrics(SimpleNamespace(stats=EngineStats), "m")
    timer = RequestTimer(metrics, num_prompt_tokens=4)
    for arrived in ([output([7])], [output([])], [output([8]), output([9])], [output([10], "length")]):
        timer.observe(arrived)
    RequestTimer(metrics, num_prompt_tokens=2).finish("abort")
    got = samples(metrics)
    assert got[("nanovllm:prompt_tokens_total", None)] == 6
    assert got[("nanovllm:generation_tokens_total", None)] == 4
    assert got[("nanovllm:time_to_first_token_seconds_count", None)] == 1
    # outputs with no tokens are no gap between tokens; outputs that arrived together are one
    assert got[("nanovllm:inter_token_latency_seconds_count", None)] == 2
    assert got[("nanovllm:request_success_total", "length")] == 1
    assert got[("nanovllm:request_success_total", "abort")] == 1
    assert got[("nanovllm:e2e_request_latency_seconds_count", None)] == 2


def test_two_servers_in_one_process_keep_apart():
    engine = SimpleNamespace(stats=EngineStats)
    a, b = ServerMetrics(engine, "a"), ServerMetrics(engine, "b")
    RequestTimer(a, num_prompt_tokens=5)
    assert samples(a)[("nanovllm:prompt_tokens_total", None)] == 5
    assert samples(b)[("nanovllm:prompt_tokens_total", None)] == 0
