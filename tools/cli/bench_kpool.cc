// indexshare bench --kpool SPEC: the GLM-5.3 KPool stage, alone (SPEC a kpool descriptor,
// tools/lib/golden_kpool.h), on simd.
//   The pooled indexer of the first DSA layer, part by part, each timed under the repeat rules
//   (cmd_bench.cc's header) on the layer's generated inputs:
//     pool     pool_logits (z = g + ape) and simd's pool_keys (the softmax-weighted pooled keys)
//     score    pool_scores: I = sum_h w_h ReLU(q_h . Kbar_p) / sqrt(D) over each row's visible
//              pools (the f32 indexer kernel); FLOPs 2 H D per (row, visible pool), against the
//              FMA peak at the same thread count (probed before and after, the larger kept)
//     select   select_tokens: the pool top-k (score descending, pool ascending), the expansion to
//              P tokens a pool and the tail
//   Then three commands, interleaved round by round (bench_v4.cc's interleave_commands):
//     run      ref::kpool::run_kpool_stack on simd: what `indexshare run --problem SPEC` computes
//     golden   golden::write_kpool on simd to a new folder (each layer written and hashed on two
//              threads while the next computes)
//     build    golden::emit_kpool on simd, each tensor dropped as it comes (golden without the write)
// Goals: score >= 70 % of the FMA peak; golden within 1.3x of run. ref = simd is not re-checked
// here (a ref build at GLM-5.3's shapes takes minutes): the kpool tests hold it on every target.
#include <omp.h>

#include <algorithm>
#include <cstdio>

#include "ref/error.h"
#include "ref/kpool/layer.h"
#include "ref/schedule.h"
#include "simd/simd.h"
#include "tools/cli/bench.h"
#include "tools/lib/golden_kpool.h"
#include "tools/lib/safetensors.h"
#include "tools/lib/svg.h"

