// indexshare bench: the report. The stage, phase, stack and command tables and the goal lines,
// printed and written to the JSON, from what cmd_bench.cc measured (tools/cli/bench.h).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ref/error.h"
#include "tools/cli/bench.h"
#include "tools/lib/svg.h"

namespace indexshare::cli::bench {

// Step: print the problem, machine, peak and FLOPs lines, the stage table and the agreement.
void Bench::print_summary() const {
  std::printf("problem   %s\n", to_string(p).c_str());
  std::printf("machine   %d OpenMP thread(s) for simd (ref's kernels are single-threaded); simd target %s (supported: %s)\n",
              threads, target.c_str(), compiled.c_str());
  std::printf("peak      FMA probe, double, %s, GFLOP/s: 1 thread %.1f (start %.1f, end %.1f)", probe_target.c_str(),
              peak1, pk.start1, pk.end1);
  if (threads != 1)
    std::printf("; %d threads %.1f (start %.1f, end %.1f)", threads, peakn, pk.startn, pk.endn);
  std::printf("\n");
  std::printf("FLOPs     indexer 2*H*D*W = %.4g (W = %lld window keys), attention 2*h_q*(d_qk+d_v)*V = %.4g "
              "(V = %lld valid indices)\n\n",
              f_index, (long long)window, f_attn, (long long)valid);
  std::printf("%-21s %-5s %3s %4s %10s %9s %6s %8s  %s\n", "stage", "impl", "thr", "runs", "median s", "GFLOP/s",
              "%peak", "speedup", "note");
  for (const StageResult& r : rows) print_stage(r);
  if (do_ref && do_simd)
    std::printf("agreement simd vs ref: %s\n",
                mismatches.empty() ? (a.backward == "only" ? std::string("attention backward (on ref's rows) bit-identical")
                                                           : std::string(do_module ? "module projections, " : "") +
                                                                 "logits, top-k, fused top-k and attention" +
                                                                 (bwd.on ? ", attention backward" : "") + " bit-identical")
                                         .c_str()
                                   : "MISMATCH");
  for (const std::string& m : mismatches) std::printf("agreement MISMATCH in %s\n", m.c_str());
}

json machine_json() {
  std::string cpu = "unknown";
  std::vector<std::string> isa;
  std::ifstream f("/proc/cpuinfo");  // Linux; elsewhere the CPU stays "unknown"
  for (std::string line; std::getline(f, line);) {
    const size_t colon = line.find(':');
    if (cpu == "unknown" && line.rfind("model name", 0) == 0 && colon != std::string::npos) {
      cpu = line.substr(colon + 1);
      cpu.erase(0, cpu.find_first_not_of(' '));
    }
    std::istringstream in(line);
    std::string key;
    in >> key;
    if (key == "flags" && isa.empty()) {
      std::set<std::string> flags;
      for (std::string w; in >> w;) flags.insert(w);
      for (const char* x : {"avx2", "avx512f", "avx512_bf16", "amx_tile"})
        if (flags.count(x)) isa.push_back(x);
    }
  }
  std::string isa_text;
  for (const std::string& x : isa) isa_text += (isa_text.empty() ? "" : " ") + x;
  return {{"cpu", cpu}, {"isa", isa_text}, {"cores", std::thread::hardware_concurrency()}, {"simd_target", simd::current_target()}};
}

// Step: start the JSON report with the run's settings, peaks, FLOPs, agreement and stages.
void Bench::start_json() {
  j = {{"machine", machine_json()},
       {"problem", to_string(p)},
       {"threads", threads},
       {"target", target},
       {"probe_target", probe_target},
       {"repeats", a.repeats},
       {"budget_s", a.budget},
       {"peak_gflops", {{"threads_1", {{"used", peak1}, {"start", pk.start1}, {"end", pk.end1}}},
                        {"threads_n", {{"threads", threads}, {"used", peakn}, {"start", pk.startn}, {"end", pk.endn}}}}},
       {"flops", {{"indexer", f_index}, {"attention", f_attn}, {"window_keys", window}, {"valid_indices", valid}}},
       {"module", {{"preset", a.model}, {"rows", a.module_rows}}},
       {"agreement", {{"checked", do_ref && do_simd}, {"mismatches", mismatches}}}};
  json stages = json::array();
  for (const StageResult& r : rows) stages.push_back(stage_json(r));
  j["stages"] = stages;
}

// The timed row of `stage` on `impl`, or null.
const StageResult* Bench::find(const std::string& stage, Impl impl) const {
  for (const StageResult& r : rows)
    if (r.stage == stage && r.impl == impl_name(impl) && !r.samples.empty()) return &r;
  return nullptr;
}

// Step: report the attention phases (printed and in the JSON).
void Bench::report_attention_phases() {
  // The attention phases: shares of the median profiled call's thread-seconds, and the rate of the two
  // register-tile passes against one thread's peak (their FLOPs over their thread-seconds).
  if (!have_phases) {
    j["attention_phases"] = nullptr;
    return;
  }
  const simd::AttentionPhases& ph = attn_phases;
  const double per_thread_peak = peakn / threads;
  const double f_qk = f_attn * double(p.d_qk) / double(p.d_qk + p.d_v), f_pv = f_attn - f_qk;
  const auto rate = [&](double flops, double sec) { return sec > 0 ? flops / sec / 1e9 / per_thread_peak : 0.0; };
  const auto pct = [&](double sec) { return ph.total > 0 ? 100 * sec / ph.total : 0.0; };
  const double rest = ph.total - (ph.qk_tiles + ph.pv_tiles + ph.k_gather + ph.v_gather + ph.q_decode + ph.softmax);
  matrix_share = rate(f_attn, ph.qk_tiles + ph.pv_tiles);
  if (const StageResult* r = find("attention (sparse)", Impl::simd)) whole_share = r->share();
  std::printf("\nattention phases (simd, the median of %d profiled call(s), %.4f thread-seconds over %d thread(s)):\n",
              a.repeats, ph.total, threads);
  std::printf("          q.k tiles %.1f%% (%.1f%% of peak), P.V tiles %.1f%% (%.1f%% of peak), kv gather+decode "
              "%.1f%%, V gather+decode %.1f%%, q decode %.1f%%, softmax %.1f%%, rest %.1f%%\n",
              pct(ph.qk_tiles), 100 * rate(f_qk, ph.qk_tiles), pct(ph.pv_tiles), 100 * rate(f_pv, ph.pv_tiles),
              pct(ph.k_gather), pct(ph.v_gather), pct(ph.q_decode), pct(ph.softmax), pct(rest));
  std::printf("          matrix part (q.k and P.V tiles): %.1f%% of peak; the whole call (table above): %.1f%%\n",
              100 * matrix_share, 100 * whole_share);
  j["attention_phases"] = {{"thread_seconds", {{"qk_tiles", ph.qk_tiles}, {"pv_tiles", ph.pv_tiles},
                                               {"kv_gather_decode", ph.k_gather}, {"v_gather_decode", ph.v_gather},
                                               {"q_decode", ph.q_decode}, {"softmax", ph.softmax},
                                               {"rest", rest}, {"total", ph.total}}},
                           {"qk_tiles_peak_share", rate(f_qk, ph.qk_tiles)},
                           {"pv_tiles_peak_share", rate(f_pv, ph.pv_tiles)},
                           {"profiled_calls", a.repeats},
                           {"matrix_part_peak_share", matrix_share},
                           {"whole_call_peak_share", whole_share}};
}

// Step: report the stack table and its speedups (printed and in the JSON).
void Bench::report_stack() {
  if (!do_stack) {
    std::printf("\nstack     not run (%s)\n", a.stack_seq == 0 ? "--stack-seq 0" : "needs --impl simd");
    j["stack"] = nullptr;
    return;
  }
  Problem shown = sp[1];
  std::printf("\nstack     %s\n", to_string(shown).c_str());
  std::printf("          against sched=all-full; simd::run_stack, keep_logits off (%s), %d thread(s)\n",
              fp8 ? "streaming fused indexer+top-k" : "logits then top-k", threads);
  std::printf("%-21s %-7s %4s %10s %10s %9s %6s\n", "schedule", "pattern", "runs", "median s", "GFLOP", "GFLOP/s",
              "%peak");
  json sj = json::array();
  for (const StackRun& r : runs) {
    const double m = median(r.samples), g = r.flops / m / 1e9;
    std::printf("%-21s %-7s %4zu %10.4f %10.3f %9.2f %5.1f%%\n", r.sched.c_str(), r.pattern.c_str(), r.samples.size(),
                m, r.flops / 1e9, g, 100 * g / peakn);
    sj.push_back({{"sched", r.sched}, {"pattern", r.pattern}, {"runs", r.samples.size()}, {"samples_s", r.samples},
                  {"median_s", m}, {"flops", r.flops}, {"indexer_layers", r.indexers}, {"gflops", g},
                  {"peak_share", g / peakn}});
  }
  std::printf("speedup   shared over all-full: measured %.3fx, FLOP-predicted %.3fx, measured/predicted %.1f%%\n",
              measured, predicted, 100 * stack_ratio);
  // The same ratio within each alternating pair (the two runs back to back): its spread is this
  // machine's run-to-run noise on the line above, which uses the medians of all runs.
  std::vector<double> pairs;
  for (size_t i = 0; i < runs[0].samples.size() && i < runs[1].samples.size(); ++i)
    pairs.push_back(runs[0].samples[i] / runs[1].samples[i] / predicted);
  const auto [lo, hi] = std::minmax_element(pairs.begin(), pairs.end());
  std::printf("          per alternating pair: %zu pair(s), measured/predicted %.1f%% to %.1f%% (median %.1f%%)\n",
              pairs.size(), 100 * *lo, 100 * *hi, 100 * median(pairs));
  j["stack"] = {{"problem", to_string(shown)}, {"runs", sj}, {"measured_speedup", measured},
                {"predicted_speedup", predicted}, {"measured_over_predicted", stack_ratio},
                {"pair_measured_over_predicted", pairs}};
}

// Step: report the command table and its ratios (printed and in the JSON).
void Bench::report_commands() {
  if (!do_commands) {
    std::printf("\ncommands  not run (%s)\n", do_simd ? "--commands no" : "needs --impl simd");
    j["commands"] = nullptr;
    return;
  }
  const auto med_of = [&](const std::string& name) {
    for (const CommandRun& c : commands)
      if (c.name == name) return median(c.samples);
    return 0.0;
  };
  // CPU time: the ratios a loaded machine still measures (its wall times stretch with the load).
  const auto cpu_of = [&](const std::string& name) {
    for (const CommandRun& c : commands)
      if (c.name == name) return median(c.cpu);
    return 0.0;
  };
  golden_over_run = med_of("golden") / med_of("run");
  inputs_over_run = med_of("run: inputs only") / med_of("run");
  diff_over_golden = med_of("diff") / med_of("golden");
  const double golden_over_run_cpu = cpu_of("golden") / cpu_of("run");
  const double inputs_over_run_cpu = cpu_of("run: inputs only") / cpu_of("run");
  const double diff_over_golden_cpu = cpu_of("diff") / cpu_of("golden");
  const double correct_over_golden = med_of("diff: correct kernel") / med_of("golden"),
               failing_over_golden = med_of("diff: failing kernel") / med_of("golden");
  std::printf("\ncommands  %s, every layer, simd, %d thread(s), end to end (golden written to a temporary folder; diff "
              "of an exact copy of its outputs: %s)\n",
              to_string(p).c_str(), threads, commands_verdict.c_str());
  std::printf("%-21s %4s %10s %9s %10s %9s\n", "command", "runs", "median s", "vs run", "cpu s", "cpu vs run");
  json cj = json::array();
  for (const CommandRun& c : commands) {
    const double m = median(c.samples), mc = median(c.cpu);
    std::printf("%-21s %4zu %10.4f %8.2fx %10.4f %8.2fx\n", c.name.c_str(), c.samples.size(), m, m / med_of("run"), mc,
                mc / cpu_of("run"));
    cj.push_back({{"command", c.name}, {"runs", c.samples.size()}, {"samples_s", c.samples}, {"median_s", m},
                  {"cpu_samples_s", c.cpu}, {"median_cpu_s", mc}});
  }
  std::printf("          in CPU time (user + system, all threads; the ratios to read on a loaded machine): golden / run "
              "%.2fx, inputs / run %.1f%%, diff / golden %.2fx\n",
              golden_over_run_cpu, 100 * inputs_over_run_cpu, diff_over_golden_cpu);
  std::printf("          diff / golden, wall: exact copy %.2fx, a correct kernel's bf16 out %.2fx (goal 1.5x), a failing kernel "
              "%.2fx (goal 5x)\n",
              diff_over_golden, correct_over_golden, failing_over_golden);
  j["commands"] = {{"problem", to_string(p)}, {"runs", cj}, {"golden_over_run", golden_over_run},
                   {"inputs_over_run", inputs_over_run},
                   {"diff_over_golden", diff_over_golden}, {"diff_verdict", commands_verdict},
                   {"diff_correct_over_golden", correct_over_golden}, {"diff_failing_over_golden", failing_over_golden},
                   {"golden_over_run_cpu", golden_over_run_cpu}, {"inputs_over_run_cpu", inputs_over_run_cpu},
                   {"diff_over_golden_cpu", diff_over_golden_cpu}};
}

// The problem the input-generation goal is defined at (any seed).
constexpr const char* kInputsTargetShape = "sq4096 skv4096 hq64 dqk576 dv512 ih64 id128 k512";
// The same work: every dimension and layer count (the seed and the fills aside).
bool same_shape(const Problem& a, const Problem& b) {
  return a.s_q == b.s_q && a.s_kv == b.s_kv && a.h_q == b.h_q && a.d_qk == b.d_qk && a.d_v == b.d_v &&
         a.index_n_heads == b.index_n_heads && a.index_head_dim == b.index_head_dim && a.index_topk == b.index_topk &&
         a.n_layers == b.n_layers;
}

// The problem the attention backward's time goal is defined at (the FlashMLA prefill shape).
constexpr const char* kBackwardTargetShape = "sq4096 skv4096 hq64 dqk576 dv512 ih64 id128 k2048";

// Step: the goal lines (printed and in the JSON).
void Bench::report_targets() {
  json tj = json::array();
  const auto target_line = [&](const std::string& what, double value, double goal, const char* unit) {
    const bool met = value >= goal;
    std::printf("goal      %-52s %7.1f%s (goal >= %.0f%s)\n", what.c_str(), value, unit, goal, unit);
    tj.push_back({{"target", what}, {"value", value}, {"goal", goal}, {"unit", unit}, {"met", met}});
  };
  std::printf("\n");
  if (const StageResult* r = find("indexer logits", Impl::simd)) {
    target_line("simd indexer logits (FP8): share of FMA peak", 100 * r->share(), 60, "%");
    if (r->speedup > 0) target_line("simd indexer logits (FP8): speedup over ref", r->speedup, 20, "x");
  }
  if (have_phases) {
    target_line("simd sparse attention, matrix part: share of peak", 100 * matrix_share, 50, "%");
    std::printf("          (the whole attention call, gathers, decode and softmax included: %.1f%% of peak)\n",
                100 * whole_share);
  }
  if (do_stack) target_line("F S S S over all-full: measured / predicted speedup", 100 * stack_ratio, 90, "%");
  // defined_at (when given): the problem the goal is defined at; on another one the ratio
  // is printed but neither met nor missed.
  const auto target_max = [&](const std::string& what, double value, double goal, const char* defined_at = nullptr) {
    json t = {{"target", what}, {"value", value}, {"goal", goal}, {"unit", "x"}, {"at_most", true}};
    if (defined_at && !same_shape(p, parse_problem(defined_at))) {
      std::printf("goal      %-52s %7.2fx (goal <= %.1fx, defined at %s)\n", what.c_str(), value, goal, defined_at);
      t["met"] = nullptr;
      t["defined_at"] = defined_at;
    } else {
      const bool met = value <= goal;
      std::printf("goal      %-52s %7.2fx (goal <= %.1fx)\n", what.c_str(), value, goal);
      t["met"] = met;
    }
    tj.push_back(t);
  };
  if (bwd.on) {
    target_max("simd attention backward over forward (time)", bwd.ratio, 3.0, kBackwardTargetShape);
    if (bwd.speedup > 0) target_line("simd attention backward: speedup over ref (scaled)", bwd.speedup, 20, "x");
    if (bwd.fwd_bytes > 0 && bwd.bwd_bytes >= 0)
      target_max("attention backward peak RSS growth over the forward's", bwd.bwd_bytes / bwd.fwd_bytes, 2.0);
  }
  if (do_commands) {
    target_max("command golden (simd, written) over run (simd)", golden_over_run, 1.3);
    target_max("command diff of an exact copy over golden", diff_over_golden, 1.0);
    target_max("run's input generation over run (simd)", inputs_over_run, 0.1, kInputsTargetShape);
  }
  j["targets"] = tj;
}

// Step: write the JSON (if asked), print __REPRO, and return the exit status (1 on a mismatch).
int Bench::finish() const {
  std::string repro = "indexshare bench --problem \"" + to_string(p) + "\" --impl " + a.impl + " --repeats " +
                      std::to_string(a.repeats) + " --threads " + std::to_string(threads) + " --target " + a.target +
                      " --stack-seq " + std::to_string(a.stack_seq) + " --stack-sq " + std::to_string(a.stack_sq) +
                      " --stack-topk " + std::to_string(a.stack_topk) + " --model " + a.model +
                      " --module-rows " + std::to_string(a.module_rows) + " --seconds " + fmt("%g", a.budget) +
                      " --commands " + a.commands + " --backward " + a.backward;
  if (!a.json_path.empty()) {
    io::write_text_file(a.json_path, j.dump(2) + "\n");
    repro += " --json " + a.json_path;
  }
  std::printf("__REPRO: %s\n", repro.c_str());
  return mismatches.empty() ? 0 : 1;
}

// The bench of the header comment, step by step.

}  // namespace indexshare::cli::bench
