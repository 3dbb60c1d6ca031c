// bench serve: worker threads per concurrency level, each streaming one request at a time;
// times are taken at SSE chunk arrival on the client side.
#include "server/bench_serve.h"

#include <httplib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

namespace ds::server {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

struct Sample {
  bool ok = false;
  std::string error;
  double ttft = 0, latency = 0;
  int output_tokens = 0, prompt_tokens = 0;
  std::vector<double> itl;  // seconds between text chunks
};

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  double idx = p / 100.0 * static_cast<double>(v.size() - 1);
  size_t lo = static_cast<size_t>(idx), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (idx - static_cast<double>(lo));
}

json stats(const std::vector<double>& v) {
  double mean = 0;
  for (double x : v) mean += x;
  if (!v.empty()) mean /= static_cast<double>(v.size());
  return json{{"mean_ms", mean * 1e3}, {"p50_ms", pct(v, 50) * 1e3}, {"p90_ms", pct(v, 90) * 1e3}, {"p99_ms", pct(v, 99) * 1e3}};
}

std::vector<json> make_prompts(const BenchServeOptions& o, Status& st) {
  std::vector<json> prompts;
  if (!o.dataset.empty()) {
    std::ifstream f(o.dataset);
    if (!f) {
      st = not_found("cannot open --dataset " + o.dataset);
      return {};
    }
    std::string line;
    while (std::getline(f, line)) {
      if (line.empty()) continue;
      json j = json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("prompt")) {
        st = invalid_argument(o.dataset + ": every line must be a JSON object with \"prompt\"");
        return {};
      }
      prompts.push_back(j["prompt"]);
    }
    if (prompts.empty()) st = invalid_argument(o.dataset + " has no prompts");
    return prompts;
  }
  static const char* kWords[] = {"time", "river", "green", "model", "state", "light", "paper", "stone", "quick", "north",
                                 "cloud", "sound", "table", "field", "glass", "music", "plant", "sugar", "train", "water",
                                 "voice", "metal", "bread", "chair", "dream", "earth", "flame", "heart", "iron", "judge"};
  std::mt19937_64 g(o.seed);
  const int n_total = o.num_prompts * static_cast<int>(o.concurrency.size());
  for (int i = 0; i < n_total; ++i) {
    if (o.prompt_vocab > 0) {
      json ids = json::array();
      for (int t = 0; t < o.input_len; ++t) ids.push_back(static_cast<int>(g() % static_cast<uint64_t>(o.prompt_vocab)));
      prompts.push_back(ids);
    } else {  // a unique seeded head defeats prefix caches
      std::string p = "Request " + std::to_string(g() % 1000000000) + ":";
      for (int t = 0; t < o.input_len; ++t) p += std::string(" ") + kWords[g() % (sizeof(kWords) / sizeof(kWords[0]))];
      prompts.push_back(p);
    }
  }
  return prompts;
}

Sample run_one(const BenchServeOptions& o, const json& prompt) {
  Sample s;
  httplib::Client cli(o.url);
  cli.set_read_timeout(static_cast<time_t>(o.timeout_s), 0);
  cli.set_connection_timeout(10, 0);
  httplib::Headers h;
  if (!o.api_key.empty()) h.emplace("Authorization", "Bearer " + o.api_key);
  json body = {{"model", o.model}, {"prompt", prompt}, {"max_tokens", o.output_len}, {"temperature", o.temperature},
               {"top_p", o.top_p}, {"ignore_eos", true}, {"stream", true}, {"stream_options", {{"include_usage", true}}}};
  if (o.top_k > 0) body["top_k"] = o.top_k;
  const auto t0 = Clock::now();
  auto last = t0;
  bool first = true;
  std::string buf;
  int chunks = 0;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = h;
  req.set_header("Content-Type", "application/json");
  req.body = body.dump();
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
        buf.append(data, len);
        size_t e;
        while ((e = buf.find("\n\n")) != std::string::npos) {
          std::string ev = buf.substr(0, e);
          buf.erase(0, e + 2);
          if (ev.rfind("data: ", 0) != 0) continue;
          std::string payload = ev.substr(6);
          if (payload == "[DONE]") continue;
          json j = json::parse(payload, nullptr, false);
          if (j.is_discarded()) continue;
          if (j.contains("error")) {
            s.error = j["error"].dump();
            continue;
          }
          if (j.contains("usage") && j["usage"].is_object()) {
            s.output_tokens = j["usage"].value("completion_tokens", 0);
            s.prompt_tokens = j["usage"].value("prompt_tokens", 0);
          }
          if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty() &&
              !j["choices"][0].value("text", std::string()).empty()) {
            const auto now = Clock::now();
            if (first) {
              s.ttft = std::chrono::duration<double>(now - t0).count();
              first = false;
            } else {
              s.itl.push_back(std::chrono::duration<double>(now - last).count());
            }
            last = now;
            ++chunks;
          }
        }
        return true;
      };
  auto res = cli.send(req);
  s.latency = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!res) {
    s.error = "connection failed: " + httplib::to_string(res.error());
  } else if (res->status != 200) {
    s.error = "HTTP " + std::to_string(res->status) + ": " + buf.substr(0, 300);
  }
  if (s.output_tokens == 0) s.output_tokens = chunks;  // servers without include_usage
  s.ok = s.error.empty() && !first;
  if (s.ok && s.error.empty() && first) s.error = "no text came back";
  return s;
}

