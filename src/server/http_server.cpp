// HttpServer: routes, auth, the per-request session that turns engine deltas into OpenAI
// chunks (text, reasoning, tool calls, logprobs, usage), SSE streaming with cancellation on
// disconnect, and Prometheus metrics.
#include "server/http_server.h"

#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <random>
#include <sstream>
#include <variant>

#include "core/log.h"
#include "server/openai_api.h"
#include "server/output_text.h"
#include "server/tool_calls.h"

namespace ds::server {

using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 g(std::random_device{}());
  static const char* hex = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += hex[g() % 16];
  return id;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(dump(e.body()), "application/json");
}

// One generation as the client sees it.
struct Session {
  ParsedRequest req;
  std::shared_ptr<RequestStream> stream;
  StopTextStream text;
  std::optional<ChatSplitter> split;
  std::string id;
  int64_t created = 0;
  int n_completion = 0;
  bool finished = false;
  std::string finish_reason;
  bool timed_out = false;             // the deadline passed: finish_reason "length", stop_reason "timeout"
  std::optional<ApiError> error;
  std::optional<ToolCallStream> tools;  // chat with tools
  std::string prefix;                   // forced output already in the prompt, not yet parsed

  Session(ParsedRequest r, std::shared_ptr<RequestStream> s, const tok::Tokenizer& tok)
      : req(std::move(r)), stream(std::move(s)), text(tok, req.stop_strings) {
    if (req.chat) split.emplace(req.starts_in_reasoning, req.tools_enabled);
    if (req.tools_enabled) tools.emplace(req.tools);
    prefix = req.output_prefix;
    id = random_id(req.chat ? "chatcmpl-" : "cmpl-");
    created = unix_now();
  }
};

struct Pumped {
  std::string reasoning, content;
  std::vector<ToolCallDelta> tool_deltas;
  std::vector<TokenEvent> events;  // for logprobs
};

// At the end of a chat with tools: "tool_calls" when the model made calls and stopped by
// itself (a call cut by max_tokens or the deadline keeps "length"); an error when tool_choice
// forced a call and the model's output is not one.
void tool_call_outcome(Session& s) {
  if (!s.tools->calls().empty()) {
    if (s.finish_reason == "stop") s.finish_reason = "tool_calls";
  } else if (s.req.tool_required && s.finish_reason == "stop") {
    s.error = ApiError{500, "tool_choice asked for a tool call, but the model's output is not a well-formed tool call",
                       "server_error", "tool_choice", "invalid_tool_call"};
  }
}

// Waits up to `timeout` for engine output and turns it into client text.
bool pump(Session& s, Pumped& out, std::chrono::milliseconds timeout) {
  if (s.finished) return false;
  Delta d;
  if (!s.stream->wait(d, timeout)) return false;
  std::string raw;
  for (TokenEvent& ev : d.tokens) {
    if (s.text.stopped()) break;
    ++s.n_completion;
    if (!ev.is_stop) raw += s.text.push(ev.token);
    if (s.req.logprobs) out.events.push_back(std::move(ev));
    if (s.text.stopped()) {  // a stop string: the engine may stop now
      s.stream->cancel();
      s.finished = true;
      s.finish_reason = "stop";
    }
  }
  if (!s.finished && d.finish != FinishReason::kNone) {
    s.finished = true;
    raw += s.text.finish();
    switch (d.finish) {
      case FinishReason::kStop: s.finish_reason = "stop"; break;
      case FinishReason::kLength: s.finish_reason = "length"; break;
      case FinishReason::kTimeout:  // the output so far, cut short like max_tokens does
        s.finish_reason = "length";
        s.timed_out = true;
        break;
      case FinishReason::kCancelled:
        s.error = ApiError{499, "the request was cancelled", "cancelled", "", ""};
        break;
      default:
        s.error = ApiError{500, "generation failed: " + d.error.message(), "server_error", "", ""};
        break;
    }
  }
  if (s.split) {
    auto take = [&](const ChatSplitter::Piece& p) {
      out.reasoning += p.reasoning;
      out.content += p.content;
      if (!p.tools.empty()) {
        for (auto& d : s.tools->push(p.tools)) out.tool_deltas.push_back(std::move(d));
      }
    };
    take(s.split->push(std::exchange(s.prefix, "") + raw));
    if (s.finished) {
      take(s.split->finish());
      if (s.tools) {
        for (auto& d : s.tools->finish()) out.tool_deltas.push_back(std::move(d));
      }
    }
    if (s.tools) {
      out.content += s.tools->take_leftover();  // not a well-formed call: plain text
      if (s.finished && !s.error) tool_call_outcome(s);
    }
  } else {
    out.content += raw;
  }
  return true;
}

