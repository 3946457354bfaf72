// The Jinja interpreter: hand-written expectations for each feature chat templates use,
// errors with their line and column, and every snippet of
// tests/fixtures/chat_templates/expected.json rendered as transformers' jinja2 renders it.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "tokenizer/jinja_template.h"

namespace hyserve::jinja {
namespace {

std::string render(const std::string& source, const std::string& context_json = "{}") {
  const Value context = Value::from_json(nlohmann::ordered_json::parse(context_json));
  return Template(source).render(context.as_dict());
}

// Renders and returns the error; fails the test when rendering succeeds.
TemplateError render_error(const std::string& source, const std::string& context_json = "{}") {
  try {
    render(source, context_json);
  } catch (const TemplateError& e) {
    return e;
  }
  ADD_FAILURE() << "no error from: " << source;
  return TemplateError("", 0, 0);
}

TEST(Jinja, OutputsPythonStrOfValues) {
  EXPECT_EQ(render("{{ 1 }} {{ 2.0 }} {{ 0.1 }} {{ 1e16 }} {{ 1.5e-5 }} {{ true }} {{ none }} "
                   "[{{ missing }}]"),
            "1 2.0 0.1 1e+16 1.5e-05 True None []");
  EXPECT_EQ(render("{{ x }}", R"({"x": [1, "a", {"k": null}, [true]]})"),
            "[1, 'a', {'k': None}, [True]]");
  EXPECT_EQ(render("{{ ('a', 1) }}{{ (2,) }}"), "('a', 1)(2,)");
  EXPECT_EQ(render(R"({{ ["it's", 'say "hi"', 'both \' "'] }})"),
            R"(["it's", 'say "hi"', 'both \' "'])");
}

TEST(Jinja, WhitespaceControlAsTransformersConfiguresIt) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: indentation before it.
  EXPECT_EQ(render("{% if true %}\n  x\n  {% endif %}\ny"), "  x\ny");
  // Not for {{ }}.
  EXPECT_EQ(render("  {{ 'a' }}\nb"), "  a\nb");
  // '-' strips all whitespace on that side; '+' keeps it.
  EXPECT_EQ(render("a \n {{- 'b' -}} \n c"), "abc");
  EXPECT_EQ(render("a\n  {%+ if true %}b{% endif +%}\nc"), "a\n  b\nc");
  // One trailing newline of the template is dropped; \r\n becomes \n.
  EXPECT_EQ(render("x\r\n\n"), "x\n");
  EXPECT_EQ(render("{# note #}\n  {# note #}\nz"), "z");
}

TEST(Jinja, ControlFlow) {
  EXPECT_EQ(render("{% for x in xs %}{% if x > 2 %}big{% elif x == 2 %}two{% else %}small{% endif "
                   "%}{{ ',' if not loop.last }}{% endfor %}",
                   R"({"xs": [1, 2, 3]})"),
            "small,two,big");
  EXPECT_EQ(render("{% for x in [] %}a{% else %}none{% endfor %}"), "none");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ loop.index }}{{ k }}{{ v }}{% endfor %}",
                   R"({"d": {"z": 1, "a": 2}})"),
            "1z12a2");
  EXPECT_EQ(render("{% for x in range(6) if x != 1 %}{% if x == 4 %}{% break %}{% endif %}{{ x }}"
                   "{{ loop.length }}{% endfor %}"),
            "052535");
  // A set inside a loop is local to one iteration; a namespace carries state out.
  EXPECT_EQ(render("{% set n = 1 %}{% set ns = namespace(t=0) %}{% for i in [1, 2] %}{% set n = "
                   "n + i %}{% set ns.t = ns.t + n %}{% endfor %}{{ n }} {{ ns.t }}"),
            "1 5");
  EXPECT_EQ(
      render("{% macro m(a, b='B') %}<{{ a }}{{ b }}>{% endmacro %}{{ m(1) }}{{ m(b=2, a=3) }}"),
      "<1B><32>");
}

TEST(Jinja, OperatorsFollowPython) {
  EXPECT_EQ(render("{{ -7 // 2 }} {{ -7 % 3 }} {{ 1 / 4 }} {{ 2 ** 3 }} {{ 'a' ~ 1 ~ none }}"),
            "-4 2 0.25 8 a1None");
  EXPECT_EQ(render("{{ 1 == 1.0 }} {{ 'b' in 'abc' }} {{ 3 not in [1, 2] }} {{ 0 or 'x' }} "
                   "{{ 'y' and 0 }}"),
            "True True True x 0");
  EXPECT_EQ(render("{{ s[1:-1] }} {{ s[::-1] }} {{ l[-1] }} {{ s|length }}",
                   R"({"s": "añbç", "l": [1, 2]})"),
            "ñb çbña 2 4");
}

