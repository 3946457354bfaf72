// Every text the server writes as JSON is valid UTF-8 (issue 49): dump_json, the one way a
// response body or SSE event is serialized, replaces invalid bytes as replace_invalid_utf8
// does (U+FFFD per maximal invalid subpart, vLLM's detokenizer's rule) instead of throwing;
// and echoing any single token of the bundled vocabulary, non-streaming, answers 200 with
// valid UTF-8 (it answered 500 "invalid UTF-8 byte" for the ids that are part of a
// character).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "http_test_client.h"
#include "server/openai_protocol.h"
#include "tiny_openai_server.h"
#include "tokenizer/utf8.h"

namespace hyserve {
namespace {

using nlohmann::ordered_json;
using namespace test;

const std::string kR = "\xEF\xBF\xBD";  // U+FFFD

// The JSON text of one string: `"<text>"`.
std::string quoted(const std::string& text) {
  return "\"" + text + "\"";
}

TEST(Utf8Responses, DumpJsonReplacesInvalidSequences) {
  struct Case {
    const char* what;
    std::string bytes;
    std::string want;  // the string as written, between the quotes
  };
  const std::vector<Case> cases = {
      {"lone continuation byte", "a\x80z", "a" + kR + "z"},
      {"two continuation bytes", "\x80\xBF", kR + kR},
      {"truncated 2-byte sequence", "\xC3", kR},
      {"truncated 2-byte sequence, then ASCII",
       "\xC3("
       "x",
       kR + "(x"},
      {"truncated 3-byte sequence", "\xE2\x82", kR},
      {"truncated 3-byte sequence, then a character", "\xE2\x82\xE2\x82\xAC", kR + "\xE2\x82\xAC"},
      {"truncated 4-byte sequence", "\xF0\x9F\x98", kR},
      {"truncated 4-byte sequence at the start",
       "\xF0\x9F"
       "ok",
       kR + "ok"},
      {"overlong 2-byte '/'", "\xC0\xAF", kR + kR},
      {"overlong 3-byte NUL", "\xE0\x80\x80", kR + kR + kR},
      {"overlong 4-byte", "\xF0\x80\x80\x80", kR + kR + kR + kR},
      {"surrogate U+D800", "\xED\xA0\x80", kR + kR + kR},
      {"above U+10FFFF", "\xF4\x90\x80\x80", kR + kR + kR + kR},
      {"bytes never in UTF-8", "\xFF\xFE", kR + kR},
      {"valid multi-byte text", "h\xC3\xA9llo \xE2\x82\xAC \xE4\xB8\xAD \xF0\x9F\x98\x80",
       "h\xC3\xA9llo \xE2\x82\xAC \xE4\xB8\xAD \xF0\x9F\x98\x80"},
      {"U+10FFFF", "\xF4\x8F\xBF\xBF", "\xF4\x8F\xBF\xBF"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    // The rule replace_invalid_utf8 follows where text is decoded, and dump_json's.
    EXPECT_EQ(replace_invalid_utf8(c.bytes), c.want);
    EXPECT_EQ(dump_json(ordered_json(c.bytes)), quoted(c.want));
    // Keys too: completion logprobs' top_logprobs are keyed by token text.
    const ordered_json object = {{c.bytes, ordered_json::array({c.bytes})}};
    const std::string text = dump_json(object);
    EXPECT_EQ(text, "{" + quoted(c.want) + ":[" + quoted(c.want) + "]}");
    EXPECT_TRUE(is_valid_utf8(text));
    // As an SSE event.
    EXPECT_EQ(sse_event(ordered_json(c.bytes)), "data: " + quoted(c.want) + "\n\n");
  }
}

// Every single-token prompt of the bundled vocabulary, echoed with logprobs, non-streaming:
// scored (max_tokens 0, what RL users send to score a rollout) and with one generated
// token. Each answer is 200, valid UTF-8, and the echoed text and logprob tokens are the
// token's bytes with U+FFFD where they are not whole characters.
TEST(Utf8Responses, EchoOfEveryTokenIsValidUtf8) {
  TinyOpenAIServer server;
  const Tokenizer& tok = server.tokenizer();
  const int64_t vocab = server.engine().model().config().vocab_size;
  ASSERT_EQ(vocab, 1024);
  int64_t num_partial = 0;  // ids whose bytes are not whole characters
  for (int32_t id = 0; id < vocab; ++id) {
    const int32_t ids[1] = {id};
    num_partial += !is_valid_utf8(tok.decode(ids, false));
  }
  EXPECT_GT(num_partial, 100) << "the test no longer covers partial characters";

  constexpr int32_t kBatch = 128;  // single-token prompts per request
  TestClient client(server.port());
  ASSERT_TRUE(client.connected());
  for (const int max_tokens : {0, 1}) {
    for (int32_t first = 0; first < vocab; first += kBatch) {
      SCOPED_TRACE(str_cat("max_tokens ", max_tokens, ", ids ", first, "..", first + kBatch - 1));
      ordered_json prompts = ordered_json::array();
      for (int32_t id = first; id < first + kBatch; ++id) prompts.push_back({id});
      const ordered_json request = {{"model", TinyOpenAIServer::kModelName},
                                    {"prompt", prompts},
                                    {"echo", true},
                                    {"logprobs", 1},
                                    {"max_tokens", max_tokens},
                                    {"temperature", 0}};
      client.send_raw(json_post("/v1/completions", request.dump()));
      const TestResponse response = client.read_response(60000);
      ASSERT_EQ(response.status, 200) << response.body;
      ASSERT_TRUE(is_valid_utf8(response.body));
      const auto body = ordered_json::parse(response.body, nullptr, false);
      ASSERT_FALSE(body.is_discarded()) << response.body;
      const ordered_json& choices = body.at("choices");
      ASSERT_EQ(choices.size(), static_cast<size_t>(kBatch));
      for (const ordered_json& choice : choices) {
        const int32_t id = first + choice.at("index").get<int32_t>();
        const int32_t ids[1] = {id};
        const std::string echo = replace_invalid_utf8(tok.decode(ids, /*skip_special=*/true));
        const std::string text = choice.at("text").get<std::string>();
        if (max_tokens == 0) {
          EXPECT_EQ(text, echo) << "id " << id;
        } else {
          EXPECT_EQ(text.substr(0, echo.size()), echo) << "id " << id;
        }
        const ordered_json& logprobs = choice.at("logprobs");
        const ordered_json& tokens = logprobs.at("tokens");
        ASSERT_EQ(tokens.size(), static_cast<size_t>(1 + max_tokens)) << "id " << id;
        EXPECT_EQ(tokens[0].get<std::string>(), replace_invalid_utf8(tok.decode(ids, false)))
            << "id " << id;
        if (max_tokens == 1) {
          EXPECT_EQ(logprobs.at("top_logprobs")[1].size(), 1u) << "id " << id;
        }
      }
    }
  }
}

}  // namespace
}  // namespace hyserve