std::string token_text(const tok::Tokenizer& tok, int32_t id) {
  const std::string* b = tok.token_bytes(id);
  return b ? *b : "";
}

json bytes_of(const std::string& s) {
  json a = json::array();
  for (unsigned char c : s) a.push_back(static_cast<int>(c));
  return a;
}

json chat_logprobs(const tok::Tokenizer& tok, const std::vector<TokenEvent>& evs) {
  json content = json::array();
  for (const auto& ev : evs) {
    json top = json::array();
    for (const auto& t : ev.top) {
      std::string s = token_text(tok, t.token);
      top.push_back({{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}});
    }
    std::string s = token_text(tok, ev.token);
    content.push_back({{"token", s}, {"logprob", ev.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", top}});
  }
  return json{{"content", content}};
}

json completion_logprobs(const tok::Tokenizer& tok, const std::vector<TokenEvent>& evs, size_t text_offset) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  for (const auto& ev : evs) {
    std::string s = token_text(tok, ev.token);
    tokens.push_back(s);
    lps.push_back(ev.logprob);
    json top = json::object();
    for (const auto& t : ev.top) top[token_text(tok, t.token)] = t.logprob;
    tops.push_back(top);
    offs.push_back(text_offset);
    text_offset += s.size();
  }
  return json{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

json tool_calls_json(const std::vector<ToolCall>& calls) {
  json a = json::array();
  for (const auto& c : calls)
    a.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  return a;
}

// Streamed: a call's first delta carries its id, type and name; later ones only arguments.
json tool_deltas_json(const std::vector<ToolCallDelta>& deltas) {
  json a = json::array();
  for (const auto& d : deltas) {
    json c = {{"index", d.index}, {"function", {{"arguments", d.arguments}}}};
    if (!d.id.empty()) {
      c["id"] = d.id;
      c["type"] = "function";
      c["function"]["name"] = d.name;
    }
    a.push_back(c);
  }
  return a;
}

json usage_json(const Session& s) {
  const int np = s.stream->n_prompt();
  return json{{"prompt_tokens", np}, {"completion_tokens", s.n_completion}, {"total_tokens", np + s.n_completion}};
}

void prom_histogram(std::ostringstream& o, const char* name, const char* help, const Histogram& h) {
  o << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
  uint64_t cum = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cum += h.counts[i];
    o << name << "_bucket{le=\"" << h.bounds[i] << "\"} " << cum << "\n";
  }
  cum += h.counts.back();
  o << name << "_bucket{le=\"+Inf\"} " << cum << "\n" << name << "_sum " << h.sum << "\n" << name << "_count " << h.count << "\n";
}

// Debian's compiled cpp-httplib listens with a backlog of 5, so a burst of simultaneous
// connects overflows the accept queue and clients see resets. Linux lets listen() be called
// again on a listening socket to raise the backlog; find ours by its port.
void raise_listen_backlog(int port, int backlog) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return;
  while (dirent* e = readdir(d)) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2) continue;
    int listening = 0;
    socklen_t len = sizeof(listening);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_storage addr{};
    socklen_t alen = sizeof(addr);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    int p = addr.ss_family == AF_INET    ? ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port)
            : addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                         : -1;
    if (p == port) ::listen(fd, backlog);
  }
  closedir(d);
}

// The socket of the connection a handler is serving (cpp-httplib does not hand it out):
// the one whose local and peer ports match the request's. -1 if not found. The fd stays
// open while the handler runs.
int find_connection_fd(int local_port, int remote_port) {
  if (local_port <= 0 || remote_port <= 0) return -1;
  auto port_of = [](const sockaddr_storage& a) {
    return a.ss_family == AF_INET    ? ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port)
           : a.ss_family == AF_INET6 ? ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port)
                                     : -1;
  };
  int found = -1;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (dirent* e = readdir(d)) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2) continue;
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof(local), pl = sizeof(peer);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0 || port_of(local) != local_port) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0 || port_of(peer) != remote_port) continue;
    found = fd;
    break;
  }
  closedir(d);
  return found;
}

// True once the client has closed or reset the connection (checked without consuming data).
bool peer_closed(int fd) {
  if (fd < 0) return false;
  char c;
  const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

}  // namespace

