// The transport of the benchmark client, shared by its run loops (bench_runner.cpp,
// agentic_runner.cpp): one HTTP/1.1 exchange on a connection of its own (connect, write,
// read to the response's end, the connection's end or a deadline), and on top of it one
// streamed OpenAI request read into a RequestOutcome. Everything runs on the caller's
// io_context thread. Internal to src/client/ (it brings in Boost.Asio).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "client/bench_metrics.h"
#include "client/bench_runner.h"
#include "client/http_response_reader.h"

namespace hyserve::client {

using Endpoints = boost::asio::ip::tcp::resolver::results_type;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0);
Clock::duration to_duration(double seconds);

// The bytes of a request to base_url + path with `body` (empty: a GET), Connection: close.
std::string http_request(const BaseUrl& url, const std::string& path, const std::string& body,
                         const std::string& api_key);

struct HttpCallHandlers {
  std::function<void(int status, std::string_view body)> on_body;  // decoded body bytes
  // error: why the exchange failed, empty when the response arrived whole. Called once.
  std::function<void(const HttpResponseReader& response, std::string error)> on_end;
};

void start_http_call(boost::asio::io_context& io, const Endpoints& endpoints, std::string request,
                     double timeout_s, HttpCallHandlers handlers);

// Streams one benchmark request (request_bytes from http_request); `done` gets its outcome.
void start_stream(boost::asio::io_context& io, const Endpoints& endpoints,
                  std::string request_bytes, int64_t prompt_len, double timeout_s,
                  std::function<void(RequestOutcome)> done);

}  // namespace hyserve::client
