// A small RGB raster for the PNG plots: thick lines, filled discs, rectangles and text in a
// built-in 5x7 bitmap font (digits, A-Z, a few signs; lower case drawn as upper case, any
// other character as '?'), scaled by an integer factor. Drawing outside the image is
// clipped.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace hyserve::client {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb&) const = default;
};

class Canvas {
 public:
  Canvas(int width, int height, Rgb background);

  int width() const { return width_; }
  int height() const { return height_; }
  const std::vector<uint8_t>& rgb() const { return rgb_; }  // rows of width * 3 bytes
  Rgb pixel(int x, int y) const;

  void fill_rect(int x0, int y0, int x1, int y1, Rgb color);  // inclusive corners
  // A line `thickness` pixels wide (a square pen stepped along Bresenham's line).
  void draw_line(double x0, double y0, double x1, double y1, Rgb color, int thickness = 1);
  void fill_disc(double cx, double cy, double radius, Rgb color);
  // Text with its top-left corner at (x, y); each font pixel a scale x scale square.
  void draw_text(int x, int y, std::string_view text, Rgb color, int scale = 1);

  // The width in pixels of `text` drawn at `scale` (6 font columns per character).
  static int text_width(std::string_view text, int scale = 1);
  static int text_height(int scale = 1) { return 7 * scale; }

 private:
  void set(int x, int y, Rgb color);

  int width_, height_;
  std::vector<uint8_t> rgb_;
};

}  // namespace hyserve::client
