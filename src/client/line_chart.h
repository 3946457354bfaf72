// Line charts of `hyserve bench sweep` as SVG text and as PNG (raster_canvas + png_encoder):
// a frame with axes, ticks and tick labels, each series a polyline through its points with
// a disc on each point and an optional label beside it, a legend, a title and axis labels.
// Both renderings share one ChartFrame, so a point lands on the same pixel in each.
//
//   +---------------------------------------------+
//   | title                                       |
//   | y label       legend: -o- series ...        |
//   |  tick -+   o----o                           |
//   |        |  /      \                          |
//   |        +---------------- (plot box)         |
//   |          ticks          x label             |
//   +---------------------------------------------+
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "client/raster_canvas.h"

namespace hyserve::client {

struct ChartSeries {
  std::string name;
  Rgb color;
  std::vector<double> x, y;         // one point per index
  std::vector<std::string> labels;  // empty, or one per point (drawn beside it)
};

struct LineChart {
  std::string title, x_label, y_label;
  bool log2_x = false;  // x on a log2 axis (concurrency 1, 2, 4, ...); x must be > 0
  std::vector<ChartSeries> series;
  int width = 900, height = 600;
};

constexpr double kPointRadius = 4.0;

// Data ranges, the plot box in pixels and the ticks of a chart.
struct ChartFrame {
  double x_min = 0, x_max = 1, y_min = 0, y_max = 1;  // data (log2 of x when log2_x)
  int left = 0, right = 0, top = 0, bottom = 0;       // plot box, pixels
  bool log2_x = false;
  std::vector<double> x_ticks, y_ticks;  // data values

  double pixel_x(double x) const;  // a data x to its pixel column
  double pixel_y(double y) const;  // a data y to its pixel row (up is smaller)
};

ChartFrame chart_frame(const LineChart& chart);

std::string render_svg(const LineChart& chart);
Canvas render_canvas(const LineChart& chart);
std::vector<uint8_t> render_png(const LineChart& chart);

// A tick label: up to 3 significant digits, "k"-free (1200, 0.25, 35.5).
std::string tick_label(double value);

}  // namespace hyserve::client
