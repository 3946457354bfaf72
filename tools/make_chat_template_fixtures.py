"""Renders the chat-template fixtures of tests/chat_template_test.cpp and tests/jinja_test.cpp.

The C++ Jinja interpreter (src/tokenizer/jinja_*) must render every chat exactly as
transformers does, so the reference here is transformers' own renderer
(render_jinja_template: jinja2's ImmutableSandboxedEnvironment with trim_blocks and
lstrip_blocks, its tojson, raise_exception, reasoning-field aliasing). Inputs go through
json.dumps / json.loads first, so Python sees exactly the values the C++ test parses.

Writes tests/fixtures/chat_templates/expected.json:
  chats:    [{name, template, messages, tools, add_generation_prompt, kwargs, bos_token,
              eos_token, expected | error}]
  snippets: [{name, template, context, expected | error}]  (interpreter features)

Usage: /work/venv/bin/python tools/make_chat_template_fixtures.py
"""

import json
from pathlib import Path

import jinja2
from transformers.utils.chat_template_utils import _compile_jinja_template, render_jinja_template

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "chat_templates"

SPECIAL_TOKENS = {
    "kimi.jinja": {"bos_token": "[BOS]", "eos_token": "[EOS]"},
    "deepseek_v32.jinja": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich or 北京"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "  Searches the web.\n  Returns the top results.  ",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {
                    "type": "object",
                    "properties": {
                        "site": {"type": "string"},
                        "max_results": {"type": "integer", "minimum": 1, "maximum": 50},
                        "score": {"type": "number", "default": 0.5},
                        "safe": {"type": "boolean", "default": True},
                    },
                },
            },
            "required": ["query"],
        },
    },
}


def call(name, arguments, call_id=None):
    c = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id is not None:
        c["id"] = call_id
    return c


WEATHER_ARGS = json.dumps({"city": "Zürich", "unit": "celsius"}, ensure_ascii=False)
NESTED_ARGS = json.dumps(
    {"query": "café \"crème\" 東京", "filters": {"site": "例子.jp", "max_results": 3, "score": 0.25,
                                                "tags": ["ü", "😀", None, True]}},
    ensure_ascii=False,
)

