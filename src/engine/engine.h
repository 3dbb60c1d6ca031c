// Engine: one thread owns the Runner (and so the backend) and loops
// drain → schedule → run one step → sample → push token deltas to each request's stream.
// HTTP threads submit token-id requests and read their RequestStream; they never touch the
// runner. Knows nothing of HTTP, JSON or text: stop strings are the caller's business
// (it cancels the request when one matches).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "core/status.h"
#include "engine/metrics.h"
#include "engine/runner.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"

namespace ds {

enum class FinishReason { kNone = 0, kStop, kLength, kCancelled, kTimeout, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "timeout", "error"

struct GenerationRequest {
  std::vector<int32_t> prompt;       // i32 [n_prompt], ids in the vocabulary
  SamplingParams sampling;
  int max_tokens = 16;               // >= 1
  int min_tokens = 0;                // stop ids are ignored before this many tokens
  std::vector<int32_t> stop_ids;     // extra stop token ids (the model's EOS ids are added unless ignore_eos)
  bool ignore_eos = false;
  std::optional<std::chrono::steady_clock::time_point> deadline;  // then it ends with kTimeout
  // Non-null: every token is sampled on the CPU under this constraint (which the engine thread
  // then owns), and the request ends with kStop once it reports done().
  std::shared_ptr<TokenConstraint> constraint;
};

struct TokenEvent {
  int32_t token = -1;
  bool is_stop = false;              // a stop/EOS id: counted, but not text the client should see
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;
};

// What the engine has produced for one request since the reader last looked.
struct Delta {
  std::vector<TokenEvent> tokens;
  FinishReason finish = FinishReason::kNone;  // set once, with the last tokens
  Status error;                                // kError only
};

// Shared by the engine (writer) and one HTTP thread (reader).
class RequestStream {
 public:
  // Waits up to `timeout` for news; appends it to `out`. False if nothing came.
  bool wait(Delta& out, std::chrono::milliseconds timeout);
  // Asks the engine to drop the request; its slot and blocks are freed on the next loop.
  void cancel();
  bool cancel_requested() const { return cancel_.load(); }
  int n_prompt() const { return n_prompt_; }

 private:
  friend class Engine;
  void push(TokenEvent ev);
  void finish(FinishReason reason, Status error);

  std::mutex mu_;
  std::condition_variable cv_;
  Delta pending_;
  bool finished_ = false;
  std::atomic<bool> cancel_{false};
  int n_prompt_ = 0;
  std::function<void()> wake_engine_;
};

struct EngineOptions {
  int max_num_seqs = 64;
  int max_step_tokens = kDefaultMaxStepTokens;
  int max_waiting = 256;        // requests held beyond max_num_seqs before submit says 429
  int max_model_len = 4096;     // prompt + generated tokens
  std::vector<int32_t> eos_ids;
};

class Engine {
 public:
  Engine(Runner& runner, const EngineOptions& options);
  ~Engine();  // stops the thread; unfinished requests end with an error

  void start();
  void stop();

  // Queues a request. kInvalidArgument / kOutOfRange for a bad request (the caller should
  // have checked), kResourceExhausted when the waiting queue is full, kUnsupported (503)
  // when the engine is not running.
  Result<std::shared_ptr<RequestStream>> submit(GenerationRequest req);

  EngineMetrics metrics() const;
  const EngineOptions& options() const { return options_; }
  int vocab_size() const { return vocab_size_; }

 private:
  struct Req;
  void loop();
  void finish(Req* r, FinishReason reason, Status error = Status());
  void push_token(Req* r, SampleOutput s);
  void publish_gauges();

  Runner& runner_;
  EngineOptions options_;
  int vocab_size_ = 0;
  Scheduler sched_;
  std::thread thread_;

  mutable std::mutex mu_;            // guards incoming_, n_held_, stop_, metrics_
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Req>> incoming_;
  int n_held_ = 0;  // accepted and not yet finished: incoming_ plus reqs_
  bool stop_ = false;
  bool running_ = false;
  std::atomic<int> n_queued_{0};     // submitted and not yet admitted to a slot
  uint64_t next_arrival_ = 0;
  EngineMetrics metrics_;

  std::vector<std::unique_ptr<Req>> reqs_;  // engine thread only
};

}  // namespace ds
