// `hyserve bench sweep`'s pure parts: the frontier of its points, the concurrency list, and
// its plots: the SVG (well-formed XML, one circle per point) and the PNG (signature, IHDR,
// CRCs, an IDAT that inflates to the image's bytes, a plotted point in its series' color).
#include <gtest/gtest.h>

#include <zlib.h>

#include <cstring>
#include <string>
#include <vector>

#include "client/bench_sweep.h"
#include "client/line_chart.h"
#include "client/png_encoder.h"
#include "util/error.h"

namespace hyserve::client {
namespace {

std::vector<SweepPoint> three_points() {
  return {{1, 100.0, 10.0, 9.0, 12.0, 50.0, 80.0, 8, 0},
          {2, 180.0, 12.5, 12.0, 15.0, 60.0, 95.0, 8, 0},
          {4, 300.0, 20.0, 19.0, 30.0, 90.0, 150.0, 8, 0}};
}

TEST(BenchSweep, FrontierIsPerUserAndPerGpuThroughput) {
  const std::vector<FrontierPoint> f = frontier(three_points(), 2);
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0].concurrency, 1);
  EXPECT_DOUBLE_EQ(f[0].tokens_per_s_per_user, 100.0);  // 1000 / 10 ms
  EXPECT_DOUBLE_EQ(f[0].tokens_per_s_per_gpu, 50.0);    // 100 tok/s over 2 GPUs
  EXPECT_DOUBLE_EQ(f[1].tokens_per_s_per_user, 80.0);
  EXPECT_DOUBLE_EQ(f[2].tokens_per_s_per_user, 50.0);
  EXPECT_DOUBLE_EQ(f[2].tokens_per_s_per_gpu, 150.0);
  std::vector<SweepPoint> one_token = {{1, 10.0, 0.0, 0.0, 0.0, 5.0, 5.0, 1, 0}};
  EXPECT_EQ(frontier(one_token, 1)[0].tokens_per_s_per_user, 0.0);  // no TPOT
  EXPECT_THROW(frontier(three_points(), 0), InvalidArgument);

  nlohmann::ordered_json result = {{"output_throughput", 120.0},
                                   {"mean_tpot_ms", 8.0},
                                   {"median_tpot_ms", 7.5},
                                   {"p99_tpot_ms", 11.0},
                                   {"median_ttft_ms", 40.0},
                                   {"p99_ttft_ms", 70.0},
                                   {"completed", 5},
                                   {"failed", 1}};
  const SweepPoint p = sweep_point(16, result);
  EXPECT_EQ(p.concurrency, 16);
  EXPECT_EQ(p.output_throughput, 120.0);
  EXPECT_EQ(p.p99_ttft_ms, 70.0);
  EXPECT_EQ(p.failed, 1);
  result.erase("p99_tpot_ms");
  EXPECT_THROW(sweep_point(16, result), InvalidArgument);
}

TEST(BenchSweep, ConcurrencyList) {
  EXPECT_EQ(parse_concurrencies("1,2,4,64"), (std::vector<int64_t>{1, 2, 4, 64}));
  EXPECT_THROW(parse_concurrencies(""), InvalidArgument);
  EXPECT_THROW(parse_concurrencies("0,1"), InvalidArgument);
  EXPECT_THROW(parse_concurrencies("4,2"), InvalidArgument);
  EXPECT_THROW(parse_concurrencies("1,x"), InvalidArgument);
}

// A minimal XML check: tags nest and close, attribute quotes pair; counts `<name` starts.
void expect_well_formed(const std::string& xml) {
  std::vector<std::string> open;
  size_t i = xml.find("?>");
  ASSERT_NE(i, std::string::npos);
  while ((i = xml.find('<', i)) != std::string::npos) {
    const size_t end = xml.find('>', i);
    ASSERT_NE(end, std::string::npos);
    const std::string tag = xml.substr(i + 1, end - i - 1);
    ASSERT_EQ(std::count(tag.begin(), tag.end(), '"') % 2, 0) << tag;
    const std::string name =
        tag.substr(tag[0] == '/', tag.find_first_of(" />", 1) - (tag[0] == '/'));
    if (tag[0] == '/') {
      ASSERT_FALSE(open.empty()) << tag;
      EXPECT_EQ(open.back(), name);
      open.pop_back();
    } else if (tag.back() != '/') {
      open.push_back(name);
    }
    i = end;
  }
  EXPECT_TRUE(open.empty());
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t i = text.find(what); i != std::string::npos; i = text.find(what, i + 1)) ++n;
  return n;
}