TEST(Jinja, FiltersTestsAndMethods) {
  EXPECT_EQ(
      render(
          "{{ d|tojson }}|{{ d|tojson(separators=(',', ':')) }}|{{ d|tojson(ensure_ascii=true) }}",
          R"({"d": {"b": "é\n", "a": [1, 2.5]}})"),
      R"({"b": "é\n", "a": [1, 2.5]}|{"b":"é\n","a":[1,2.5]}|{"b": "\u00e9\n", "a": [1, 2.5]})");
  EXPECT_EQ(render("{{ ' x '|trim }}{{ 'a'|upper }}{{ x|default('d') }}{{ [1, 2]|join('+') }}"
                   "{{ [3, 4]|first }}{{ [3, 4]|last }}{{ 'a.b'.split('.')|last }}"),
            "xAd1+234b");
  EXPECT_EQ(
      render(
          "{{ ms|selectattr('role', 'equalto', 'user')|map(attribute='c')|join }}",
          R"({"ms": [{"role": "user", "c": "u1"}, {"role": "bot", "c": "b"}, {"role": "user", "c": "u2"}]})"),
      "u1u2");
  EXPECT_EQ(render("{{ x is defined }}{{ n is none }}{{ 's' is string }}{{ {} is mapping }}"
                   "{{ [] is iterable }}{{ 1.5 is number }}{{ 's' is not number }}",
                   R"({"x": 0, "n": null})"),
            "TrueTrueTrueTrueTrueTrueTrue");
  EXPECT_EQ(render("{{ 'abc'.startswith('ab') }}{{ ' a '.strip() }}{{ 'xa'.lstrip('x') }}"
                   "{{ 'ax'.rstrip('x') }}{{ 'a-b'.replace('-', '') }}{{ 'abc'.endswith('bc') }}"
                   "{{ d.get('k') }}{{ d.get('z', 0) }}{{ d.keys()|list }}",
                   R"({"d": {"k": "v"}})"),
            "TrueaaaabTruev0['k']");
}

TEST(Jinja, ErrorsNameLineAndColumn) {
  const auto unknown_filter = render_error("line one\n  {{ x|frobnicate }}");
  EXPECT_EQ(unknown_filter.message(), "No filter named 'frobnicate'.");
  EXPECT_EQ(unknown_filter.line(), 2);
  EXPECT_EQ(unknown_filter.column(), 8);
  EXPECT_NE(std::string(unknown_filter.what()).find("line 2, column 8"), std::string::npos);

  const auto syntax = render_error("a\nb\n{% if x == %}{% endif %}");
  EXPECT_EQ(syntax.line(), 3);
  EXPECT_EQ(render_error("{% for x in y %}").message(),
            "Unexpected end of template. Jinja was looking for the following tags: 'endfor' or "
            "'else'");
  EXPECT_EQ(render_error("\n{% include 'x' %}").line(), 2);
  EXPECT_EQ(render_error("{{ x is frob }}").message(), "No test named 'frob'.");
  EXPECT_EQ(render_error("{{ 'unterminated }}").message(), "unexpected end of string");
}

TEST(Jinja, RaiseExceptionSurfacesTheMessage) {
  const auto e = render_error(
      "{% for m in ms %}\n{% if m != 'user' %}{{ raise_exception('Only "
      "user roles, got ' ~ m) }}{% endif %}{% endfor %}",
      R"({"ms": ["user", "critic"]})");
  EXPECT_EQ(e.message(), "Only user roles, got critic");
  EXPECT_EQ(e.line(), 2);
}

TEST(Jinja, RuntimeErrorsMatchJinja2) {
  EXPECT_EQ(render_error("{{ x.y }}").message(), "'x' is undefined");
  EXPECT_EQ(render_error("{{ d.a.b }}", R"({"d": {}})").message(),
            "'dict object' has no attribute 'a'");
  EXPECT_EQ(render("{{ n.a is defined }}", R"({"n": null})"), "False");
  EXPECT_EQ(render_error("{{ 'a' + 1 }}").message(),
            "can only concatenate str (not \"int\") to str");
  EXPECT_EQ(render_error("{{ [].append(1) }}").message(),
            "access to attribute 'append' of 'list' object is unsafe.");
  EXPECT_EQ(render_error("{{ 1 // 0 }}").message(), "integer division or modulo by zero");
  EXPECT_EQ(render_error("{{ undefined_thing|tojson }}").message(),
            "Object of type Undefined is not JSON serializable");
  EXPECT_EQ(render_error("{{ range(200000)|length }}").message(),
            "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  EXPECT_EQ(render_error("{% set ns = namespace() %}{% set ns._x = 1 %}").line(), 1);
}

// Every snippet of the fixture file, rendered by jinja2 with transformers' environment.
TEST(Jinja, MatchesJinja2OnFixtureSnippets) {
  std::ifstream in(std::filesystem::path(HYSERVE_SOURCE_DIR) /
                   "tests/fixtures/chat_templates/expected.json");
  ASSERT_TRUE(in.good());
  std::ostringstream ss;
  ss << in.rdbuf();
  const auto fixtures = nlohmann::ordered_json::parse(ss.str());
  int num_checked = 0;
  for (const auto& s : fixtures["snippets"]) {
    const std::string name = s["name"].get<std::string>();
    const std::string source = s["template"].get<std::string>();
    const Value context = Value::from_json(s["context"]);
    if (s.contains("error")) {
      try {
        Template(source).render(context.as_dict());
        ADD_FAILURE() << name << ": expected error " << s["error"];
      } catch (const TemplateError& e) {
        if (s["error_line"].is_number()) {
          EXPECT_EQ(e.line(), s["error_line"].get<int>()) << name;
        }
        if (name == "raise_exception") {
          EXPECT_EQ(e.message(), s["error"].get<std::string>());
        }
      }
    } else {
      std::string got;
      EXPECT_NO_THROW(got = Template(source).render(context.as_dict())) << name;
      EXPECT_EQ(got, s["expected"].get<std::string>()) << name;
    }
    ++num_checked;
  }
  EXPECT_GE(num_checked, 50);
}

}  // namespace
}  // namespace hyserve::jinja
