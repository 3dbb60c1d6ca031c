// Engine: the engine thread's loop, request streams and metrics bookkeeping.
#include "engine/engine.h"

#include <algorithm>
#include <random>

#include "core/log.h"

namespace ds {

using Clock = std::chrono::steady_clock;

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kTimeout: return "timeout";
    case FinishReason::kError: return "error";
  }
  return "?";
}

//
// RequestStream
//
bool RequestStream::wait(Delta& out, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  auto has_news = [&] { return !pending_.tokens.empty() || pending_.finish != FinishReason::kNone; };
  if (!cv_.wait_for(lk, timeout, has_news)) return false;
  for (auto& t : pending_.tokens) out.tokens.push_back(std::move(t));
  pending_.tokens.clear();
  if (pending_.finish != FinishReason::kNone) {
    out.finish = pending_.finish;
    out.error = pending_.error;
    pending_.finish = FinishReason::kNone;  // reported once
  }
  return true;
}

void RequestStream::cancel() {
  cancel_.store(true);
  if (wake_engine_) wake_engine_();
}

void RequestStream::push(TokenEvent ev) {
  std::lock_guard lk(mu_);
  pending_.tokens.push_back(std::move(ev));
  cv_.notify_all();
}

void RequestStream::finish(FinishReason reason, Status error) {
  std::lock_guard lk(mu_);
  if (finished_) return;
  finished_ = true;
  pending_.finish = reason;
  pending_.error = std::move(error);
  cv_.notify_all();
}

//
// Engine
//
struct Engine::Req : SchedSeq {
  GenerationRequest g;
  std::shared_ptr<RequestStream> stream;
  std::unique_ptr<Sampler> sampler;
  std::vector<int32_t> stop_ids;
  int n_prompt = 0;
  bool counted_prompt = false;
  Clock::time_point t_submit, t_first, t_last;

  int n_generated() const { return static_cast<int>(seq.tokens.size()) - n_prompt; }
};

Engine::Engine(Runner& runner, const EngineOptions& options)
    : runner_(runner),
      options_(options),
      vocab_size_(runner.model().config().vocab_size),
      sched_(runner, SchedulerOptions{options.max_num_seqs, options.max_step_tokens}) {
  options_.max_model_len = std::min(options_.max_model_len, runner.max_context());
  publish_gauges();
}

Engine::~Engine() { stop(); }

void Engine::start() {
  std::lock_guard lk(mu_);
  if (running_) return;
  running_ = true;
  stop_ = false;
  thread_ = std::thread([this] { loop(); });
}

void Engine::stop() {
  {
    std::lock_guard lk(mu_);
    if (!running_) return;
    stop_ = true;
    cv_.notify_all();
  }
  thread_.join();
  std::lock_guard lk(mu_);
  running_ = false;
  for (auto& r : incoming_) r->stream->finish(FinishReason::kError, Status(ErrorCode::kUnsupported, "the server is shutting down"));
  incoming_.clear();
  n_held_ = 0;  // the engine thread has finished every request it held
}

