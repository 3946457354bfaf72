#include "client/line_chart.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "client/png_encoder.h"
#include "util/error.h"

namespace hyserve::client {
namespace {

constexpr int kMarginLeft = 90, kMarginRight = 40, kMarginTop = 80, kMarginBottom = 70;
constexpr int kTickLength = 6;
constexpr Rgb kWhite{255, 255, 255}, kBlack{0, 0, 0}, kGrid{225, 225, 225};

// Ticks at 1, 2 or 5 times a power of ten, about 5 over [low, high].
std::vector<double> nice_ticks(double low, double high) {
  const double raw = (high - low) / 5.0;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power * 10;
  for (const double m : {1.0, 2.0, 5.0})
    if (raw <= m * power) {
      step = m * power;
      break;
    }
  std::vector<double> ticks;
  for (double t = std::ceil(low / step) * step; t <= high + step * 1e-9; t += step)
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  return ticks;
}

std::string xml_escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

std::string hex(Rgb c) {
  return fmt::format("#{:02x}{:02x}{:02x}", c.r, c.g, c.b);
}

double data_x(const ChartFrame& f, double x) {
  return f.log2_x ? std::log2(x) : x;
}

}  // namespace

double ChartFrame::pixel_x(double x) const {
  return left + (x - x_min) / (x_max - x_min) * (right - left);
}

double ChartFrame::pixel_y(double y) const {
  return bottom - (y - y_min) / (y_max - y_min) * (bottom - top);
}

std::string tick_label(double value) {
  if (value != 0 && std::abs(value) < 0.01) return fmt::format("{:.1e}", value);
  std::string s = fmt::format("{:.3g}", value);
  if (s.find('e') != std::string::npos) s = fmt::format("{:.0f}", value);
  return s;
}

ChartFrame chart_frame(const LineChart& chart) {
  ChartFrame f;
  f.log2_x = chart.log2_x;
  f.left = kMarginLeft;
  f.right = chart.width - kMarginRight;
  f.top = kMarginTop;
  f.bottom = chart.height - kMarginBottom;
  double x_lo = INFINITY, x_hi = -INFINITY, y_hi = 0;
  for (const ChartSeries& s : chart.series) {
    CHECK(s.x.size() == s.y.size(), "chart series ", s.name, ": x and y differ in length");
    for (size_t i = 0; i < s.x.size(); ++i) {
      CHECK(!chart.log2_x || s.x[i] > 0, "chart ", chart.title, ": log2 x needs x > 0");
      x_lo = std::min(x_lo, data_x(f, s.x[i]));
      x_hi = std::max(x_hi, data_x(f, s.x[i]));
      y_hi = std::max(y_hi, s.y[i]);
    }
  }
  if (!std::isfinite(x_lo)) x_lo = 0, x_hi = 1;
  if (chart.log2_x) {
    f.x_min = std::floor(x_lo) - 0.25;
    f.x_max = std::ceil(x_hi) + 0.25;
    for (double t = std::ceil(f.x_min); t <= f.x_max; ++t) f.x_ticks.push_back(std::exp2(t));
  } else {
    const double pad = x_hi > x_lo ? 0.08 * (x_hi - x_lo) : std::max(1.0, 0.1 * std::abs(x_hi));
    f.x_min = std::max(0.0, x_lo - pad);
    f.x_max = x_hi + pad;
    f.x_ticks = nice_ticks(f.x_min, f.x_max);
  }
  f.y_min = 0;  // throughputs and latencies: from zero
  f.y_max = y_hi > 0 ? y_hi * 1.1 : 1.0;
  f.y_ticks = nice_ticks(f.y_min, f.y_max);
  return f;
}

std::string render_svg(const LineChart& chart) {
  const ChartFrame f = chart_frame(chart);
  std::string out = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"13\">\n"
      "<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"30\" text-anchor=\"middle\" font-size=\"18\">{3}</text>\n",
      chart.width, chart.height, chart.width / 2, xml_escape(chart.title));
  for (const double t : f.x_ticks) {
    const double x = f.pixel_x(data_x(f, t));
    out += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#e1e1e1\"/>\n"
        "<line x1=\"{0:.1f}\" y1=\"{2}\" x2=\"{0:.1f}\" y2=\"{3}\" stroke=\"black\"/>\n"
        "<text x=\"{0:.1f}\" y=\"{4}\" text-anchor=\"middle\">{5}</text>\n",
        x, f.top, f.bottom, f.bottom + kTickLength, f.bottom + 22, tick_label(t));
  }
  for (const double t : f.y_ticks) {
    const double y = f.pixel_y(t);
    out += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#e1e1e1\"/>\n"
        "<line x1=\"{3}\" y1=\"{1:.1f}\" x2=\"{0}\" y2=\"{1:.1f}\" stroke=\"black\"/>\n"
        "<text x=\"{4}\" y=\"{5:.1f}\" text-anchor=\"end\">{6}</text>\n",
        f.left, y, f.right, f.left - kTickLength, f.left - 10, y + 4, tick_label(t));
  }
  out += fmt::format(
      "<polyline points=\"{0},{1} {0},{2} {3},{2}\" fill=\"none\" stroke=\"black\"/>\n"
      "<text x=\"{4}\" y=\"{5}\" text-anchor=\"middle\">{6}</text>\n"
      "<text x=\"{0}\" y=\"{7}\">{8}</text>\n",
      f.left, f.top, f.bottom, f.right, (f.left + f.right) / 2, chart.height - 20,
      xml_escape(chart.x_label), f.top - 14, xml_escape(chart.y_label));
  int legend_x = f.left + 300;
  for (const ChartSeries& s : chart.series) {
    std::string points;
    for (size_t i = 0; i < s.x.size(); ++i)
      points += fmt::format("{:.1f},{:.1f} ", f.pixel_x(data_x(f, s.x[i])), f.pixel_y(s.y[i]));
    out += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n",
                       points, hex(s.color));
    for (size_t i = 0; i < s.x.size(); ++i) {
      const double px = f.pixel_x(data_x(f, s.x[i])), py = f.pixel_y(s.y[i]);
      out += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{}\" fill=\"{}\"/>\n", px, py,
                         kPointRadius, hex(s.color));
      if (i < s.labels.size())
        out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\">{}</text>\n", px + 7,
                           py - 7, xml_escape(s.labels[i]));
    }
    out += fmt::format(
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"2\"/>\n"
        "<text x=\"{4}\" y=\"{5}\">{6}</text>\n",
        legend_x, f.top - 18, legend_x + 24, hex(s.color), legend_x + 30, f.top - 14,
        xml_escape(s.name));
    legend_x += 60 + 8 * static_cast<int>(s.name.size());
  }
  return out + "</svg>\n";
}

