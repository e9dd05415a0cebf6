// indexshare bench, inside: the run's options and what it measured. cmd_bench.cc runs the steps
// (timing, agreement checks); bench_report.cc prints the tables and writes the JSON.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ref/attention.h"
#include "ref/fp4.h"
#include "ref/layer.h"
#include "ref/problem.h"
#include "ref/tensor.h"
#include "simd/simd.h"
#include "tools/lib/impl.h"

namespace indexshare::cli::bench {

using nlohmann::json;

double median(std::vector<double> v);
std::string fmt(const char* f, double x);                        // printf of one double
int64_t valid_indices(const Tensor<int32_t>& indices, int64_t s_kv);  // indices in [0, s_kv)
bool same_floats(const Tensor<float>& a, const Tensor<float>& b);    // bit-identical (NaN = NaN)
double now_s();                                                       // a steady clock, seconds
std::vector<double> time_runs(const std::function<void()>& fn, int repeats, double budget);  // the repeat rules
double cpu_s();  // the process's CPU time (user + system, every thread), seconds

constexpr double kWarmupDiscard = 0.5;  // seconds
// The repeat rules in cmd_bench.cc's header comment, for one stage or command: the first run is a warm-up
// (not a sample) when it takes under kWarmupDiscard; then runs until `repeats` samples, or until
// their total passes `budget` once there is one.
struct Repeats {
  Repeats(int repeats_, double budget_) : repeats(repeats_), budget(budget_) {}
  int repeats;
  double budget;
  std::vector<double> samples;  // seconds
  double total = 0;
  bool first = true;
  bool more() const { return first || (int(samples.size()) < repeats && (samples.empty() || total <= budget)); }
  // One run's time; whether it became a sample.
  bool add(double t) {
    const bool keep = !first || t >= kWarmupDiscard;
    first = false;
    if (keep) {
      samples.push_back(t);
      total += t;
    }
    return keep;
  }
};


struct BenchArgs {
  std::string problem, impl = "ref,simd", target = "best", json_path;
  int repeats = 5, threads = 0;
  int64_t stack_seq = 8192, stack_sq = 512, stack_topk = 2048;
  std::string model = "deepseek-v3.2";
  int64_t module_rows = 128;
  double budget = 15.0;
  std::string max_memory = "8G";
  std::string commands = "yes";
  std::string backward = "yes";  // the attention backward stage: yes, no, only (skip the other stages)
  std::string v4;                 // a DeepSeek-V4 descriptor: the V4 stage alone (bench_v4.cc)
  std::string v4_ref = "yes";     // the V4 stage's ref build: yes or no
  std::string kpool;              // a kpool descriptor: the KPool stage alone (bench_kpool.cc)
  std::vector<std::string> given;  // the options on the command line
};

struct StageResult {
  std::string stage, impl;
  int threads = 1;
  std::vector<double> samples;
  double flops = 0;      // 0: no FLOP count (top-k)
  double keys = 0;       // scored keys (top-k), else 0
  double peak = 0;       // GFLOP/s at `threads`
  double speedup = 0;    // simd vs ref (0: none)
  std::string note;