struct HttpServer::Impl {
  ServedModel& m;
  ServeOptions o;
  httplib::Server svr;
  int port = 0;
  std::atomic<uint64_t> http_requests{0}, http_errors{0};

  Impl(ServedModel& model, const ServeOptions& options) : m(model), o(options) {}

  bool authorized(const httplib::Request& req, httplib::Response& res) {
    if (o.api_key.empty()) return true;
    if (req.get_header_value("Authorization") == "Bearer " + o.api_key) return true;
    send_error(res, ApiError{401, "Invalid or missing API key (send 'Authorization: Bearer <key>')", "authentication_error", "", "invalid_api_key"});
    return false;
  }

  void generate(const httplib::Request& req, httplib::Response& res, bool chat) {
    ++http_requests;
    if (!authorized(req, res)) return;
    auto parsed = chat ? parse_chat_request(req.body, m) : parse_completion_request(req.body, m);
    if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
    ParsedRequest r = std::move(std::get<ParsedRequest>(parsed));
    const double timeout_s = std::min(o.request_timeout_s, r.timeout_s.value_or(o.request_timeout_s));  // the server's is the cap
    r.gen.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    auto st = m.engine->submit(r.gen);
    if (!st.ok()) {
      const Status& s = st.status();
      if (s.code() == ErrorCode::kResourceExhausted) return send_error(res, ApiError{429, s.message(), "rate_limit_error", "", "overloaded"});
      if (s.code() == ErrorCode::kUnsupported) return send_error(res, ApiError{503, s.message(), "server_error", "", "unavailable"});
      return send_error(res, ApiError{400, s.message(), "invalid_request_error", "", ""});
    }
    auto session = std::make_shared<Session>(std::move(r), st.value(), *m.tokenizer);
    if (session->req.stream)
      stream_response(session, res);
    else
      full_response(*session, res, find_connection_fd(req.local_port, req.remote_port));
  }

  // conn_fd: the client's socket, watched so that a client that gives up frees its slot.
  void full_response(Session& s, httplib::Response& res, int conn_fd) {
    std::string reasoning, content;
    std::vector<TokenEvent> events;
    auto next_check = std::chrono::steady_clock::now();
    while (!s.finished) {
      if (std::chrono::steady_clock::now() >= next_check) {
        next_check += 100ms;
        if (peer_closed(conn_fd)) {
          s.stream->cancel();
          res.status = 499;  // nobody is listening any more
          return;
        }
      }
      Pumped p;
      if (!pump(s, p, 100ms)) continue;
      reasoning += p.reasoning;
      content += p.content;
      for (auto& e : p.events) events.push_back(std::move(e));
    }
    if (s.error) return send_error(res, *s.error);
    json choice = {{"index", 0}, {"finish_reason", s.finish_reason}};
    if (s.timed_out) choice["stop_reason"] = "timeout";
    json out = {{"id", s.id}, {"created", s.created}, {"model", m.name}};
    if (s.req.chat) {
      json msg = {{"role", "assistant"}, {"content", content}};
      if (s.tools && !s.tools->calls().empty()) {
        msg["tool_calls"] = tool_calls_json(s.tools->calls());
        if (content.empty()) msg["content"] = nullptr;
      }
      msg["reasoning_content"] = reasoning.empty() ? json(nullptr) : json(reasoning);
      choice["message"] = msg;
      choice["logprobs"] = s.req.logprobs ? chat_logprobs(*m.tokenizer, events) : json(nullptr);
      out["object"] = "chat.completion";
    } else {
      choice["text"] = content;
      choice["logprobs"] = s.req.logprobs ? completion_logprobs(*m.tokenizer, events, 0) : json(nullptr);
      out["object"] = "text_completion";
    }
    out["choices"] = json::array({choice});
    out["usage"] = usage_json(s);
    res.set_content(dump(out), "application/json");
  }

  json chunk(const Session& s, json choice) const {
    json c = {{"id", s.id}, {"object", s.req.chat ? "chat.completion.chunk" : "text_completion"}, {"created", s.created},
              {"model", m.name}, {"choices", json::array({choice})}};
    if (s.req.include_usage) c["usage"] = nullptr;
    return c;
  }