TEST(BenchSweep, SvgHasOnePointPerConcurrency) {
  const std::string frontier_svg =
      render_svg(frontier_chart(frontier(three_points(), 1), "A <test> & title"));
  expect_well_formed(frontier_svg);
  EXPECT_EQ(count_of(frontier_svg, "<circle"), 3u);
  EXPECT_NE(frontier_svg.find("c=4"), std::string::npos);
  EXPECT_NE(frontier_svg.find("A &lt;test&gt; &amp; title"), std::string::npos);
  const std::string ttft_svg = render_svg(latency_chart(three_points(), "ttft", "t"));
  expect_well_formed(ttft_svg);
  EXPECT_EQ(count_of(ttft_svg, "<circle"), 6u);    // median and p99
  EXPECT_EQ(count_of(ttft_svg, "<polyline"), 3u);  // the axes and two series
}

uint32_t be32(const std::vector<uint8_t>& b, size_t at) {
  return (uint32_t{b[at]} << 24) | (uint32_t{b[at + 1]} << 16) | (uint32_t{b[at + 2]} << 8) |
         b[at + 3];
}

TEST(BenchSweep, PngDecodesToTheCanvas) {
  const LineChart chart = frontier_chart(frontier(three_points(), 1), "frontier");
  const std::vector<uint8_t> png = render_png(chart);
  const uint8_t signature[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  ASSERT_GT(png.size(), 8u);
  ASSERT_EQ(std::memcmp(png.data(), signature, 8), 0);
  std::vector<uint8_t> idat;
  std::vector<std::string> types;
  uint32_t width = 0, height = 0;
  for (size_t at = 8; at < png.size();) {
    const uint32_t len = be32(png, at);
    ASSERT_LE(at + 12 + len, png.size());
    const std::string type(png.begin() + at + 4, png.begin() + at + 8);
    types.push_back(type);
    const uLong crc = crc32(0L, png.data() + at + 4, len + 4);
    EXPECT_EQ(be32(png, at + 8 + len), crc) << type;
    if (type == "IHDR") {
      width = be32(png, at + 8);
      height = be32(png, at + 12);
      EXPECT_EQ(png[at + 16], 8);  // bit depth
      EXPECT_EQ(png[at + 17], 2);  // truecolor
    }
    if (type == "IDAT") idat.insert(idat.end(), png.begin() + at + 8, png.begin() + at + 8 + len);
    at += 12 + len;
  }
  EXPECT_EQ(types, (std::vector<std::string>{"IHDR", "IDAT", "IEND"}));
  ASSERT_EQ(width, static_cast<uint32_t>(chart.width));
  ASSERT_EQ(height, static_cast<uint32_t>(chart.height));
  std::vector<uint8_t> raw(height * (1 + 3 * width) + 1);
  uLongf raw_size = raw.size();
  ASSERT_EQ(uncompress(raw.data(), &raw_size, idat.data(), idat.size()), Z_OK);
  ASSERT_EQ(raw_size, height * (1 + 3 * width));  // one filter byte per row + RGB
  // The second point's disc, at its frame position, in the series' color.
  const ChartFrame f = chart_frame(chart);
  const auto x = static_cast<uint32_t>(std::lround(f.pixel_x(chart.series[0].x[1])));
  const auto y = static_cast<uint32_t>(std::lround(f.pixel_y(chart.series[0].y[1])));
  const size_t row = y * (1 + 3 * width);
  EXPECT_EQ(raw[row], 0);  // filter: none
  const Rgb color = chart.series[0].color;
  EXPECT_EQ(raw[row + 1 + 3 * x], color.r);
  EXPECT_EQ(raw[row + 2 + 3 * x], color.g);
  EXPECT_EQ(raw[row + 3 + 3 * x], color.b);
  EXPECT_EQ(raw[1], 255);  // the top-left corner: background
  EXPECT_THROW(encode_png(2, 2, std::vector<uint8_t>(5)), InvalidArgument);
}

TEST(BenchSweep, CanvasTextAndLines) {
  Canvas c(40, 20, {255, 255, 255});
  c.draw_line(0, 10, 39, 10, {0, 0, 255}, 1);
  EXPECT_EQ(c.pixel(20, 10), (Rgb{0, 0, 255}));
  EXPECT_EQ(c.pixel(20, 9), (Rgb{255, 255, 255}));
  c.draw_text(0, 0, "1", {255, 0, 0});  // '1': row 0 is 0x04, its middle column
  EXPECT_EQ(c.pixel(2, 0), (Rgb{255, 0, 0}));
  EXPECT_EQ(c.pixel(0, 0), (Rgb{255, 255, 255}));
  EXPECT_EQ(Canvas::text_width("ab", 2), 22);
}

}  // namespace
}  // namespace hyserve::client