  double med() const { return samples.empty() ? 0.0 : median(samples); }
  double gflops() const { return flops > 0 && med() > 0 ? flops / med() / 1e9 : 0.0; }
  double share() const { return peak > 0 ? gflops() / peak : 0.0; }
};

struct Peaks {
  double start1 = 0, startn = 0, end1 = 0, endn = 0;
};

struct StackRun {
  std::string sched, pattern;
  std::vector<double> samples;
  double flops = 0;
  int indexers = 0;
};

struct CommandRun {
  std::string name;
  std::vector<double> samples;  // wall seconds
  std::vector<double> cpu;      // process CPU seconds (user + system, all threads) of the same runs
};

// One bench run: its options, what it measured and its report; cmd_bench calls the steps in order.
struct Bench {
  const BenchArgs& a;
  bool do_ref = false, do_simd = false, fp8 = false, do_stack = false, do_commands = false, do_module = false;
  Problem p;
  Problem sp[2];
  const char* scheds[2] = {"all-full", "one-full-three-shared"};
  int threads = 0;
  std::string probe_target, target;
  std::string compiled;  // listed before set_target narrows the list to one target
  Peaks pk;
  double peak1 = 0, peakn = 0;
  // Layer 0 and its stages.
  ref::LayerInputs in;
  int64_t window = 0, valid = 0;
  double f_index = 0, f_attn = 0;
  const Tensor<float>* sink = nullptr;
  Tensor<float> logits0;
  Tensor<int32_t> topk0, indices;
  std::vector<StageResult> rows;
  std::vector<std::string> mismatches;
  double ref_logits = 0, ref_topk = 0, ref_attn = 0, ref_fp4 = 0;
  // FP8 mode: the same q and k (their FP8 values) quantized to FP4 under toward-zero (ref/fp4.h).
  ref::fp4::Quantized fp4_q, fp4_k;
  Tensor<float> ref_fp4_out;
  // Stage outputs of the last run, for the agreement checks.
  Tensor<float> out_logits;
  Tensor<int32_t> out_topk;
  ref::AttentionOut out_attn;
  Tensor<float> ref_logits_out;
  Tensor<int32_t> ref_topk_out;
  ref::AttentionOut ref_attn_out;
  simd::AttentionPhases attn_phases;
  bool have_phases = false;
  std::string index_name;
  // The attention backward stage (bench_backward.cc).
  struct Backward {
    bool on = false;
    double fwd_s = 0, bwd_s = 0, ratio = 0, speedup = 0, fwd_bytes = -1, bwd_bytes = -1;
    int64_t ref_rows = 0;
  } bwd;
  // Stack and commands.
  StackRun runs[2];
  double measured = 0, predicted = 0, stack_ratio = 0;
  std::vector<CommandRun> commands;
  std::string commands_verdict;
  // Report.
  json j;
  double matrix_share = 0, whole_share = 0;
  double golden_over_run = 0, diff_over_golden = 0, inputs_over_run = 0;

  explicit Bench(const BenchArgs& args) : a(args) {}

  void check_options();
  void check_memory_limits();
  void set_threads_and_target();
  void check_json_path() const;
  void probe_peaks_start();
  void generate_layer0();
  Tensor<float> logits_ref() const;
  Tensor<float> logits_simd() const;
  double add(const std::string& stage, Impl impl, double flops, double keys,
             const std::function<void()>& fn, double ref_median, const std::string& note);
  void time_module_projections();
  void time_ref_stages();
  void time_simd_stages();
  void profile_attention_phases();
  void time_attention_backward();
  void report_attention_backward();
  void time_stack();
  void time_stack_pairs(const std::vector<ref::LayerInputs> (&inputs)[2]);
  void time_commands();
  void probe_peaks_end();
  void print_summary() const;
  void start_json();
  const StageResult* find(const std::string& stage, Impl impl) const;
  void report_attention_phases();
  void report_stack();
  void report_commands();
  void report_targets();
  int finish() const;
};

// The DeepSeek-V4 stage (bench_v4.cc): run, golden and ref's build of a V4 stack; its exit status.
int bench_v4(const BenchArgs& a);
// The GLM-5.3 KPool stage (bench_kpool.cc): the pooled indexer's parts against the FMA peak, then
// run, golden and golden's build of a kpool stack; its exit status.
int bench_kpool(const BenchArgs& a);

// The descriptor kinds' commands (bench_v4.cc), timed interleaved round by round under the repeat
// rules (wall and process CPU time); `dir` is removed, untimed, before every run.
std::vector<CommandRun> interleave_commands(const BenchArgs& a, const std::vector<std::pair<std::string, std::function<void()>>>& cmds,
                                            const std::string& dir);
// The machine a bench ran on, for its JSON: the CPU's model name and vector extensions (Linux's
// /proc/cpuinfo), the hardware threads and the simd path's Highway target.
json machine_json();
// A scratch folder under the system's temporary one for a kind's golden command, removed at the end.
std::string bench_temp_dir(const std::string& kind);
struct TempDir {
  std::string dir;
  ~TempDir();
};

void print_stage(const StageResult& r);
json stage_json(const StageResult& r);
// Writes a line of progress on stderr.
void progress(const std::string& what);

}  // namespace indexshare::cli::bench
