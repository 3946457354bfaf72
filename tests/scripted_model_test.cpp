// The scripted checkpoint of the server's tool-call tests (tests/fixtures/scripted-kimi-k3,
// built by tools/make_scripted_model.py, a kimi_k3 in the published layout): every attention
// and MLP output is exactly zero, so
// the logits depend on the last token only, and greedy decoding from the chat prompt's last
// token (<think>) emits scripted_reply.json's ids. Checked here on the model alone, so a
// server test failure is not the fixture's fault.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace hyserve {
namespace {

const std::filesystem::path kScripted =
    std::filesystem::path(HYSERVE_SOURCE_DIR) / "tests/fixtures/scripted-kimi-k3";

nlohmann::json read_reply() {
  std::ifstream in(kScripted / "scripted_reply.json");
  return nlohmann::json::parse(in);
}

int32_t argmax(const std::vector<float>& logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

TEST(ScriptedModel, GreedyDecodingFollowsTheScript) {
  const nlohmann::json reply = read_reply();
  const auto expected = reply["reply_token_ids"].get<std::vector<int32_t>>();
  const auto model = Model::load(kScripted);
  const auto tokenizer = Tokenizer::load(kScripted);
  // Any prefix: only the last token counts.
  std::vector<int32_t> prompt = tokenizer->encode(
      "<|im_user|>user<|im_middle|>What is the weather in Paris?<|im_end|>"
      "<|im_assistant|>assistant<|im_middle|><think>",
      /*allow_special=*/true);
  ASSERT_EQ(prompt.back(), reply["trigger_token_id"].get<int32_t>());

  SequenceState state = model->new_sequence();
  std::vector<float> logits;
  model->forward(prompt, state, logits);
  // hidden 64, rms eps 1e-5: the output AttnRes mixes the snapshots [embed, 0, ...] with the
  // (zero) last prefix into a * e_k for some weight a in (0, 1], the final RMSNorm turns that
  // into e_k * a / sqrt(a^2/64 + 1e-5), and lm_head holds 8 * e_k on the successor's row only:
  // the successor's logit is at most 8 / sqrt(1/64 + 1e-5) (a = 1) and every other logit 0.
  const float successor_logit = static_cast<float>(8.0 / std::sqrt(1.0 / 64 + 1e-5));
  std::vector<int32_t> generated;
  for (size_t step = 0; step < expected.size(); ++step) {
    const int32_t next = argmax(logits);
    generated.push_back(next);
    for (size_t i = 0; i < logits.size(); ++i) {
      if (static_cast<int32_t>(i) == next) {
        EXPECT_LE(logits[i], successor_logit + 1e-3f) << "step " << step;
        EXPECT_GT(logits[i], 0.5f * successor_logit) << "step " << step;
      } else {
        ASSERT_EQ(logits[i], 0.0f) << "step " << step << ", token " << i;
      }
    }
    if (step + 1 < expected.size()) model->forward(std::vector<int32_t>{next}, state, logits);
  }
  EXPECT_EQ(generated, expected);
  EXPECT_EQ(tokenizer->decode(generated, /*skip_special=*/false),
            reply["reply_text"].get<std::string>());
}

}  // namespace
}  // namespace hyserve
