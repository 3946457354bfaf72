// A compiled Jinja template and its renderer: the subset of jinja2 that Hugging Face chat
// templates use, rendered byte for byte as transformers renders them (jinja2's
// ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, loop controls,
// raise_exception / strftime_now / namespace / dict globals, tojson without HTML escaping).
#pragma once

#include <memory>
#include <string>

#include "tokenizer/jinja_lexer.h"
#include "tokenizer/jinja_parser.h"
#include "tokenizer/jinja_value.h"

namespace hyserve::jinja {

class Template {
 public:
  // Compiles `source`; throws TemplateError (with line and column) on bad syntax,
  // unknown tags, filters or tests.
  explicit Template(const std::string& source);

  // Renders with the variables of `context` (plus the default globals, which context
  // entries override). Throws TemplateError on runtime errors: undefined values used,
  // type errors, raise_exception(msg) (message() is then exactly msg).
  std::string render(const Dict& context) const;

 private:
  std::shared_ptr<const Body> body_;
};

}  // namespace hyserve::jinja
