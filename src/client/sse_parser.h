// Server-sent events, incrementally: the body of a `text/event-stream` response arrives in
// pieces cut anywhere (inside a line, between `\r` and `\n`), and SseParser turns the bytes
// into whole events. Only the `data` field matters to an OpenAI stream: an event's data is
// its `data:` lines joined by `\n` (one optional space after the colon dropped); comment
// lines (`:`) and the other fields (`event`, `id`, `retry`) are read and ignored; a blank
// line ends the event, and an event without data is not delivered (the SSE rules).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace hyserve::client {

class SseParser {
 public:
  // Appends bytes of the stream; returns the data of every event they complete, in order.
  std::vector<std::string> feed(std::string_view bytes);

  // True when bytes of an unfinished event are held (a stream that ends here was cut).
  bool has_partial_event() const { return !line_.empty() || has_data_; }

 private:
  void end_line(std::vector<std::string>& events);

  std::string line_;  // the current line so far
  std::string data_;  // the current event's data lines
  bool has_data_ = false;
  bool after_cr_ = false;  // the last byte was `\r`: a `\n` next belongs to it
};

}  // namespace hyserve::client