CONVERSATIONS = {
    "single_user": dict(messages=[{"role": "user", "content": "Hello!"}], add_generation_prompt=True),
    "system_user_no_thinking": dict(
        messages=[{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": "What is 2+2?"}],
        add_generation_prompt=True, kwargs={"thinking": False}),
    "multi_turn": dict(
        messages=[{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello. How can I help?"},
                  {"role": "user", "content": "Tell me a joke."}],
        add_generation_prompt=True),
    "multi_turn_no_generation_prompt": dict(
        messages=[{"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello."}],
        add_generation_prompt=False),
    "multi_part_content": dict(
        messages=[{"role": "system", "content": [{"type": "text", "text": "Rules: "},
                                                 {"type": "text", "text": "be kind."}]},
                  {"role": "user", "content": [{"type": "text", "text": "Part one. "},
                                               {"type": "text", "text": "Part two."}]}],
        add_generation_prompt=True),
    "names": dict(
        messages=[{"role": "system", "content": "Moderate.", "name": "moderator"},
                  {"role": "user", "content": "Hi all", "name": "alice"},
                  {"role": "assistant", "content": "Hi Alice", "name": "bot"},
                  {"role": "user", "content": "Hi bot", "name": "bob"}],
        add_generation_prompt=True, kwargs={"thinking": False}),
    "tool_call_round_trip": dict(
        messages=[{"role": "user", "content": "Weather in Zürich?"},
                  {"role": "assistant", "content": "", "reasoning_content": "Need the tool.",
                   "tool_calls": [call("get_weather", WEATHER_ARGS, "functions.get_weather:0")]},
                  {"role": "tool", "tool_call_id": "functions.get_weather:0", "name": "get_weather",
                   "content": "{\"temp\": 21.5, \"sky\": \"sunny\"}"}],
        tools=[WEATHER_TOOL], add_generation_prompt=True),
    "tool_call_nested_unicode_args": dict(
        messages=[{"role": "system", "content": "Use tools."},
                  {"role": "user", "content": "Find café crème in 東京"},
                  {"role": "assistant", "content": None,
                   "tool_calls": [call("search", NESTED_ARGS, "functions.search:0")]},
                  {"role": "tool", "tool_call_id": "functions.search:0", "name": "search",
                   "content": "[{\"title\": \"Café ☕\", \"url\": \"https://例子.jp\"}]"},
                  {"role": "assistant", "content": "Found one: Café ☕."},
                  {"role": "user", "content": "Thanks"}],
        tools=[WEATHER_TOOL, SEARCH_TOOL], add_generation_prompt=True),
    "tool_call_dict_arguments": dict(
        messages=[{"role": "user", "content": "Search"},
                  {"role": "assistant", "content": "Searching.",
                   "tool_calls": [call("search", {"query": "naïve", "filters": {"max_results": 2,
                                                                               "score": 1.0,
                                                                               "nested": {"a": [1, 2.5e-07, "ß"]}}})]}],
        tools=[SEARCH_TOOL], add_generation_prompt=False),
    "parallel_tool_calls_without_ids": dict(
        messages=[{"role": "user", "content": "Weather in Paris and Oslo"},
                  {"role": "assistant", "content": "",
                   "tool_calls": [call("get_weather", "{\"city\": \"Paris\"}"),
                                  call("get_weather", "{\"city\": \"Oslo\"}")]},
                  {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "12C"},
                  {"role": "tool", "tool_call_id": "functions.get_weather:1", "content": "3C"}],
        tools=[WEATHER_TOOL], add_generation_prompt=True, kwargs={"thinking": False}),
    "reasoning_history": dict(
        messages=[{"role": "user", "content": "Q1"},
                  {"role": "assistant", "content": "A1", "reasoning_content": "thinking about Q1"},
                  {"role": "user", "content": "Q2"},
                  {"role": "assistant", "content": "A2", "reasoning_content": "thinking about Q2"}],
        add_generation_prompt=False, kwargs={"thinking": True}),
    "reasoning_field_name": dict(
        messages=[{"role": "user", "content": "Why?"},
                  {"role": "assistant", "content": "Because.", "reasoning": "Let me think...\nOK."},
                  {"role": "user", "content": "Sure?"}],
        add_generation_prompt=True),
    "unicode_content": dict(
        messages=[{"role": "system", "content": "Réponds en français. 用中文也可以。"},
                  {"role": "user", "content": "Emoji 😀🎉, RTL עברית, math ∑∫, quotes \"'’, backslash \\ tab\tend"},
                  {"role": "assistant", "content": "D'accord — 好的 ✅"},
                  {"role": "user", "content": "Zero-width\u200bspace and nbsp\u00a0here"}],
        add_generation_prompt=True),
    "whitespace_content": dict(
        messages=[{"role": "user", "content": "  leading and trailing  \n\n"},
                  {"role": "assistant", "content": "\nline1\r\nline2\n"},
                  {"role": "user", "content": ""}],
        add_generation_prompt=True),
    "system_only": dict(
        messages=[{"role": "system", "content": "Just a system prompt."}],
        add_generation_prompt=True, kwargs={"thinking": False}),
    "tool_result_json_and_followup": dict(
        messages=[{"role": "system", "content": "Agent mode."},
                  {"role": "user", "content": "Plan a trip"},
                  {"role": "assistant", "content": "Checking weather first.", "reasoning_content": "Weather matters.",
                   "tool_calls": [call("get_weather", "{\"city\": \"Kyoto\", \"unit\": \"celsius\"}",
                                       "functions.get_weather:0")]},
                  {"role": "tool", "tool_call_id": "functions.get_weather:0", "name": "get_weather",
                   "content": [{"type": "text", "text": "{\"temp\": 18}"}]},
                  {"role": "assistant", "content": "Kyoto is mild.", "reasoning_content": "18C is fine."}],
        tools=[WEATHER_TOOL], add_generation_prompt=True),
    "thinking_explicit_true": dict(
        messages=[{"role": "user", "content": "Prove it."}],
        add_generation_prompt=True, kwargs={"thinking": True}),
    "extra_kwargs_ignored": dict(
        messages=[{"role": "user", "content": "Hi"}],
        add_generation_prompt=True, kwargs={"thinking": False, "unused_flag": 1, "nested": {"x": [1]}}),
}

ERROR_CONVERSATIONS = {
    ("kimi.jinja", "image_part_rejected"): dict(
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        add_generation_prompt=True),
    ("kimi.jinja", "unknown_role_rejected"): dict(
        messages=[{"role": "critic", "content": "hmm"}], add_generation_prompt=False),
    ("deepseek_v32.jinja", "unknown_role_rejected"): dict(
        messages=[{"role": "critic", "content": "hmm"}], add_generation_prompt=False),
}

# Interpreter features, rendered with transformers' environment: (name, template, context).
SNIPPETS = [
    ("text_only", "plain text\n", {}),
    ("trailing_newline_kept_once", "a\n\n", {}),
    ("crlf_normalized", "a\r\nb\rc{% if true %}\r\nd{% endif %}", {}),
    ("trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter", {}),
    ("lstrip_blocks", "a\n    {% if true %}\n    b\n    {% endif %}\nc", {}),
    ("lstrip_not_for_variables", "a\n    {{ 'x' }}\n", {}),
    ("plus_disables_lstrip", "a\n    {%+ if true %}b{% endif %}", {}),
    ("plus_disables_trim", "{% if true +%}\nb{% endif %}", {}),
    ("minus_strips", "a  \n  {%- if true -%}  \n  b  {{- ' c ' -}}  d  {#- c -#}  e {%- endif %} f", {}),
    ("comment_trim", "x{# comment #}\ny\n  {# c2 #}\nz", {}),
    ("raw_block", "{% raw %}{{ not rendered }}{% endraw %}", {}),
    ("if_elif_else", "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %},{% endfor %}", {}),
    ("loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}|{% endfor %}", {}),
    ("loop_prev_next", "{% for x in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}", {}),
    ("loop_else", "{% for x in [] %}no{% else %}empty{% endfor %}", {}),
    ("loop_filter", "{% for x in range(10) if x is odd %}{{ x }}{% endfor %}", {}),
    ("loop_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("loop_scope", "{% set x = 0 %}{% for i in [1, 2, 3] %}{% set x = x + i %}{{ x }},{% endfor %}{{ x }}", {}),
    ("tuple_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in d|items %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": [2]}}),
    ("namespace", "{% set ns = namespace(n=0, s='') %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}", {}),
    ("set_tuple_and_block", "{% set a, b = 1, 'two' %}{% set c %}[{{ a }}{{ b }}]{% endset %}{{ c }}{{ c|length }}", {}),
    ("macro", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(punct='.', name='C') }}", {}),
    ("literals_and_repr", "{{ [1, 'a', none, true, 2.5] }} {{ {'k': 'v', 'n': {'x': 1}} }} {{ 1.0 }} {{ 1e20 }} {{ 0.0001 }} {{ 1e-05 }} {{ -0.0 }} {{ 123456789.125 }}", {}),
    ("repr_quotes", "{{ [\"it's\", 'a\"b', 'x\\ny', 'tab\\t', 'é'] }}", {}),
    ("string_escapes", "{{ 'a\\tb\\\\c\\'d\\u00e9\\x41\\q\\101' }}|{{ \"\\n\" }}", {}),
    ("arithmetic", "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1 + 2.5 }} {{ 3 - 5 }} {{ 2 * 3.0 }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ -(3) }} {{ 5.5 // 2 }} {{ -5.5 % 2 }}", {}),
    ("concat_and_plus", "{{ 'a' ~ 1 ~ none ~ true ~ 1.5 ~ undefined_var }} {{ 'x' + 'y' }} {{ [1] + [2] }}", {}),
    ("comparisons", "{{ 1 == 1.0 }} {{ 1 != 2 }} {{ 'a' < 'b' }} {{ 2 >= 2 }} {{ [1, 2] < [1, 3] }} {{ 'é' > 'z' }} {{ {'a': 1} == {'a': 1.0} }} {{ none == none }}", {}),
    ("logic", "{{ 0 or 'x' }} {{ 1 and 'y' }} {{ '' and 'z' }} {{ not 0 }} {{ not [] and 'a' or 'b' }} {{ 'yes' if 1 > 2 else 'no' }} [{{ 'v' if false }}]", {}),
    ("membership", "{{ 'a' in 'cat' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} {{ 'x' in undefined_var }}", {}),
    ("subscripts_and_slices", "{{ s[0] }}{{ s[-1] }}{{ s[1:3] }}{{ s[::-1] }}{{ s[:-1] }}{{ l[1:] }}{{ l[::2] }}{{ l[-2:] }}{{ d['k'] }}{{ d.k }}{{ l.0 }}{{ s[10:] }}|{{ l[5] is defined }}", {"s": "héllo", "l": [1, 2, 3, 4], "d": {"k": "v"}}),
    ("tests", "{{ x is defined }}{{ y is undefined }}{{ n is none }}{{ 's' is string }}{{ d is mapping }}{{ l is iterable }}{{ 1 is number }}{{ 1.5 is number }}{{ true is number }}{{ true is integer }}{{ 1 is integer }}{{ 1.0 is float }}{{ 4 is even }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}{{ 'a' is in 'abc' }}{{ 1 is eq 1 }}{{ n is not none }}{{ l is sequence }}{{ 'ab' is lower }}{{ f is callable }}", {"x": 1, "n": None, "d": {}, "l": [1]}),
    ("filters_basic", "{{ '  pad  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ 'Hello'|upper }}{{ 'Hello'|lower }}|{{ 'hello world'|capitalize }}|{{ 'hello wORLD'|title }}|{{ 5|string ~ 'x' }}|{{ 'héllo'|length }}{{ [1, 2]|length }}{{ {'a': 1}|count }}|{{ 'a-b-c'|replace('-', '+') }}{{ 'aaa'|replace('a', 'b', 2) }}", {}),
    ("filters_default", "{{ missing|default('d') }}|{{ ''|default('d') }}|{{ ''|default('d', true) }}|{{ none|default('d') }}|{{ missing|d('e') }}", {}),
    ("filters_lists", "{{ [3, 1, 2]|join(', ') }}|{{ ['b', 'A', 'a']|sort }}|{{ [3, 1, 2]|sort(reverse=true) }}|{{ [1, 2]|first }}{{ [1, 2]|last }}|{{ 'abc'|list }}|{{ [1, 2, 3]|reverse|list }}|{{ 'abc'|reverse }}|{{ [1, 2, 3]|sum }}|{{ [3, 5, 1]|max }}{{ [3, 5, 1]|min }}|{{ ['a', 'A', 'b']|unique|list }}", {}),
    ("filters_attr", "{{ users|selectattr('active')|map(attribute='name')|join(',') }}|{{ users|rejectattr('active')|map(attribute='name')|list }}|{{ users|selectattr('role', 'equalto', 'admin')|list|length }}|{{ users|map(attribute='missing', default='?')|join }}|{{ [1, 2, 3, 4]|select('even')|list }}|{{ [1, 0, 2]|reject|list }}|{{ users|map(attribute='name')|map('upper')|join }}|{{ users|sort(attribute='name')|map(attribute='name')|join }}|{{ users|join(',', attribute='name') }}",
     {"users": [{"name": "bo", "active": True, "role": "admin"}, {"name": "al", "active": False, "role": "user"}]}),
    ("filters_numbers", "{{ '42'|int + 1 }} {{ 'x'|int }} {{ '3.9'|int }} {{ 3.9|int }} {{ '2.5'|float }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.567|round(2, 'floor') }} {{ -3|abs }} {{ 7|float }}", {}),
    ("filters_items_and_dict", "{{ d|items|list }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 'dflt') }} {{ dict(x=1, y='2') }}", {"d": {"a": 1, "b": [True, None]}}),
    ("tojson", "{{ d|tojson }}\n{{ d|tojson(indent=2) }}\n{{ d|tojson(separators=(',', ':')) }}\n{{ d|tojson(ensure_ascii=true) }}\n{{ d|tojson(sort_keys=true) }}\n{{ []|tojson(indent=2) }}{{ {}|tojson }}{{ 'a<b>&\\'\"'|tojson }}",
     {"d": {"z": "Zürich 😀 \"q\" \\ \n\t\u0001", "a": [1, 2.5, None, True, 1e-07, 1e16], "n": {"k": {}}}}),
    ("indent_filter", "{{ 'a\nb\n\nc'|indent }}|{{ 'a\nb'|indent(2, true) }}|{{ 'a\n\nb'|indent('> ', blank=true) }}", {}),
    ("string_methods", "{{ s.startswith('he') }}{{ s.endswith(('x', 'lo')) }}|{{ '  a b  '.strip() }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'xxaxx'.rstrip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a b c'.rsplit(' ', 1) }}|{{ s.replace('l', 'L') }}|{{ s.upper() }}{{ s.find('l') }}{{ s.count('l') }}|{{ '-'.join(['a', 'b']) }}|{{ s.title() }}", {"s": "hello"}),
    ("unicode_strip", "[{{ '\u00a0\u3000x\u2003'.strip() }}][{{ ' \u00a0y'|trim }}]", {}),
    ("messages_shape", "{% for m in messages %}{{ m.role }}:{{ m['content'] }}{% if not loop.last %}\n{% endif %}{% endfor %}", {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]}),
    ("none_attribute_is_undefined", "{{ n.foo }}|{{ n.foo is defined }}|{{ d.missing is defined }}", {"n": None, "d": {}}),
    ("strftime_now_type", "{{ strftime_now('%Y') is string }} {{ strftime_now('%Y')|length }}", {}),
    ("whitespace_in_nested_blocks", "<start>\n{% for m in ms %}\n  {% if m %}\n    item {{ m }}\n  {% endif %}\n{% endfor %}\n<end>\n", {"ms": [1, 0, 2]}),
    ("filter_precedence", "{{ -2|abs }} {{ [1, 2]|length + 1 }} {{ 'a' ~ [1]|length }} {{ not [] | length }}", {}),
    ("dict_literal_order", "{% set d = {'b': 1, 'a': 2, 'b': 3} %}{{ d }} {{ d|tojson }}", {}),
    ("trim_only_direct_newline", "{% if true %}  \n x{% endif %}|{% if true %}\n\n y{% endif %}", {}),
    ("lstrip_tabs_and_mid_line", "\t{% if true %}x{% endif %}\n a {% if true %}y{% endif %}", {}),
    ("minus_and_trim_mix", "{%- if true %}\n\n{% endif -%}\n  z  {{- 'w' }}\n", {}),
    ("braces_in_tags", "{{ '{{' ~ '}}' }} {{ {'a': {'b': 1}} }} {{ {'a': {'b': 1}}['a'] }}", {}),
    ("comment_between_lines", "a\n  {# c #}\n  {% set x = 1 %}\nb{{ x }}", {}),
    ("nested_data", "{{ data['items'][0].tags[-1] }} {{ data['items']|length }} {{ data.items()|list|length }}", {"data": {"items": [{"tags": ["x", "y"]}]}}),
    ("tuples", "{{ (1, 'a') }} {{ (1,) }} {{ () }} {{ (1, 2) == [1, 2] }} {{ 'b' in ('a', 'b') }} {{ (1, 2)|list }}", {}),
]

