// Server tests: stop strings across token boundaries, reasoning/tool-tail splitting, and the
// HTTP server in-process (tiny byte-level tokenizer + fixture weights):
// 32 concurrent greedy requests equal their solo runs; a mid-stream disconnect frees the slot.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "server/http_server.h"
#include "server/output_text.h"
#include "tok_test_util.h"

namespace ds::server {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::shared_ptr<tok::Tokenizer> tiny_tok() {
  auto t = tok::Tokenizer::from_json(tok::test::tiny_tokenizer_json({{"a", "b"}, {"c", "d"}}).dump(), "");
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.value();
}

std::vector<int32_t> ids_of(const tok::Tokenizer& t, const std::string& s) { return t.encode(s, false).value(); }

TEST(StopText, StopStringAcrossTokensIsNeverEmitted) {
  auto tok = tiny_tok();
  for (const std::string text : {"xyabcdSTOPqq", "abSTOP", "STOPab", "ab STO ab"}) {
    StopTextStream s(*tok, {"STOP", "zz"});
    std::string out;
    for (int32_t id : ids_of(*tok, text)) out += s.push(id);
    out += s.finish();
    size_t p = text.find("STOP");
    EXPECT_EQ(out, p == std::string::npos ? text : text.substr(0, p)) << text;
    EXPECT_EQ(s.stopped(), p != std::string::npos);
  }
}

TEST(ChatSplitter, StreamingEqualsWholeAndSplitsReasoningContentTools) {
  const std::string text = "let me think</think>\n\nHello<tool_call>\n<function=f>\n</function>\n</tool_call>";
  ChatSplitter whole(true, true);
  ChatSplitter::Piece a = whole.push(text), af = whole.finish();
  ChatSplitter bytes(true, true);
  std::string r, c, t;
  for (char ch : text) {
    auto p = bytes.push(std::string(1, ch));
    r += p.reasoning;
    c += p.content;
    t += p.tools;
  }
  auto f = bytes.finish();
  EXPECT_EQ(a.reasoning + af.reasoning, "let me think");
  EXPECT_EQ(a.content + af.content, "Hello");
  EXPECT_EQ(r + f.reasoning, "let me think");
  EXPECT_EQ(c + f.content, "Hello");
  EXPECT_EQ(t + f.tools, a.tools + af.tools);
  EXPECT_EQ(a.tools, "<tool_call>\n<function=f>\n</function>\n</tool_call>");
  ChatSplitter plain(false, false);  // no thinking, no tools: everything is content
  auto p = plain.push("a <tool_call> b");
  EXPECT_EQ(p.content + plain.finish().content, "a <tool_call> b");
  ChatSplitter opened(false, false);  // the model opened <think> itself
  auto q = opened.push("<think>x</think>y");
  EXPECT_EQ(q.reasoning, "x");
  EXPECT_EQ(q.content + opened.finish().content, "y");
}

//
// the HTTP server in-process
//
struct LiveServer {
  std::unique_ptr<ServedModel> model;
  std::unique_ptr<HttpServer> http;
  std::thread thread;
  int port = 0;

