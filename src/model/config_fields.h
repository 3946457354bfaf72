// The config readers' shared parts (model/config.cpp and the per-section readers of
// model/config_parse.cpp, model/config_quantization.cpp): a field reader that knows each
// field's spellings and records what was read, and the section parsers from_json calls.
// Internal to src/model/config*.cpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "util/error.h"

#define CONFIG_CHECK(cond, ...) CHECK_AS(::hyserve::ConfigError, cond, __VA_ARGS__)

namespace hyserve::config_detail {

using nlohmann::json;

// Reads config fields under any of their spellings; every error names the field. Every
// name asked for is recorded in `used` (when given), so that the fields nobody asked for
// can be reported.
class Fields {
 public:
  explicit Fields(const json& j, std::set<std::string>* used = nullptr) : j_(j), used_(used) {}

  const json* find(std::initializer_list<const char*> names) const {
    if (used_)
      for (const char* n : names) used_->insert(n);
    for (const char* n : names) {
      auto it = j_.find(n);
      if (it != j_.end() && !it->is_null()) return &*it;
    }
    return nullptr;
  }

  std::optional<int64_t> opt_int(std::initializer_list<const char*> names) const {
    const json* v = find(names);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) {
      if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>())
        return static_cast<int64_t>(v->get<double>());
      HYSERVE_THROW(ConfigError, "config field '", *names.begin(), "' must be an integer, got ",
                    v->dump());
    }
    return v->get<int64_t>();
  }

  int64_t req_int(std::initializer_list<const char*> names, const char* why) const {
    auto v = opt_int(names);
    if (!v)
      HYSERVE_THROW(ConfigError, "config is missing required field '", *names.begin(), "' (", why,
                    ")");
    return *v;
  }

  int64_t positive(std::initializer_list<const char*> names, const char* why) const {
    const int64_t v = req_int(names, why);
    if (v <= 0)
      HYSERVE_THROW(ConfigError, "config field '", *names.begin(), "' must be positive, got ", v);
    return v;
  }

  std::optional<double> opt_double(std::initializer_list<const char*> names) const {
    const json* v = find(names);
    if (!v) return std::nullopt;
    if (!v->is_number())
      HYSERVE_THROW(ConfigError, "config field '", *names.begin(), "' must be a number, got ",
                    v->dump());
    return v->get<double>();
  }

  std::optional<bool> opt_bool(std::initializer_list<const char*> names) const {
    const json* v = find(names);
    if (!v) return std::nullopt;
    if (!v->is_boolean())
      HYSERVE_THROW(ConfigError, "config field '", *names.begin(), "' must be true or false, got ",
                    v->dump());
    return v->get<bool>();
  }

  std::optional<std::string> opt_string(std::initializer_list<const char*> names) const {
    const json* v = find(names);
    if (!v) return std::nullopt;
    if (!v->is_string())
      HYSERVE_THROW(ConfigError, "config field '", *names.begin(), "' must be a string, got ",
                    v->dump());
    return v->get<std::string>();
  }

 private:
  const json& j_;
  std::set<std::string>* used_;
};

// deepseek_v32 and deepseek_v3 (with Kimi K2): every layer MLA, rotated by RoPE.
inline bool is_deepseek_family(ModelType t) {
  return t == ModelType::kDeepseekV32 || t == ModelType::kDeepseekV3;
}

// The fields of a text model (the whole config, or the published wrapper's text_config),
// section by section (config_parse.cpp).
void parse_text_config(const json& j, const Fields& f, ModelConfig& c);
// quantization_config, when present: the experts' format (config_quantization.cpp).
void parse_quantization(const Fields& f, ModelConfig& c);

}  // namespace hyserve::config_detail