Result<std::shared_ptr<RequestStream>> Engine::submit(GenerationRequest g) {
  if (g.prompt.empty()) return invalid_argument("the prompt is empty");
  for (int32_t id : g.prompt)
    if (id < 0 || id >= vocab_size_)
      return invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                              std::to_string(vocab_size_) + ")");
  if (g.max_tokens < 1) return invalid_argument("max_tokens must be at least 1");
  const int64_t total = static_cast<int64_t>(g.prompt.size()) + g.max_tokens;
  if (total > options_.max_model_len)
    return out_of_range("the prompt has " + std::to_string(g.prompt.size()) + " tokens and max_tokens is " +
                        std::to_string(g.max_tokens) + ": together more than the context of " +
                        std::to_string(options_.max_model_len) + " tokens");

  auto r = std::make_unique<Req>();
  r->n_prompt = static_cast<int>(g.prompt.size());
  r->seq.tokens = g.prompt;
  r->stop_ids = g.stop_ids;
  if (!g.ignore_eos) r->stop_ids.insert(r->stop_ids.end(), options_.eos_ids.begin(), options_.eos_ids.end());
  r->sampler = std::make_unique<Sampler>(g.sampling, std::random_device{}() * 0x9E3779B97F4A7C15ull ^ std::random_device{}());
  r->stream = std::make_shared<RequestStream>();
  r->stream->n_prompt_ = r->n_prompt;
  r->stream->wake_engine_ = [this] {
    std::lock_guard lk(mu_);
    cv_.notify_all();
  };
  r->t_submit = Clock::now();
  r->g = std::move(g);
  auto stream = r->stream;

  std::lock_guard lk(mu_);
  if (!running_ || stop_) return Status(ErrorCode::kUnsupported, "the engine is not running");
  // Counted from the requests held, not from the scheduler's gauges: those lag a step behind,
  // and a request not yet picked up by the engine thread would otherwise count as waiting.
  if (n_held_ >= options_.max_num_seqs + options_.max_waiting)
    return Status(ErrorCode::kResourceExhausted, "the server is overloaded: " + std::to_string(options_.max_waiting) +
                                                     " requests are already waiting");
  r->arrival = next_arrival_++;
  n_held_++;
  incoming_.push_back(std::move(r));
  cv_.notify_all();
  return stream;
}

EngineMetrics Engine::metrics() const {
  std::lock_guard lk(mu_);
  return metrics_;
}

void Engine::publish_gauges() {
  std::lock_guard lk(mu_);
  metrics_.n_running = sched_.n_running();
  metrics_.n_waiting = sched_.n_waiting();
  metrics_.kv_blocks_total = runner_.n_blocks();
  metrics_.kv_blocks_used = runner_.n_blocks() - runner_.n_free_blocks();
  metrics_.state_slots_total = runner_.n_slots();
  metrics_.state_slots_used = runner_.n_slots() - runner_.n_free_slots();
}

void Engine::finish(Req* r, FinishReason reason, Status error) {
  sched_.remove(r);
  // Gauges, counters and the held count before the reader hears of it: its slot shows as free,
  // and a client that sends its next request at once is not turned away by this one.
  publish_gauges();
  {
    std::lock_guard lk(mu_);
    metrics_.requests_finished_total[static_cast<int>(reason)]++;
    n_held_--;
    if (r->n_generated() >= 2)
      metrics_.tpot.observe(std::chrono::duration<double>(r->t_last - r->t_first).count() / (r->n_generated() - 1));
  }
  r->stream->finish(reason, std::move(error));
  reqs_.erase(std::remove_if(reqs_.begin(), reqs_.end(), [r](const auto& p) { return p.get() == r; }), reqs_.end());
}

void Engine::push_token(Req* r, SampleOutput s) {
  TokenConstraint* constraint = r->g.constraint.get();
  if (s.token < 0)
    return finish(r, FinishReason::kError, Status(ErrorCode::kInternal, "no token can be sampled: every logit is -inf or refused by the output constraint"));
  if (constraint) constraint->accept(s.token);
  const auto now = Clock::now();
  if (r->n_generated() == 0) {
    r->t_first = now;
    std::lock_guard lk(mu_);
    metrics_.ttft.observe(std::chrono::duration<double>(now - r->t_submit).count());
  }
  r->t_last = now;
  r->seq.tokens.push_back(s.token);
  {
    std::lock_guard lk(mu_);
    metrics_.generation_tokens_total++;
  }
  TokenEvent ev;
  ev.token = s.token;
  ev.logprob = s.logprob;
  ev.top = std::move(s.top);
  const bool stop_id = std::find(r->stop_ids.begin(), r->stop_ids.end(), s.token) != r->stop_ids.end();
  ev.is_stop = stop_id && r->n_generated() > r->g.min_tokens;
  const bool stop = ev.is_stop;
  r->stream->push(std::move(ev));
  if (stop || (constraint && constraint->done())) return finish(r, FinishReason::kStop);
  if (r->n_generated() >= r->g.max_tokens || static_cast<int>(r->seq.tokens.size()) >= options_.max_model_len)
    finish(r, FinishReason::kLength);
}

