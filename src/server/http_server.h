// HttpServer: the OpenAI-compatible HTTP front end on cpp-httplib. HTTP threads parse,
// render the chat template, tokenize, submit to the Engine and stream its deltas back
// (SSE or one JSON body). Routes: /v1/chat/completions, /v1/completions, /v1/models,
// /health, /metrics.
#pragma once

#include <memory>

#include "core/status.h"
#include "server/served_model.h"

namespace ds::server {

class HttpServer {
 public:
  HttpServer(ServedModel& model, const ServeOptions& options);
  ~HttpServer();
  Status bind();     // host:port from the options; port 0 picks a free one
  int port() const;  // after bind()
  void run();        // serves until stop()
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ds::server