// A deltaserve server's engine step counters from /metrics (nullopt for other servers).
struct StepCounters {
  double steps = 0, step_seconds = 0, forward_seconds = 0;
};

std::optional<StepCounters> scrape_step_counters(const BenchServeOptions& o) {
  httplib::Client cli(o.url);
  cli.set_connection_timeout(5, 0);
  cli.set_read_timeout(10, 0);
  httplib::Headers h;
  if (!o.api_key.empty()) h.emplace("Authorization", "Bearer " + o.api_key);
  auto res = cli.Get("/metrics", h);
  if (!res || res->status != 200) return std::nullopt;
  StepCounters c;
  int found = 0;
  std::istringstream in(res->body);
  for (std::string line; std::getline(in, line);) {
    const size_t sp = line.find(' ');
    if (line.empty() || line[0] == '#' || sp == std::string::npos) continue;
    const std::string name = line.substr(0, sp);
    double* dst = name == "deltaserve_steps_total"           ? &c.steps
                  : name == "deltaserve_step_seconds_total"    ? &c.step_seconds
                  : name == "deltaserve_forward_seconds_total" ? &c.forward_seconds
                                                               : nullptr;
    if (!dst) continue;
    *dst = std::strtod(line.c_str() + sp + 1, nullptr);
    ++found;
  }
  if (found != 3) return std::nullopt;
  return c;
}

}  // namespace

Result<std::string> bench_serve(const BenchServeOptions& o) {
  if (o.model.empty()) return invalid_argument("--model is required (the id the server serves)");
  if (o.num_prompts < 1 || o.input_len < 1 || o.output_len < 1) return invalid_argument("--num-prompts, --input-len and --output-len must be >= 1");
  Status st;
  std::vector<json> prompts = make_prompts(o, st);
  if (!st.ok()) return st;
  json report = {{"url", o.url}, {"model", o.model}, {"num_prompts", o.num_prompts}, {"input_len", o.input_len},
                 {"output_len", o.output_len}, {"seed", o.seed}, {"temperature", o.temperature}, {"top_p", o.top_p},
                 {"top_k", o.top_k}, {"prompt_kind", !o.dataset.empty() ? "dataset" : o.prompt_vocab > 0 ? "token_ids" : "words"},
                 {"results", json::array()}};
  size_t next_prompt = 0;
  for (int c : o.concurrency) {
    if (c < 1) return invalid_argument("--concurrency values must be >= 1");
    std::vector<Sample> samples(static_cast<size_t>(o.num_prompts));
    std::atomic<int> next{0};
    const size_t base = next_prompt;
    next_prompt += static_cast<size_t>(o.num_prompts);
    const std::optional<StepCounters> before = scrape_step_counters(o);
    const auto t0 = Clock::now();
    std::vector<std::thread> workers;
    for (int w = 0; w < c; ++w)
      workers.emplace_back([&] {
        for (int i; (i = next.fetch_add(1)) < o.num_prompts;)
          samples[static_cast<size_t>(i)] = run_one(o, prompts[(base + static_cast<size_t>(i)) % prompts.size()]);
      });
    for (auto& t : workers) t.join();
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    const std::optional<StepCounters> after = before ? scrape_step_counters(o) : std::nullopt;
    std::vector<double> ttft, tpot, itl, lat;
    int64_t out_tokens = 0, in_tokens = 0;
    int n_ok = 0;
    json errors = json::array();
    for (const Sample& s : samples) {
      if (!s.ok) {
        if (errors.size() < 5) errors.push_back(s.error);
        continue;
      }
      ++n_ok;
      ttft.push_back(s.ttft);
      lat.push_back(s.latency);
      if (s.output_tokens > 1) tpot.push_back((s.latency - s.ttft) / (s.output_tokens - 1));
      itl.insert(itl.end(), s.itl.begin(), s.itl.end());
      out_tokens += s.output_tokens;
      in_tokens += s.prompt_tokens;
    }
    report["results"].push_back({{"concurrency", c}, {"completed", n_ok}, {"failed", o.num_prompts - n_ok}, {"errors", errors},
                                 {"duration_s", wall}, {"request_throughput", n_ok / wall},
                                 {"output_throughput", static_cast<double>(out_tokens) / wall},
                                 {"total_token_throughput", static_cast<double>(out_tokens + in_tokens) / wall},
                                 {"total_input_tokens", in_tokens}, {"total_output_tokens", out_tokens},
                                 {"ttft", stats(ttft)}, {"tpot", stats(tpot)}, {"itl", stats(itl)}, {"e2e_latency", stats(lat)}});
    // deltaserve only: the engine thread's own share of its steps over this level
    if (after && after->step_seconds > before->step_seconds) {
      const double steps = after->steps - before->steps, step_s = after->step_seconds - before->step_seconds,
                   fwd_s = after->forward_seconds - before->forward_seconds;
      const double overhead = 1.0 - fwd_s / step_s;
      report["results"].back()["server_steps"] = {{"steps", steps}, {"step_seconds", step_s}, {"forward_seconds", fwd_s},
                                                  {"mean_step_ms", steps > 0 ? step_s / steps * 1e3 : 0.0},
                                                  {"overhead", overhead}};
      std::fprintf(stderr, "concurrency %d: %.0f steps, mean step %.3f ms, server overhead = 1 - forward/step = %.2f%%\n",
                   c, steps, steps > 0 ? step_s / steps * 1e3 : 0.0, overhead * 100.0);
    }
  }
  return report.dump(2);
}

}  // namespace ds::server