namespace indexshare::cli::bench {

namespace {

struct Part {
  std::string name;
  std::vector<double> samples;
  double flops = 0;
};

// The pooled indexer's parts on the first DSA layer's inputs (that layer is Full: a schedule starts with F).
std::vector<Part> time_indexer_parts(const BenchArgs& a, const golden::KpoolSpec& spec, const ref::Kernels& kern) {
  const ref::kpool::KpoolConfig& c = spec.cfg;
  const ref::kpool::KpoolLayerInputs in = ref::kpool::make_kpool_layer_inputs(c, spec.dsa_layers().front(), true, kern);
  progress("kpool: pool, score and select on layer " + std::to_string(spec.dsa_layers().front()) + " (simd)");
  Tensor<float> kbar, scores;
  std::vector<Part> parts(3);
  parts[0] = {"pool", time_runs([&] { kbar = kern.kpool_pool_keys(in.k, ref::kpool::pool_logits(in.g, in.ape), c.rounding); },
                                a.repeats, a.budget), 0};
  parts[1] = {"score", time_runs([&] { scores = ref::kpool::pool_scores(in.q, kbar, in.weights, c.s_kv, c.pool, kern); },
                                 a.repeats, a.budget), 0};
  parts[2] = {"select", time_runs([&] { (void)ref::kpool::select_tokens(scores, c.s_kv, c.pool, c.index_topk, c.tail, kern); },
                                  a.repeats, a.budget), 0};
  const Tensor<int32_t> ke = ref::kpool::visible_pools(c.s_q, c.s_kv, c.pool);
  double visible = 0;
  for (int64_t t = 0; t < c.s_q; ++t) visible += double(ke[t]);
  parts[1].flops = 2.0 * double(c.heads) * double(c.dim) * visible;
  return parts;
}

}  // namespace

int bench_kpool(const BenchArgs& a) {
  const golden::KpoolSpec spec = golden::parse_kpool_spec(a.kpool);
  spec.cfg.validate();
  if (a.threads > 0) omp_set_num_threads(a.threads);
  if (a.target != "best") simd::set_target(a.target);
  const int threads = omp_get_max_threads();
  std::printf("kpool     %s\nschedule  %s over the DSA layers of %d\nmachine   %d OpenMP thread(s) for simd; simd target %s\n",
              golden::to_string(spec).c_str(), spec.pattern.c_str(), spec.n_layers, threads, simd::current_target().c_str());
  if (!a.json_path.empty()) io::check_output_path(a.json_path);
  const ref::Kernels kern = simd::kernels();
  const double peak0 = simd::fma_peak_gflops(threads);
  const std::vector<Part> parts = time_indexer_parts(a, spec, kern);
  const TempDir tmp{bench_temp_dir("kpool")};
  const std::string replay = golden::kpool_replay(spec, Impl::simd);
  const ref::kpool::KpoolStackSpec stack{spec.dsa(), schedule_from_pattern(spec.pattern)};
  progress("kpool: run, golden and golden's build, interleaved (simd)");
  const std::vector<CommandRun> cmds = interleave_commands(
      a,
      {{"run", [&] { (void)ref::kpool::run_kpool_stack(spec.cfg, stack, kern); }},
       {"golden", [&] { golden::write_kpool(tmp.dir, false, spec, replay, Impl::simd); }},
       {"build", [&] { (void)golden::emit_kpool(spec, replay, Impl::simd, nullptr, [](golden::Handed) {}); }}},
      tmp.dir);
  const double peak = std::max(peak0, simd::fma_peak_gflops(threads));
  std::printf("\n%-8s %10s %10s %8s %s\n", "part", "wall s", "GFLOP/s", "samples", "share of the FMA peak");
  for (const Part& p : parts) {
    const double t = median(p.samples), gf = p.flops > 0 ? p.flops / t / 1e9 : 0;
    std::printf("%-8s %10.4f %10s %8zu %s\n", p.name.c_str(), t, p.flops > 0 ? fmt("%.1f", gf).c_str() : "-", p.samples.size(),
                p.flops > 0 ? fmt("%.0f %%", 100 * gf / peak).c_str() : "");
  }
  std::printf("peak      %.1f GFLOP/s at %d thread(s) (simd::fma_peak_gflops, the larger of two probes)\n", peak, threads);
  std::printf("\n%-8s %10s %10s %8s\n", "command", "wall s", "CPU s", "samples");
  for (const CommandRun& c : cmds)
    std::printf("%-8s %10.3f %10.3f %8zu\n", c.name.c_str(), median(c.samples), median(c.cpu), c.samples.size());
  const double share = parts[1].flops / median(parts[1].samples) / 1e9 / peak;
  const double g_run = median(cmds[1].samples) / median(cmds[0].samples), g_run_cpu = median(cmds[1].cpu) / median(cmds[0].cpu);
  std::printf("goal      score / FMA peak   %6.0f %%  (goal >= 70 %%)\n", 100 * share);
  std::printf("goal      golden / run       %6.2fx wall, %6.2fx CPU (goal <= 1.3)\n", g_run, g_run_cpu);
  if (!a.json_path.empty()) {
    json j = {{"machine", machine_json()}, {"kpool", golden::to_string(spec)}, {"threads", threads}, {"target", simd::current_target()}, {"peak_gflops", peak},
              {"score_share", share}, {"golden_over_run", g_run}};
    for (const Part& p : parts) j["parts"][p.name] = {{"wall", p.samples}, {"flops", p.flops}};
    for (const CommandRun& c : cmds) j[c.name] = {{"wall", c.samples}, {"cpu", c.cpu}};
    io::write_text_file(a.json_path, j.dump(2) + "\n");
  }
  std::printf("__REPRO: indexshare bench --kpool \"%s\" --repeats %d\n", golden::to_string(spec).c_str(), a.repeats);
  return 0;
}

}  // namespace indexshare::cli::bench
