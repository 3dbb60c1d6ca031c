// Test helper: a committed reference fixture (tests/data/<name>) and the CPU engine on it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "engine/runner.h"
#include "io/checkpoint.h"
#include "io/npy.h"

namespace ds::test {

struct Reference {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> greedy_ids;
  std::vector<float> greedy_margins;
  NpyArray logits;      // [n_prompt, vocab]
  NpyArray mtp_logits;  // [n_prompt - 1, vocab], empty without MTP
};

std::string fixture_dir(const std::string& name);  // an absolute path is taken as it is
Reference load_reference(const std::string& name);
const std::vector<std::string>& fixture_names();

// A CPU engine on one fixture.
struct Engine {
  std::unique_ptr<Checkpoint> ck;
  std::unique_ptr<CpuOps> ops;
  std::unique_ptr<Qwen35Model> model;
  std::unique_ptr<Runner> runner;
};
// int8_vocab: the CPU twin of the CUDA int8 embedding / lm_head tables (CpuOps::set_int8_vocab);
// a8: the layer classes whose W4A16 linears read int8 inputs (W4A8).
Engine make_engine(const std::string& name, int n_slots = 4, int n_blocks = 64, int block_size = 16,
                   bool bf16_activations = false, bool int8_vocab = false, ActInt8Layers a8 = {});

// max |a - b| / std(b): the parity metric of the Foundation issue.
double max_err_over_std(const std::vector<float>& a, const std::vector<float>& b);

// ||a - b|| / ||b||: the metric for invariance checks (same math, different step shapes).
double rel_rms(const std::vector<float>& a, const std::vector<float>& b);

// MTP logits over a prompt (architecture reference §6): the main model runs the prompt keeping
// its final-normed hidden; MTP slot i takes token ids[i+1], that hidden of row i and position
// i. Returns the logits of the slots in `rows`, [rows, vocab] flattened. On any backend (the
// CUDA tests' engines too).
std::vector<float> mtp_prompt_logits(Runner& runner, Ops& ops, Qwen35Model& model, const std::vector<int32_t>& ids,
                                     const std::vector<int>& rows);

// Logits of every prompt row, fed in chunks of the given sizes (cycled).
std::vector<float> prefill_logits(Engine& e, const std::vector<int32_t>& ids, const std::vector<int>& chunks);

}  // namespace ds::test