Canvas render_canvas(const LineChart& chart) {
  const ChartFrame f = chart_frame(chart);
  Canvas c(chart.width, chart.height, kWhite);
  c.draw_text((chart.width - Canvas::text_width(chart.title, 2)) / 2, 16, chart.title, kBlack, 2);
  for (const double t : f.x_ticks) {
    const double x = f.pixel_x(data_x(f, t));
    c.draw_line(x, f.top, x, f.bottom, kGrid);
    c.draw_line(x, f.bottom, x, f.bottom + kTickLength, kBlack);
    const std::string label = tick_label(t);
    c.draw_text(static_cast<int>(x) - Canvas::text_width(label) / 2, f.bottom + 12, label, kBlack);
  }
  for (const double t : f.y_ticks) {
    const double y = f.pixel_y(t);
    c.draw_line(f.left, y, f.right, y, kGrid);
    c.draw_line(f.left - kTickLength, y, f.left, y, kBlack);
    const std::string label = tick_label(t);
    c.draw_text(f.left - 10 - Canvas::text_width(label), static_cast<int>(y) - 3, label, kBlack);
  }
  c.draw_line(f.left, f.top, f.left, f.bottom, kBlack);
  c.draw_line(f.left, f.bottom, f.right, f.bottom, kBlack);
  c.draw_text((f.left + f.right - Canvas::text_width(chart.x_label)) / 2, chart.height - 28,
              chart.x_label, kBlack);
  c.draw_text(f.left, f.top - 20, chart.y_label, kBlack);
  int legend_x = f.left + 300;
  for (const ChartSeries& s : chart.series) {
    for (size_t i = 1; i < s.x.size(); ++i)
      c.draw_line(f.pixel_x(data_x(f, s.x[i - 1])), f.pixel_y(s.y[i - 1]),
                  f.pixel_x(data_x(f, s.x[i])), f.pixel_y(s.y[i]), s.color, 2);
    for (size_t i = 0; i < s.x.size(); ++i) {
      const double px = f.pixel_x(data_x(f, s.x[i])), py = f.pixel_y(s.y[i]);
      c.fill_disc(px, py, kPointRadius, s.color);
      if (i < s.labels.size())
        c.draw_text(static_cast<int>(px) + 7, static_cast<int>(py) - 14, s.labels[i], kBlack);
    }
    c.draw_line(legend_x, f.top - 22, legend_x + 24, f.top - 22, s.color, 2);
    c.draw_text(legend_x + 30, f.top - 25, s.name, kBlack);
    legend_x += 60 + 8 * static_cast<int>(s.name.size());
  }
  return c;
}

std::vector<uint8_t> render_png(const LineChart& chart) {
  const Canvas c = render_canvas(chart);
  return encode_png(c.width(), c.height(), c.rgb());
}

}  // namespace hyserve::client
