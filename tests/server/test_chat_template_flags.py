"""vLLM's chat-template controls: `--chat-template` (a Jinja file, or the template itself with
its backslash escapes) in place of the model's template, and a request's own `chat_template`,
refused (400, vLLM's words) unless the server runs with `--trust-request-chat-template`."""

import subprocess

import pytest
import requests

from conftest import MODEL_DIR, REQUEST_TIMEOUT_S, assert_openai_error, binary_path, \
    free_port, server_environment, start_server

pytestmark = pytest.mark.server

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
# Rendered: "<system>Be brief.|<user>hi|<assistant>"
INLINE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}|{% endfor %}"
          "{% if add_generation_prompt %}<assistant>{% endif %}")
REQUEST_TEMPLATE = "{{ messages[-1]['content'] }} ({{ messages | length }})"


def rendered(srv, **extra):
    r = requests.post(srv.url("/tokenize"), json={"messages": MESSAGES, **extra},
                      timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 200, r.text[:500]
    ids = r.json()["tokens"]
    text = requests.post(srv.url("/detokenize"), json={"tokens": ids},
                         timeout=REQUEST_TIMEOUT_S).json()["prompt"]
    return text, len(ids)


def chat(srv, **extra):
    return requests.post(srv.url("/v1/chat/completions"),
                         json={"messages": MESSAGES, "max_tokens": 1, **extra},
                         timeout=REQUEST_TIMEOUT_S)


def test_a_request_template_needs_the_trust_flag(server):
    for route in ("/v1/chat/completions", "/tokenize"):
        r = requests.post(server.url(route),
                          json={"messages": MESSAGES, "max_tokens": 1,
                                "chat_template": REQUEST_TEMPLATE},
                          timeout=REQUEST_TIMEOUT_S)
        error = assert_openai_error(r, 400)
        assert error["param"] == "chat_template"
        assert "--trust-request-chat-template" in error["message"]


def test_inline_chat_template_and_trusted_request_templates(tmp_path):
    # As a shell passes it: the escapes stay backslashes until the server decodes them.
    srv = start_server(tmp_path, ["--chat-template", INLINE.replace("|", "\\n"),
                                  "--trust-request-chat-template"])
    try:
        text, count = rendered(srv)
        assert text == "<system>Be brief.\n<user>hi\n<assistant>"
        r = chat(srv)
        assert r.status_code == 200, r.text[:500]
        assert r.json()["usage"]["prompt_tokens"] == count
        text, count = rendered(srv, chat_template=REQUEST_TEMPLATE)
        assert text == "hi (2)"
        r = chat(srv, chat_template=REQUEST_TEMPLATE)
        assert r.status_code == 200, r.text[:500]
        assert r.json()["usage"]["prompt_tokens"] == count
        # A request template that does not parse: a 400 naming the template's error.
        error = assert_openai_error(chat(srv, chat_template="{% for %}"), 400)
        assert "chat template" in error["message"]
    finally:
        srv.stop()


def test_chat_template_from_a_file(tmp_path):
    path = tmp_path / "template.jinja"
    path.write_text(INLINE.replace("|", "\n"))
    srv = start_server(tmp_path, ["--chat-template", str(path)])
    try:
        text, _ = rendered(srv)
        assert text == "<system>Be brief.\n<user>hi\n<assistant>"
    finally:
        srv.stop()


@pytest.mark.parametrize("arg, words", [("no/such/template.jinja", "could not be opened"),
                                        ("{% for %}", "--chat-template")])
def test_a_bad_chat_template_stops_the_server_naming_it(arg, words):
    cmd = [str(binary_path()), "serve", str(MODEL_DIR), "--port", str(free_port()),
           "--chat-template", arg]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                       env=server_environment())
    assert r.returncode != 0
    assert words in r.stderr + r.stdout