  void stream_response(std::shared_ptr<Session> s, httplib::Response& res) {
    auto started = std::make_shared<bool>(false);
    auto text_offset = std::make_shared<size_t>(0);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, s, started, text_offset](size_t, httplib::DataSink& sink) {
          auto send = [&](const json& j) {
            std::string line = "data: " + dump(j) + "\n\n";
            return sink.write(line.data(), line.size());
          };
          if (!*started) {
            *started = true;
            if (s->req.chat && !send(chunk(*s, {{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}))) {
              s->stream->cancel();
              return false;
            }
          }
          Pumped p;
          if (!pump(*s, p, 100ms)) {
            if (!sink.is_writable()) {
              s->stream->cancel();
              return false;
            }
            return true;
          }
          if (s->error) {
            send(json{{"error", s->error->body()["error"]}});
            const char done[] = "data: [DONE]\n\n";
            sink.write(done, sizeof(done) - 1);
            sink.done();
            return true;
          }
          if (!p.reasoning.empty() || !p.content.empty() || !p.events.empty() || !p.tool_deltas.empty()) {
            json choice = {{"index", 0}, {"finish_reason", nullptr}};
            if (s->req.chat) {
              json delta = json::object();
              if (!p.reasoning.empty()) delta["reasoning_content"] = p.reasoning;
              if (!p.content.empty()) delta["content"] = p.content;
              if (!p.tool_deltas.empty()) delta["tool_calls"] = tool_deltas_json(p.tool_deltas);
              choice["delta"] = delta;
              choice["logprobs"] = s->req.logprobs ? chat_logprobs(*m.tokenizer, p.events) : json(nullptr);
            } else {
              choice["text"] = p.content;
              choice["logprobs"] = s->req.logprobs ? completion_logprobs(*m.tokenizer, p.events, *text_offset) : json(nullptr);
              *text_offset += p.content.size();
            }
            if (!send(chunk(*s, choice))) {
              s->stream->cancel();
              return false;
            }
          }
          if (s->finished) {
            json choice = {{"index", 0}, {"finish_reason", s->finish_reason}, {"logprobs", nullptr}};
            if (s->timed_out) choice["stop_reason"] = "timeout";
            if (s->req.chat) {
              choice["delta"] = json::object();
            } else {
              choice["text"] = "";
            }
            send(chunk(*s, choice));
            if (s->req.include_usage) {
              json u = chunk(*s, json::object());
              u["choices"] = json::array();
              u["usage"] = usage_json(*s);
              send(u);
            }
            const char done[] = "data: [DONE]\n\n";
            sink.write(done, sizeof(done) - 1);
            sink.done();
          }
          return true;
        },
        [s](bool) { s->stream->cancel(); });  // a dropped client frees its slot
  }

  void metrics(httplib::Response& res) {
    EngineMetrics em = m.engine->metrics();
    std::ostringstream o;
    o.precision(15);  // counters past 1e6 (tokens, seconds) keep every digit; the default 6 would not
    auto gauge = [&](const char* name, const char* help, double v) {
      o << "# HELP " << name << " " << help << "\n# TYPE " << name << " gauge\n" << name << " " << v << "\n";
    };
    auto counter = [&](const char* name, const char* help, double v) {
      o << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n" << name << " " << v << "\n";
    };
    gauge("deltaserve_requests_running", "Requests holding a state slot.", em.n_running);
    gauge("deltaserve_requests_waiting", "Requests queued for a slot (new or preempted).", em.n_waiting);
    counter("deltaserve_prompt_tokens_total", "Prompt tokens of admitted requests.", static_cast<double>(em.prompt_tokens_total));
    counter("deltaserve_generation_tokens_total", "Generated tokens.", static_cast<double>(em.generation_tokens_total));
    counter("deltaserve_preemptions_total", "Sequences preempted (recomputed later) because the KV pool ran dry.", static_cast<double>(em.preemptions_total));
    counter("deltaserve_steps_total", "Engine steps run.", static_cast<double>(em.steps_total));
    counter("deltaserve_step_seconds_total", "Seconds of engine loop iterations that ran a step (scheduling, the model, pushing tokens).", em.step_seconds_total);
    counter("deltaserve_forward_seconds_total", "Seconds of those steps in the model forward and sampling, device synchronised.", em.forward_seconds_total);
    o << "# HELP deltaserve_requests_finished_total Finished requests by reason.\n# TYPE deltaserve_requests_finished_total counter\n";
    for (int r = 1; r < 6; ++r)
      o << "deltaserve_requests_finished_total{reason=\"" << finish_reason_name(static_cast<FinishReason>(r)) << "\"} "
        << em.requests_finished_total[r] << "\n";
    gauge("deltaserve_kv_blocks_total", "KV cache blocks in the pool.", em.kv_blocks_total);
    gauge("deltaserve_kv_blocks_used", "KV cache blocks in use.", em.kv_blocks_used);
    gauge("deltaserve_kv_cache_usage", "Fraction of KV blocks in use.", em.kv_blocks_total ? double(em.kv_blocks_used) / em.kv_blocks_total : 0.0);
    gauge("deltaserve_state_slots_total", "GDN state slots in the pool.", em.state_slots_total);
    gauge("deltaserve_state_slots_used", "GDN state slots in use.", em.state_slots_used);
    prom_histogram(o, "deltaserve_time_to_first_token_seconds", "Time from submission to the first token.", em.ttft);
    prom_histogram(o, "deltaserve_time_per_output_token_seconds", "Mean time between tokens of a finished request.", em.tpot);
    counter("deltaserve_http_requests_total", "Generation requests received.", static_cast<double>(http_requests.load()));
    res.set_content(o.str(), "text/plain; version=0.0.4");
  }

  void routes() {
    const size_t n_threads = static_cast<size_t>(o.max_num_seqs + o.max_waiting + 8);
    svr.new_task_queue = [n_threads] { return new httplib::ThreadPool(n_threads); };
    svr.set_payload_max_length(o.max_body_bytes);
    // `curl -d` sends JSON labelled as a form, which cpp-httplib would parse as one and cap
    // at 8 KB (413). The API only takes JSON bodies, so relabel them before the body is read.
    svr.set_pre_routing_handler([](const httplib::Request& q, httplib::Response&) {
      if (q.method == "POST" && q.get_header_value("Content-Type") == "application/x-www-form-urlencoded") {
        auto& headers = const_cast<httplib::Request&>(q).headers;  // the server's own non-const Request
        headers.erase("Content-Type");
        headers.emplace("Content-Type", "application/json");
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    svr.set_read_timeout(30, 0);
    svr.set_write_timeout(30, 0);
    svr.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) { generate(q, r, true); });
    svr.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) { generate(q, r, false); });
    svr.Get("/v1/models", [this](const httplib::Request& q, httplib::Response& r) {
      if (!authorized(q, r)) return;
      json model = {{"id", m.name}, {"object", "model"}, {"created", m.created}, {"owned_by", "deltaserve"},
                    {"max_model_len", m.engine->options().max_model_len}};
      r.set_content(dump(json{{"object", "list"}, {"data", json::array({model})}}), "application/json");
    });
    svr.Get("/health", [](const httplib::Request&, httplib::Response& r) { r.set_content("{\"status\":\"ok\"}", "application/json"); });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& r) { metrics(r); });
    svr.set_exception_handler([](const httplib::Request&, httplib::Response& r, std::exception_ptr ep) {
      std::string what = "internal error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      DS_LOG_ERROR("http", "handler threw: %s", what.c_str());
      send_error(r, ApiError{500, "internal server error: " + what, "server_error", "", ""});
    });
    svr.set_error_handler([](const httplib::Request& q, httplib::Response& r) {
      if (!r.body.empty()) return;
      std::string msg = r.status == 404   ? "no route for " + q.method + " " + q.path
                        : r.status == 413 ? "the request body is larger than the server's limit"
                        : r.status == 405 ? "method not allowed"
                                          : "bad request";
      ApiError e{r.status, msg, r.status >= 500 ? "server_error" : "invalid_request_error", "", ""};
      r.set_content(dump(e.body()), "application/json");
    });
  }
};

HttpServer::HttpServer(ServedModel& model, const ServeOptions& options) : impl_(std::make_unique<Impl>(model, options)) {
  impl_->routes();
}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::bind() {
  if (impl_->o.port == 0) {
    impl_->port = impl_->svr.bind_to_any_port(impl_->o.host);
    if (impl_->port <= 0) return io_error("cannot bind " + impl_->o.host + " to any port");
  } else {
    if (!impl_->svr.bind_to_port(impl_->o.host, impl_->o.port))
      return io_error("cannot bind " + impl_->o.host + ":" + std::to_string(impl_->o.port) + " (in use, or not an address of this machine)");
    impl_->port = impl_->o.port;
  }
  raise_listen_backlog(impl_->port, 1024);
  return Status();
}

int HttpServer::port() const { return impl_->port; }

void HttpServer::run() { impl_->svr.listen_after_bind(); }

void HttpServer::stop() {
  if (impl_ && impl_->svr.is_running()) impl_->svr.stop();
}

}  // namespace ds::server
