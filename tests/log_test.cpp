// util/log.h: the level names, and that the level filters what the logger writes.
#include "util/log.h"

#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "util/error.h"

namespace hyserve {
namespace {

// Captures the log lines for one test, then restores stderr and the default level.
class LogCapture {
 public:
  LogCapture() { log::set_output_for_test(&out_); }
  ~LogCapture() {
    log::set_output_for_test(nullptr);
    log::set_level("info");
  }
  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

TEST(Log, SetLevelAcceptsTheFourNames) {
  LogCapture capture;
  const std::vector<std::string> expected = {"debug", "info", "warning", "error"};
  EXPECT_EQ(log::level_names(), expected);
  for (const std::string& name : log::level_names()) EXPECT_NO_THROW(log::set_level(name));
}

TEST(Log, SetLevelRefusesOtherNamesNamingTheValue) {
  LogCapture capture;
  for (const char* bad : {"warn", "INFO", "trace", "critical", ""}) {
    try {
      log::set_level(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos)
          << e.what();
    }
  }
  // A refused name leaves the level as it was.
  log::set_level("error");
  EXPECT_THROW(log::set_level("verbose"), InvalidArgument);
  EXPECT_FALSE(log::is_enabled(log::Level::kWarning));
}

TEST(Log, DefaultLevelIsInfo) {
  LogCapture capture;
  EXPECT_FALSE(log::is_enabled(log::Level::kDebug));
  EXPECT_TRUE(log::is_enabled(log::Level::kInfo));
}

TEST(Log, MessagesBelowTheLevelAreNotWritten) {
  LogCapture capture;
  log::set_level("warning");
  log::debug("debug {}", 1);
  log::info("info {}", 2);
  log::warn("warn {}", 3);
  log::error("error {}", 4);
  EXPECT_EQ(capture.text().find("debug 1"), std::string::npos) << capture.text();
  EXPECT_EQ(capture.text().find("info 2"), std::string::npos) << capture.text();
  EXPECT_NE(capture.text().find("warn 3"), std::string::npos) << capture.text();
  EXPECT_NE(capture.text().find("error 4"), std::string::npos) << capture.text();

  log::set_level("debug");
  log::debug("debug {}", 5);
  EXPECT_NE(capture.text().find("debug 5"), std::string::npos) << capture.text();
}

TEST(Log, LineHasLevelAndTimestamp) {
  LogCapture capture;
  log::warn("disk {} is {}% full", "/data", 93);
  const std::regex line(R"(WARNING \d\d-\d\d \d\d:\d\d:\d\d disk /data is 93% full\n)");
  EXPECT_TRUE(std::regex_match(capture.text(), line)) << capture.text();
}

}  // namespace
}  // namespace hyserve
