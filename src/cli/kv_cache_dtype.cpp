// `--kv-cache-dtype` of serve and generate: the latent formats the model writes
// (ModelOptions::latent_cache). auto stays the exact fp32 reference (docs/DECISIONS.md).
#include <string>

#include "cli/commands.h"
#include "util/error.h"

namespace hyserve::cli {

LatentCacheDtype model_latent_cache_dtype(std::string_view flag) {
  if (flag == "auto" || flag == "fp32") return LatentCacheDtype::kFp32;
  if (flag == "fp8") return LatentCacheDtype::kFp8;
  HYSERVE_THROW(InvalidArgument, "--kv-cache-dtype ", std::string(flag),
                ": the model caches MLA latents as auto (= fp32), fp32 or fp8 (576 e4m3 per "
                "token, DSA models); other formats are not built yet");
}

}  // namespace hyserve::cli