  explicit LiveServer(int max_num_seqs) {
    const std::string data = DS_TEST_DATA_DIR;
    const fs::path dir = fs::temp_directory_path() / ("ds_test_server_" + std::to_string(::getpid()) + "_" + std::to_string(max_num_seqs));
    fs::create_directories(dir);
    for (const char* f : {"config.json", "model.safetensors"})
      fs::copy_file(data + "/tiny_wrapper_long/" + f, dir / f, fs::copy_options::overwrite_existing);
    std::ofstream(dir / "tokenizer.json") << tok::test::tiny_tokenizer_json({{"a", "b"}}).dump();
    std::ofstream(dir / "tokenizer_config.json")
        << json{{"chat_template", tok::test::read_all(data + "/tokenizer/qwen3_8_style_template.jinja")}}.dump();
    ServeOptions o;
    o.model_dir = dir.string();
    o.device = "cpu";
    o.port = 0;
    o.max_num_seqs = max_num_seqs;
    o.max_model_len = 512;
    o.max_step_tokens = 128;
    auto m = ServedModel::load(o);
    EXPECT_TRUE(m.ok()) << m.status().message();
    model = std::move(m.value());
    http = std::make_unique<HttpServer>(*model, o);
    EXPECT_TRUE(http->bind().ok());
    port = http->port();
    thread = std::thread([this] { http->run(); });
    fs::remove_all(dir);  // loaded (weights are copied or mapped; the mapping outlives unlinking)
  }
  ~LiveServer() {
    http->stop();
    thread.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    return c;
  }
  double metric(const std::string& name) const {
    auto r = client().Get("/metrics");
    std::istringstream in(r->body);
    for (std::string line; std::getline(in, line);)
      if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
    return -1;
  }
};

std::string complete(const LiveServer& s, const std::vector<int>& prompt, int max_tokens) {
  json body = {{"model", s.model->name}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
  auto r = s.client().Post("/v1/completions", body.dump(), "application/json");
  EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response: " + httplib::to_string(r.error()));
  return r ? r->body : "";
}

std::vector<int> prompt_of(int i) {
  std::vector<int> p;
  for (int k = 0; k < 4 + (i * 5) % 40; ++k) p.push_back((i * 37 + k * 11) % 256);
  return p;
}

TEST(HttpServer, ThirtyTwoConcurrentGreedyRequestsEqualTheirSoloRuns) {
  constexpr int kN = 32;
  std::vector<std::string> solo(kN), together(kN);
  {
    LiveServer s(1);
    for (int i = 0; i < kN; ++i) solo[i] = json::parse(complete(s, prompt_of(i), 10))["choices"][0]["text"];
  }
  LiveServer s(32);
  std::vector<std::future<std::string>> fs;
  for (int i = 0; i < kN; ++i) fs.push_back(std::async(std::launch::async, [&, i] { return complete(s, prompt_of(i), 10); }));
  for (int i = 0; i < kN; ++i) {
    json j = json::parse(fs[i].get());
    EXPECT_EQ(j["choices"][0]["text"], solo[i]) << "request " << i;
    EXPECT_EQ(j["usage"]["completion_tokens"], 10);
  }
  EXPECT_EQ(s.metric("deltaserve_state_slots_used"), 0);
  // the engine step counters behind bench serve's overhead figure: forward within step
  const double steps = s.metric("deltaserve_steps_total"), step_s = s.metric("deltaserve_step_seconds_total"),
               fwd_s = s.metric("deltaserve_forward_seconds_total");
  EXPECT_GE(steps, 10);  // 10 decode tokens each, batched
  EXPECT_GT(fwd_s, 0);
  EXPECT_LE(fwd_s, step_s);
  EXPECT_GT(fwd_s / step_s, 0.5) << "the CPU model dominates a step";
}

TEST(HttpServer, DisconnectMidStreamFreesTheSlot) {
  LiveServer s(4);
  json body = {{"model", s.model->name}, {"prompt", std::vector<int>{1, 2, 3}}, {"max_tokens", 400}, {"temperature", 0},
               {"ignore_eos", true}, {"stream", true}};
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.body = body.dump();
  int chunks = 0;
  bool saw_running = false;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
    if (++chunks == 3) saw_running = s.metric("deltaserve_state_slots_used") == 1;
    return chunks < 3;  // drop the connection after three chunks
  };
  auto c = s.client();
  c.send(req);
  EXPECT_TRUE(saw_running);
  double used = 1;
  for (int i = 0; i < 200 && used != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    used = s.metric("deltaserve_state_slots_used");
  }
  EXPECT_EQ(used, 0);
  EXPECT_EQ(s.metric("deltaserve_kv_blocks_used"), 0);
  EXPECT_LT(s.metric("deltaserve_generation_tokens_total"), 400);
}

TEST(HttpServer, ClientGivingUpOnANonStreamedRequestFreesTheSlot) {
  LiveServer s(4);
  json body = {{"model", s.model->name}, {"prompt", std::vector<int>{1, 2, 3}}, {"max_tokens", 480}, {"temperature", 0},
               {"ignore_eos", true}};
  {
    httplib::Client c("127.0.0.1", s.port);
    c.set_read_timeout(0, 200000);  // gives up after 0.2 s and closes the connection
    const auto t0 = std::chrono::steady_clock::now();
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    EXPECT_FALSE(r);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1000));
  }
  double used = 1;
  for (int i = 0; i < 200 && used != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    used = s.metric("deltaserve_state_slots_used");
  }
  EXPECT_EQ(used, 0);
  EXPECT_LT(s.metric("deltaserve_generation_tokens_total"), 480);
}

}  // namespace
}  // namespace ds::server

namespace ds::server {
namespace {

// `serve --config C --synthetic`: random weights of a config's shapes behind the same API; a
// token-id completion answers with the stand-in tokenizer's "<tN>" text, a chat request is a
// clear 400 (no chat template), and the same seed draws the same model (same greedy text).
TEST(HttpServer, SyntheticModelServesTokenIdPrompts) {
  ServeOptions o;
  o.synthetic_config = std::string(DS_TEST_DATA_DIR) + "/tiny_wrapper_long/config.json";
  o.device = "cpu";
  o.port = 0;
  o.max_num_seqs = 2;
  o.max_model_len = 256;
  std::string texts[2];
  for (std::string& text : texts) {
    auto m = ServedModel::load(o);
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ(m.value()->name, "synthetic-config");
    HttpServer http(*m.value(), o);
    ASSERT_TRUE(http.bind().ok());
    std::thread t([&] { http.run(); });
    httplib::Client c("127.0.0.1", http.port());
    c.set_read_timeout(60, 0);
    json body = {{"model", m.value()->name}, {"prompt", std::vector<int>{5, 300, 17, 351}}, {"max_tokens", 6},
                 {"temperature", 0}, {"ignore_eos", true}};
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    json j = json::parse(r->body);
    text = j["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(j["usage"]["completion_tokens"], 6);
    json chat = {{"model", m.value()->name}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
    auto rc = c.Post("/v1/chat/completions", chat.dump(), "application/json");
    ASSERT_TRUE(rc);
    EXPECT_EQ(rc->status, 400) << rc->body;
    http.stop();
    t.join();
  }
  EXPECT_FALSE(texts[0].empty());
  EXPECT_EQ(texts[0], texts[1]);
}

}  // namespace
}  // namespace ds::server