void Engine::loop() {
  DS_LOG_INFO("engine", "engine thread started: %d seqs, %d tokens per step, %d KV blocks of %d, %d state slots",
              sched_.options().max_num_seqs, options_.max_step_tokens, runner_.n_blocks(), runner_.block_size(),
              runner_.n_slots());
  for (;;) {
    std::vector<std::unique_ptr<Req>> fresh;
    Clock::time_point t_iter;  // the iteration's start, once there is work (idle waits excluded)
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] {
        if (stop_ || !incoming_.empty() || !sched_.idle()) return true;
        // idle: only a cancelled queued request could need attention, and there is none
        return false;
      });
      if (stop_) break;
      t_iter = Clock::now();
      while (!incoming_.empty()) {
        fresh.push_back(std::move(incoming_.front()));
        incoming_.pop_front();
      }
    }
    for (auto& r : fresh) {
      sched_.add(r.get());
      reqs_.push_back(std::move(r));
    }
    // cancellations and deadlines free their slots before anything is planned
    const auto now = Clock::now();
    std::vector<std::pair<Req*, FinishReason>> done;
    for (auto& r : reqs_) {
      if (r->stream->cancel_requested()) done.emplace_back(r.get(), FinishReason::kCancelled);
      else if (r->g.deadline && now >= *r->g.deadline) done.emplace_back(r.get(), FinishReason::kTimeout);
    }
    for (auto& [r, why] : done) finish(r, why);
    if (sched_.idle()) {
      publish_gauges();
      continue;
    }

    ScheduleOutput plan = sched_.schedule();
    for (SchedSeq* s : plan.seqs) {
      Req* r = static_cast<Req*>(s);
      if (!r->counted_prompt) {
        r->counted_prompt = true;
        std::lock_guard lk(mu_);
        metrics_.prompt_tokens_total += static_cast<uint64_t>(r->n_prompt);
      }
    }
    if (plan.n_preempted) {
      std::lock_guard lk(mu_);
      metrics_.preemptions_total += static_cast<uint64_t>(plan.n_preempted);
    }
    if (plan.work.empty()) {  // nothing fits: cannot happen while one sequence fits the pool
      DS_LOG_ERROR("engine", "no work could be scheduled for %d waiting requests", sched_.n_waiting());
      publish_gauges();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    std::vector<SampleJob> jobs(plan.seqs.size());
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      Req* r = static_cast<Req*>(plan.seqs[i]);
      if (r->seq.n_cached + plan.work[i].n_tokens < static_cast<int>(r->seq.tokens.size())) continue;  // mid-prefill
      std::span<const int32_t> all(r->seq.tokens);
      jobs[i] = SampleJob{r->sampler.get(), all.first(r->n_prompt), all.subspan(r->n_prompt), r->g.constraint.get()};
    }
    auto result = runner_.step_and_sample(plan.work, jobs);
    if (!result.ok()) {
      DS_LOG_ERROR("engine", "step failed: %s", result.status().message().c_str());
      for (SchedSeq* s : plan.seqs) finish(static_cast<Req*>(s), FinishReason::kError, result.status());
      publish_gauges();
      continue;
    }
    for (size_t i = 0; i < plan.seqs.size(); ++i)
      if (result.value().samples[i]) push_token(static_cast<Req*>(plan.seqs[i]), std::move(*result.value().samples[i]));
    publish_gauges();
    const double dt = std::chrono::duration<double>(Clock::now() - t_iter).count();
    std::lock_guard lk(mu_);
    metrics_.steps_total++;
    metrics_.step_seconds_total += dt;
    metrics_.forward_seconds_total += result.value().model_seconds;
  }
  for (auto& r : reqs_) {
    sched_.remove(r.get());
    r->stream->finish(FinishReason::kError, Status(ErrorCode::kUnsupported, "the server is shutting down"));
  }
  reqs_.clear();
  publish_gauges();
}

}  // namespace ds
