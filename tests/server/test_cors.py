"""CORS as vLLM's server does it (Starlette's CORSMiddleware): --allowed-origins,
--allowed-methods, --allowed-headers (JSON lists, default ["*"]) and --allow-credentials;
preflights answered 200 on any path, Access-Control-Allow-Origin on responses."""

import json

import pytest
import requests

from conftest import REQUEST_TIMEOUT_S, start_server

pytestmark = pytest.mark.server

ORIGIN = "https://app.example"


def preflight(server, route, origin=ORIGIN, method="POST", headers=None):
    h = {"Origin": origin, "Access-Control-Request-Method": method}
    if headers:
        h["Access-Control-Request-Headers"] = headers
    return requests.options(server.url(route), headers=h, timeout=10)


def test_preflight_is_answered_by_default(server):
    for route in ("/v1/chat/completions", "/v1/models", "/tokenize", "/no/such/route"):
        r = preflight(server, route, headers="content-type, authorization")
        assert r.status_code == 200, (route, r.status_code, r.text[:200])
        assert r.headers["Access-Control-Allow-Origin"] == "*"
        methods = {m.strip() for m in r.headers["Access-Control-Allow-Methods"].split(",")}
        assert {"GET", "POST", "OPTIONS"} <= methods
        assert r.headers["Access-Control-Allow-Headers"] == "content-type, authorization"
        assert "Access-Control-Allow-Credentials" not in r.headers
    # An OPTIONS that is not a preflight is routed as before: no OPTIONS route, 405.
    assert requests.options(server.url("/v1/models"), timeout=10).status_code == 405


def test_responses_carry_allow_origin(server):
    h = {"Origin": ORIGIN}
    r = requests.get(server.url("/v1/models"), headers=h, timeout=10)
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "*"
    r = requests.post(server.url("/v1/completions"), json={"prompt": ""}, headers=h, timeout=10)
    assert r.status_code == 400 and r.headers["Access-Control-Allow-Origin"] == "*"
    r = requests.get(server.url("/no/such/route"), headers=h, timeout=10)
    assert r.status_code == 404 and r.headers["Access-Control-Allow-Origin"] == "*"
    with requests.post(server.url("/v1/completions"),
                       json={"prompt": "hi", "max_tokens": 2, "stream": True}, headers=h,
                       stream=True, timeout=REQUEST_TIMEOUT_S) as r:
        assert r.headers["Access-Control-Allow-Origin"] == "*"
        assert r.text.endswith("data: [DONE]\n\n")
    # No Origin: not a CORS request, no CORS headers.
    r = requests.get(server.url("/v1/models"), timeout=10)
    assert "Access-Control-Allow-Origin" not in r.headers


@pytest.fixture(scope="module")
def cors_server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("cors"), [
        "--allowed-origins", json.dumps([ORIGIN]), "--allowed-methods", '["GET", "POST"]',
        "--allowed-headers", '["Authorization", "X-Custom"]', "--allow-credentials"])
    yield srv
    srv.stop()


def test_listed_origins_methods_and_headers(cors_server):
    r = preflight(cors_server, "/v1/chat/completions", headers="Authorization, x-custom")
    assert r.status_code == 200, r.text
    assert r.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert r.headers["Access-Control-Allow-Credentials"] == "true"
    assert r.headers["Access-Control-Allow-Methods"] == "GET, POST"
    allowed = {h.strip() for h in r.headers["Access-Control-Allow-Headers"].split(",")}
    assert {"authorization", "x-custom", "content-type"} <= allowed
    assert "Origin" in r.headers["Vary"]
    for kwargs, failure in (({"origin": "https://evil.example"}, "origin"),
                            ({"method": "PUT"}, "method"),
                            ({"headers": "X-Other"}, "headers")):
        r = preflight(cors_server, "/v1/chat/completions", **kwargs)
        assert r.status_code == 400, (kwargs, r.status_code)
        assert r.text == f"Disallowed CORS {failure}", r.text
        assert r.headers.get("Access-Control-Allow-Origin") in (None, ORIGIN)
    r = requests.get(cors_server.url("/v1/models"), headers={"Origin": ORIGIN}, timeout=10)
    assert r.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert r.headers["Access-Control-Allow-Credentials"] == "true"
    r = requests.get(cors_server.url("/v1/models"), headers={"Origin": "https://evil.example"},
                     timeout=10)
    assert r.status_code == 200 and "Access-Control-Allow-Origin" not in r.headers
