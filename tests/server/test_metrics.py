"""GET /metrics: vLLM's metric names with a model_name label."""

import re
import time

import pytest
import requests

from conftest import metric_samples, metric_sum, wait_idle

pytestmark = [pytest.mark.server, pytest.mark.metrics]


def test_metrics_names_and_labels(server, client):
    client.completions.create(model=server.model, prompt="warm up", max_tokens=2)
    r = requests.get(server.url("/metrics"), timeout=10)
    assert r.status_code == 200
    assert r.headers.get("content-type", "").startswith("text/plain")
    for name in ("vllm:num_requests_running", "vllm:generation_tokens_total",
                 "vllm:request_success_total"):
        samples = metric_samples(r.text, name)
        assert samples, f"{name} missing from /metrics"
        assert any(f'model_name="{server.model}"' in labels for labels, _ in samples), (
            f"{name} has no model_name=\"{server.model}\" label: {samples}")
    assert any("finished_reason=" in labels
               for labels, _ in metric_samples(r.text, "vllm:request_success_total"))


def test_metrics_count_tokens_and_requests(server, client):
    wait_idle(server)
    gen_before = metric_sum(server, "vllm:generation_tokens_total")
    ok_before = metric_sum(server, "vllm:request_success_total")
    r = client.completions.create(model=server.model, prompt="count me", max_tokens=7,
                                  extra_body={"ignore_eos": True})
    wait_idle(server)
    assert metric_sum(server, "vllm:generation_tokens_total") - gen_before == \
        r.usage.completion_tokens == 7
    assert metric_sum(server, "vllm:request_success_total") - ok_before == 1
    assert metric_sum(server, "vllm:num_requests_running") == 0


def test_metrics_latency_histograms_count_requests(server, client):
    names = ("vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count",
             "vllm:request_queue_time_seconds_count")
    wait_idle(server)
    before = {n: metric_sum(server, n) for n in names}
    client.completions.create(model=server.model, prompt="time me", max_tokens=3,
                              extra_body={"ignore_eos": True})
    wait_idle(server)
    for n in names:
        assert metric_sum(server, n) - before[n] == 1, n


def _aborted(server):
    text = requests.get(server.url("/metrics"), timeout=10).text
    return sum(v for labels, v in metric_samples(text, "vllm:request_success_total")
               if 'finished_reason="abort"' in labels)


def test_metrics_count_client_aborts(server):
    """Streams the client drops count as finished_reason="abort" (the engine's record)."""
    wait_idle(server)
    before = _aborted(server)
    for _ in range(3):
        with requests.post(server.url("/v1/completions"), stream=True, timeout=30, json={
                "model": server.model, "prompt": "abort me", "max_tokens": 2000,
                "ignore_eos": True, "stream": True}) as r:
            assert r.status_code == 200
            next(r.iter_lines())  # the first chunk, then the connection closes
    deadline = time.time() + 20
    while time.time() < deadline and _aborted(server) - before < 3:
        time.sleep(0.1)
    assert _aborted(server) - before == 3


def test_metrics_prompt_tokens_count_the_whole_prompt(server, client):
    """A prefix-cache hit still counts its whole prompt in prompt_tokens_total (vLLM)."""
    prompt = "the same long prompt, twice over " * 8
    wait_idle(server)
    before = metric_sum(server, "vllm:prompt_tokens_total")
    hits_before = metric_sum(server, "vllm:prefix_cache_hits_total")
    r1 = client.completions.create(model=server.model, prompt=prompt, max_tokens=1)
    r2 = client.completions.create(model=server.model, prompt=prompt, max_tokens=1)
    wait_idle(server)
    assert metric_sum(server, "vllm:prefix_cache_hits_total") > hits_before
    assert r2.usage.prompt_tokens_details.cached_tokens > 0
    assert metric_sum(server, "vllm:prompt_tokens_total") - before == \
        r1.usage.prompt_tokens + r2.usage.prompt_tokens


def test_metrics_vllm_v1_series_labels_and_numbers(server, client):
    client.completions.create(model=server.model, prompt="series", max_tokens=3, n=2,
                              extra_body={"ignore_eos": True})
    wait_idle(server)
    text = requests.get(server.url("/metrics"), timeout=10).text
    for name in ("vllm:request_prompt_tokens_count", "vllm:request_generation_tokens_count",
                 "vllm:iteration_tokens_total_count", "vllm:request_max_num_generation_tokens_count",
                 "vllm:request_params_n_count", "vllm:request_params_max_tokens_count",
                 "vllm:request_time_per_output_token_seconds_count",
                 "vllm:request_inference_time_seconds_count",
                 "vllm:request_prefill_time_seconds_count",
                 "vllm:request_decode_time_seconds_count", "vllm:inter_token_latency_seconds_count",
                 "vllm:cache_config_info", "process_resident_memory_bytes",
                 "process_cpu_seconds_total", "process_open_fds", "process_start_time_seconds"):
        samples = metric_samples(text, name)
        assert samples, f"{name} missing from /metrics"
        if name.startswith("vllm:"):
            assert all(f'model_name="{server.model}"' in labels and 'engine="0"' in labels
                       for labels, _ in samples), (name, samples)
    assert metric_samples(text, "vllm:request_params_n_count")[0][1] >= 1
    # Bucket bounds as Prometheus' client writes them, not 17 significant digits.
    les = re.findall(r'le="([^"]+)"', text)
    assert "0.005" in les and "1.0" in les and "+Inf" in les
    assert all(len(le) <= 8 for le in les), [le for le in les if len(le) > 8]
    info = metric_samples(text, "vllm:cache_config_info")[0][0]
    assert "block_size=" in info and "enable_prefix_caching=" in info


def test_metrics_http_series_by_handler_method_and_status(server, client):
    client.completions.create(model=server.model, prompt="http", max_tokens=1)
    assert requests.get(server.url("/no/such/route"), timeout=10).status_code == 404
    text = requests.get(server.url("/metrics"), timeout=10).text
    counts = {labels: v for labels, v in metric_samples(text, "http_requests_total")}
    assert counts.get('{handler="/v1/completions",method="POST",status="2xx"}', 0) >= 1, counts
    assert counts.get('{handler="none",method="GET",status="4xx"}', 0) >= 1, counts
    durations = metric_samples(text, "http_request_duration_seconds_count")
    assert any('handler="/v1/completions"' in labels and v >= 1 for labels, v in durations)