ERROR_SNIPPETS = [
    ("unknown_filter", "line1\n{{ x|nosuchfilter }}", {}),
    ("syntax_error_line", "ok\n{% if %}\n{% endif %}", {}),
    ("unclosed_block", "{% for x in y %}", {}),
    ("unknown_tag", "\n\n{% frobnicate %}", {}),
    ("raise_exception", "{% if true %}{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}", {}),
    ("undefined_attribute", "\n{{ missing.attr }}", {}),
    ("type_error", "{{ 'a' + 1 }}", {}),
    ("unsafe_method", "{{ [1].append(2) }}", {}),
    ("division_by_zero", "{{ 1 / 0 }}", {}),
    ("dict_method_shadows_key", "{{ data.items[0] }}", {"data": {"items": [1]}}),
]


def roundtrip(value):
    return json.loads(json.dumps(value, ensure_ascii=False))


def render_chat(template, case):
    special = SPECIAL_TOKENS[template]
    rendered, _ = render_jinja_template(
        [case["messages"]],
        tools=case["tools"],
        chat_template=(FIXTURES / template).read_text(),
        add_generation_prompt=case["add_generation_prompt"],
        **special,
        **case["kwargs"],
    )
    return rendered[0]


def chat_case(template, name, spec):
    case = roundtrip({
        "name": f"{Path(template).stem}/{name}",
        "template": template,
        "messages": spec["messages"],
        "tools": spec.get("tools"),
        "add_generation_prompt": spec["add_generation_prompt"],
        "kwargs": spec.get("kwargs", {}),
        **SPECIAL_TOKENS[template],
    })
    try:
        case["expected"] = render_chat(template, case)
    except jinja2.TemplateError as e:
        case["error"] = e.message
    return case


def snippet_case(name, template, context):
    case = roundtrip({"name": name, "template": template, "context": context})
    try:
        case["expected"] = _compile_jinja_template(template).render(**case["context"])
    except Exception as e:  # noqa: BLE001 - any jinja2 or Python error is an expected error
        case["error"] = str(getattr(e, "message", None) or e)
        case["error_line"] = getattr(e, "lineno", None)
    return case


def main():
    chats = [chat_case(t, name, spec) for t in SPECIAL_TOKENS for name, spec in CONVERSATIONS.items()]
    chats += [chat_case(t, name, spec) for (t, name), spec in ERROR_CONVERSATIONS.items()]
    snippets = [snippet_case(*s) for s in SNIPPETS + ERROR_SNIPPETS]
    # The strftime_now snippet is deterministic only in type and length.
    out = {"jinja2_version": jinja2.__version__, "chats": chats, "snippets": snippets}
    (FIXTURES / "expected.json").write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    print(f"{len(chats)} chats, {len(snippets)} snippets -> {FIXTURES / 'expected.json'}")


if __name__ == "__main__":
    main()
