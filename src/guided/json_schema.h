// compile_json_schema: the JSON Schema subset guided decoding enforces, compiled into a
// Grammar (grammar.h). Anything outside the subset is refused, never ignored: a schema the
// output would not really follow is worse than an error.
//
// Supported: type (a name or a list of names: object, array, string, number, integer,
// boolean, null); properties, required, additionalProperties (false, true, or a schema; when
// absent: no extra properties if properties are listed, any if not); enum, const (values
// written in their compact JSON form); items (a schema, true or false), prefixItems, minItems,
// maxItems; minLength, maxLength; anyOf, oneOf (enforced as anyOf), allOf with one subschema;
// $ref to "#", "#/$defs/NAME" or "#/definitions/NAME" (recursion allowed); boolean schema true.
// Annotations are ignored: title, description, default, examples, $comment, $schema, $id,
// deprecated, readOnly, writeOnly. Without "type", the type follows from the keywords present
// (properties -> object, items -> array, minLength -> string), else any value.
// Refused, with SchemaError naming the keyword: pattern, format, minimum / maximum and the
// other numeric bounds, patternProperties, propertyNames, uniqueItems, not, if/then/else,
// and every keyword not listed above; more than 64 properties in one object; unsatisfiable
// schemas (false, empty enum, minItems above what items allow, a required property that is
// not listed); schemas nested deeper than 64 levels.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "guided/grammar.h"
#include "util/error.h"

namespace hyserve {

class SchemaError : public InvalidArgument {
 public:
  // path: the offending keyword's location, dot-separated from the schema root
  // ("properties.name.pattern"; empty for the root itself).
  SchemaError(std::string path, const std::string& message)
      : InvalidArgument(message), path_(std::move(path)) {}
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

Grammar compile_json_schema(const nlohmann::ordered_json& schema);

}  // namespace hyserve
