"""GET /metrics: vLLM's metric names with a model_name label."""

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
