// indexshare run: compute a DSA layer stack and print a summary.
//   --problem DESC    kernel-level stack from generated kernel inputs (ref/stack.h)
//   --model NAME      the toy module-level model with a preset's real shapes (ref/model.h)
//   --problem "t=... types=..."  a DeepSeek-V4 stack (tools/lib/golden_v4.h), as golden --kind v4 computes it
//   --problem "sq=... pool=..."  a GLM-5.3 KPool stack (tools/lib/golden_kpool.h), as golden --kind kpool computes it
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <span>
#include <string>

#include "ref/config.h"
#include "ref/error.h"
#include "ref/model.h"
#include "ref/problem.h"
#include "ref/stack.h"
#include "simd/simd.h"
#include "tools/cli/cli.h"
#include "tools/lib/golden_kpool.h"
#include "tools/lib/golden_v4.h"
#include "tools/lib/phases.h"
#include "tools/lib/run_report.h"
#ifdef INDEXSHARE_MPI
#include "tools/lib/distributed.h"
#endif

namespace indexshare::cli {

namespace {

// The problem `indexshare run` computes when neither --problem nor --model is given:
// DeepSeek-V3.2 kernel shapes for attention (d_qk 576, d_v 512) and the indexer (D 128), with
// fewer heads and a short sequence so that the readable reference path finishes in seconds; the
// sequence is longer than top-k, so the selection is really sparse; 4 layers in the GLM-5.2
// pattern F F F S so that index sharing shows.
constexpr const char* kDefaultProblem =
    "sq128 skv512 hq16 dqk576 dv512 ih32 id128 k64 seed1 nl4 sched=FFFS recency=0.25 sinks=4";

struct RunArgs {
  std::string problem, model, schedule, impl = "auto", variant = "deepseek_fp8", target, max_memory = "8G", rows;
  int64_t layers = 0, seq = 0, seed = 1;
  float sim = 0.8f;
  std::vector<std::string> given;  // the options on the command line
  bool rows_given = false;         // --rows among them
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The report's impl line: the name, and the Highway target on simd.
std::string impl_line(Impl impl) {
  return impl_name(impl) + (impl == Impl::simd ? " (Highway target " + simd::current_target() + ")" : "");
}

#ifdef INDEXSHARE_MPI
bool dist_active() { return dist::active(); }

// run on every MPI rank, each its block of rows (tools/lib/distributed.h); rank 0 folds the
// ranks' per-row recalls and outputs in row order and prints what one process prints, then a
// line per rank. --max-memory is per rank.
int run_ranks(const RunArgs& a, const Problem& p, const Schedule& s, const std::vector<int64_t>& rows,
              Impl impl, bool streams, uint64_t max_bytes) {
  int n_ix = 0;
  for (int l = 0; l < s.n_layers(); ++l) n_ix += s.is_full(l) || p.own;
  std::vector<int64_t> bounds;
  golden::RowPart part;
  dist::guarded([&] { part = dist::my_rows(dist::row_work(p, dist::causal_windows(p, rows), n_ix), &bounds); });
  const int64_t n_rows = int64_t(rows.size()), mine = part.end - part.begin;
  const bool root = dist::rank() == 0;
  if (root) {
    std::printf("problem   %s\nschedule  %s (%d full of %d)\nimpl      %s\n", to_string(p).c_str(), s.pattern().c_str(),
                s.n_full(), s.n_layers(), impl_line(impl).c_str());
    if (a.rows_given) std::printf("rows      %lld of %lld query rows: %s\n", (long long)n_rows, (long long)p.s_q, ref::format_rows(rows).c_str());
    std::fflush(stdout);
  }
  std::vector<ref::LayerInputs> in;
  std::vector<ref::StackLayerOutputs> out;
  double t_gen = 0, t_run = 0;
  dist::guarded([&] {
    check_memory(p, false, streams, max_bytes,
                 "use " + logits_remedy(p, false, streams, max_bytes, mine, false, false) +
                     "more ranks, --rows (fewer query rows), a smaller --problem (s_q, s_kv, nl)",
                 mine);
    auto t0 = std::chrono::steady_clock::now();
    phases::begin("inputs");
    in = ref::make_stack_inputs(p, s, std::vector<int64_t>(rows.begin() + part.begin, rows.begin() + part.end));
    t_gen = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    phases::begin("compute");
    out = ref::run_stack(p, s, in, false, kernels_for(impl));
    t_run = seconds_since(t0);
    dist::fault_point("compute");
  });
  int64_t short_rows = 0;
  for (int64_t t = 0; t < mine; ++t) short_rows += in[0].ke[t] - in[0].ks[t] <= p.index_topk;
  short_rows = dist::sum(short_rows);
  if (root)
    std::printf("top-k     k=%lld; %lld of %lld rows are shorter than k (dense)\n", (long long)p.index_topk,
                (long long)short_rows, (long long)n_rows);
  for (const auto& o : out) {
    run_report::LayerFold f;
    const bool has_own = o.own_topk.numel() > 0;
    if (has_own) {
      const std::vector<double> r = run_report::recall_rows(o.own_topk, o.used_topk);
      dist::fold_in_order({reinterpret_cast<const uint8_t*>(r.data()), r.size() * sizeof(double)}, [&](std::span<const uint8_t> b) {
        f.add_recalls({reinterpret_cast<const double*>(b.data()), b.size() / sizeof(double)});
      });
    }
    dist::fold_in_order({reinterpret_cast<const uint8_t*>(o.attn.out.data.data()), o.attn.out.data.size() * sizeof(float)},
                        [&](std::span<const uint8_t> b) { f.add_out({reinterpret_cast<const float*>(b.data()), b.size() / sizeof(float)}); });
    if (root) std::fputs(run_report::layer_line(o.layer, o.kind == LayerKind::full, o.source, has_own, f).c_str(), stdout);
  }
  phases::begin("report (folds to rank 0)");
  const std::string ranks = dist::rank_report(bounds, t_gen + t_run);
  const std::string timing = phases::requested() ? dist::timing_report() : "";
  if (!root) return 0;
  std::printf("time      inputs %.3f s, stack %.3f s (impl %s, rank 0 of %d)\n%s", t_gen, t_run, impl_name(impl).c_str(), dist::size(), (ranks + timing).c_str());
  std::printf("__REPRO: indexshare run --impl %s --problem \"%s\"%s\n", impl_name(impl).c_str(), to_string(p).c_str(),
              a.rows_given ? (" --rows " + ref::format_rows(rows)).c_str() : "");
  return 0;
}
#else
bool dist_active() { return false; }
#endif

int run_problem(const RunArgs& a) {
  Problem p = parse_problem(a.problem.empty() ? kDefaultProblem : a.problem);
  if (a.layers > 0) p.n_layers = a.layers;
  if (!a.schedule.empty()) p.sched = a.schedule;
  p.validate();
  const Schedule s = p.schedule();
  // --rows: only the chosen query rows (ref/layer.h); their outputs equal the full problem's rows.
  // The full list (s_q entries) is built only once the memory estimate has accepted the problem.
  std::vector<int64_t> rows = a.rows_given ? parse_rows(a.rows, p) : std::vector<int64_t>{};
  const int64_t n_rows = a.rows_given ? int64_t(rows.size()) : p.s_q;
  const Impl impl = resolve_impl(a.impl, p, n_rows);
  reject_target_on_ref(a.given, impl);
  const bool streams = impl_streams(impl, p);
  const uint64_t max_bytes = parse_bytes(a.max_memory);
  if (!dist_active())
    check_memory(p, false, streams, max_bytes,
                 "use " + logits_remedy(p, false, streams, max_bytes, n_rows, false, false) +
                     "--rows (fewer query rows), a smaller --problem (s_q, s_kv, nl)",
                 n_rows);
  if (!a.rows_given) rows = ref::all_rows(p);
  apply_target(a.target);
#ifdef INDEXSHARE_MPI
  if (dist::active()) return run_ranks(a, p, s, rows, impl, streams, max_bytes);
#endif
  std::printf("problem   %s\nschedule  %s (%d full of %d)\nimpl      %s\n", to_string(p).c_str(), s.pattern().c_str(),
              s.n_full(), s.n_layers(), impl_line(impl).c_str());
  if (a.rows_given) std::printf("rows      %lld of %lld query rows: %s\n", (long long)n_rows, (long long)p.s_q, ref::format_rows(rows).c_str());
  auto t0 = std::chrono::steady_clock::now();
  const ref::Kernels kern = kernels_for(impl);
  const auto in = ref::make_stack_inputs(p, s, rows, kern);
  const double t_gen = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  const auto out = ref::run_stack(p, s, in, false, kern);
  const double t_run = seconds_since(t0);
  int64_t short_rows = 0;
  for (int64_t t = 0; t < n_rows; ++t) short_rows += in[0].ke[t] - in[0].ks[t] <= p.index_topk;
  std::printf("top-k     k=%lld; %lld of %lld rows are shorter than k (dense)\n", (long long)p.index_topk,
              (long long)short_rows, (long long)n_rows);
  for (const auto& o : out) std::fputs(run_report::stack_layer_line(o).c_str(), stdout);
  std::printf("time      inputs %.3f s, stack %.3f s (impl %s)\n", t_gen, t_run, impl_name(impl).c_str());
  std::printf("__REPRO: indexshare run --impl %s --problem \"%s\"%s\n", impl_name(impl).c_str(), to_string(p).c_str(),
              a.rows_given ? (" --rows " + ref::format_rows(rows)).c_str() : "");
  return 0;
}

// The path of a descriptor kind's run (v4, kpool): --impl ref or simd, auto meaning simd; --target applied.
Impl descriptor_impl(const RunArgs& a) {
  const std::optional<Impl> named = a.impl == "auto" ? std::optional<Impl>(Impl::simd) : impl_named(a.impl);
  require(named.has_value(), "--impl must be ref, simd or auto, got '" + a.impl + "'");
  reject_target_on_ref(a.given, *named);
  apply_target(a.target);
  return *named;
}

// A DeepSeek-V4 stack (a --problem with types=, the v4 golden descriptor, tools/lib/golden_v4.h):
// each layer's inputs generated, then golden's computation (compute_v4_layer); one line per layer
// with the attention output's rms and fingerprint (attn.out_rotated: equal fingerprints, equal
// bytes), then the time of each part. --impl auto is simd.
int run_v4(const RunArgs& a) {
  const golden::V4Spec spec = golden::parse_v4_spec(a.problem);
  spec.cfg.validate();
  const ref::v4::Schedule sch = spec.schedule();
  const Impl impl = descriptor_impl(a);
  const ref::v4::Config& cfg = spec.cfg;
  std::printf("problem   %s\nschedule  %s (%d indexers over %zu layers)\nimpl      %s\n", golden::to_string(spec).c_str(),
              sch.pattern().c_str(), sch.indexers(), sch.types.size(), impl_line(impl).c_str());
  const ref::Kernels kern = kernels_for(impl);
  std::vector<Tensor<int32_t>> blocks(sch.types.size());
  double t_gen = 0, t_run = 0;
  for (size_t l = 0; l < sch.types.size(); ++l) {
    const ref::v4::LayerType t = sch.types[l];
    auto t0 = std::chrono::steady_clock::now();
    const ref::v4::LayerInputs in =
        ref::v4::make_layer_inputs(cfg, int(l), t, t == ref::v4::LayerType::csa && sch.full(l), kern);
    t_gen += seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    const golden::V4LayerResult r = golden::compute_v4_layer(cfg, sch, l, in, blocks, kern, false);
    t_run += seconds_since(t0);
    run_report::LayerFold f;
    f.add_out(std::span<const float>(r.rotated.data));
    const char* type = t == ref::v4::LayerType::sliding ? "SWA" : t == ref::v4::LayerType::csa ? "C4A" : "HCA";
    std::printf("layer %3zu %s %c source %3d  entries %6lld  out rms %.5f  fingerprint %016llx\n", l, type, sch.pattern()[l], sch.source[l],
                (long long)(r.entries.numel() ? r.entries.dim(0) : 0), std::sqrt(f.ss() / double(std::max<int64_t>(1, f.numel))),
                (unsigned long long)f.fp());
  }
  std::printf("time      inputs %.3f s, stack %.3f s (impl %s)\n", t_gen, t_run, impl_name(impl).c_str());
  std::printf("__REPRO: indexshare run --impl %s --problem \"%s\"\n", impl_name(impl).c_str(), golden::to_string(spec).c_str());
  return 0;
}

// A GLM-5.3 KPool stack (a --problem with pool=, the kpool golden descriptor, tools/lib/golden_kpool.h):
// ref::kpool::run_kpool_stack (every DSA layer's inputs generated, the pooled indexer and selection
// of Full layers, the attention over the union list); one line per DSA layer with the attention
// output's rms and fingerprint (attn.out: equal fingerprints, equal bytes). --impl auto is simd.
int run_kpool(const RunArgs& a) {
  const golden::KpoolSpec spec = golden::parse_kpool_spec(a.problem);
  spec.cfg.validate();
  const Impl impl = descriptor_impl(a);
  std::printf("problem   %s\nschedule  %s over the DSA layers of %d\nimpl      %s\n", golden::to_string(spec).c_str(),
              spec.pattern.c_str(), spec.n_layers, impl_line(impl).c_str());
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<ref::kpool::KpoolLayerOutputs> out =
      ref::kpool::run_kpool_stack(spec.cfg, {spec.dsa(), schedule_from_pattern(spec.pattern)}, kernels_for(impl));
  const double t_run = seconds_since(t0);
  for (const ref::kpool::KpoolLayerOutputs& o : out) {
    run_report::LayerFold f;
    f.add_out(std::span<const float>(o.attn.out.data));
    std::printf("layer %3d DSA %c source %3d  out rms %.5f  fingerprint %016llx\n", o.model_layer, o.full ? 'F' : 'S', o.source,
                std::sqrt(f.ss() / double(std::max<int64_t>(1, f.numel))), (unsigned long long)f.fp());
  }
  std::printf("time      stack %.3f s, inputs included (impl %s)\n", t_run, impl_name(impl).c_str());
  std::printf("__REPRO: indexshare run --impl %s --problem \"%s\"\n", impl_name(impl).c_str(), golden::to_string(spec).c_str());
  return 0;
}

int run_model(const RunArgs& a) {
  ModelConfig cfg = model_preset(a.model);
  if (a.layers > 0) cfg.n_layers = int(a.layers);
  if (a.seq > 0) cfg.seq = a.seq;
  const Schedule s = a.schedule.empty() ? cfg.resolve_schedule() : parse_schedule(a.schedule, cfg.n_layers);
  require(a.sim >= 0 && a.sim <= 1, "--sim must be in [0, 1]");
  const ref::IndexerVariant v = ref::parse_indexer_variant(a.variant);
  check_model_memory(cfg, parse_bytes(a.max_memory), false);
  std::printf("model     %s: %d layers, dim %lld, %lld heads, indexer %lldx%lld (%s rope), top-%lld, seq %lld\n",
              cfg.name.c_str(), cfg.n_layers, (long long)cfg.dim, (long long)cfg.n_heads, (long long)cfg.index_n_heads,
              (long long)cfg.index_head_dim, ref::rope_layout_name(cfg.indexer_rope).c_str(), (long long)cfg.index_topk,
              (long long)cfg.seq);
  std::printf("schedule  %s (%d full of %d)\n", s.pattern().c_str(), s.n_full(), s.n_layers());
  auto t0 = std::chrono::steady_clock::now();
  const ref::ToyModel m = ref::make_toy_model(cfg, s, uint64_t(a.seed), a.sim, v, true);
  const double t_gen = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  ref::ToyCache cache;
  const Impl impl = resolve_model_impl(a.impl, cfg, cfg.n_layers, cfg.seq);
  reject_target_on_ref(a.given, impl);
  const ref::ToyForward f = ref::forward(m, cache, ref::toy_hidden(cfg, uint64_t(a.seed), 0, cfg.seq),
                                         kernels_for(impl));
  const double t_run = seconds_since(t0);
  for (int l = 0; l < s.n_layers(); ++l) {
    const auto& tr = f.layers[size_t(l)];
    std::fputs(run_report::layer_line(l, s.is_full(l), s.source(l), tr.own_topk, tr.used_topk, tr.attn.out).c_str(), stdout);
  }
  std::printf("time      weights %.3f s, forward %.3f s (impl %s)\n", t_gen, t_run, impl_name(impl).c_str());
  std::printf("__REPRO: indexshare run --model %s --impl %s --layers %d --seq %lld --seed %lld --sim %s --variant %s%s\n",
              a.model.c_str(), impl_name(impl).c_str(), cfg.n_layers, (long long)cfg.seq, (long long)a.seed, float_text(a.sim).c_str(), a.variant.c_str(),
              a.schedule.empty() ? "" : (" --schedule " + a.schedule).c_str());
  return 0;
}

int cmd_run(const RunArgs& a) {
  require(a.problem.empty() || a.model.empty(), "run: give --problem or --model, not both");
  require(a.model.empty() || !a.rows_given, "--rows: only with --problem (kernel-level stacks), not --model");
  require(a.model.empty() || !dist_active(), "run --model (the toy model) runs in one process: run it without mpirun / srun");
  check_overrides(a.given, a.layers, a.seq, a.seed);
  if (a.problem.find("types=") != std::string::npos) {  // a DeepSeek-V4 descriptor
    reject_given(a.given, {"--layers", "--schedule", "--rows"}, "kernel-level (DSA) stacks",
                 "its descriptor sets the layer types (types=) and the C4A schedule (sched= or freq=)");
    require(!dist_active(), "run on a DeepSeek-V4 --problem runs in one process: run it without mpirun / srun");
    return run_v4(a);
  }
  if (a.model.empty() && a.problem.find("pool=") != std::string::npos) {  // a GLM-5.3 KPool descriptor
    reject_given(a.given, {"--layers", "--schedule", "--rows"}, "kernel-level (DSA) stacks",
                 "its descriptor sets the layers (nl=, dsa=) and the schedule over the DSA layers (sched=)");
    require(!dist_active(), "run on a KPool --problem runs in one process: run it without mpirun / srun");
    return run_kpool(a);
  }
  return a.model.empty() ? run_problem(a) : run_model(a);
}

}  // namespace

Action register_run(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* c = app.add_subcommand("run", "Compute a DSA layer stack (indexer, top-k, index sharing, sparse attention) and print a summary");
  c->add_option("--problem,-p", a->problem, std::string("Kernel-level problem descriptor (default \"") + kDefaultProblem + "\")");
  c->add_option("--model,-m", a->model, "Toy module-level model with a preset's shapes: deepseek-v3.2, glm-5, glm-5.2, tiny-deepseek, tiny-glm");
  c->add_option("--layers", a->layers, "Override the number of layers");
  c->add_option("--seq", a->seq, "Sequence length (--model)");
  c->add_option("--schedule", a->schedule, "Layer schedule: preset, F/S pattern, freq:N[,offset:M] or list:...");
  c->add_option("--seed", a->seed, "Seed (--model)")->capture_default_str();
  c->add_option("--sim", a->sim, "Cross-layer weight similarity in [0, 1] (--model)")->capture_default_str();
  c->add_option("--variant", a->variant, "Indexer: deepseek_fp8 or hf_bf16 (--model)")->capture_default_str();
  c->add_option("--impl", a->impl, "Implementation: ref, simd or auto (simd for large problems)")->capture_default_str();
  c->add_option("--target", a->target, "Highway target for simd: best, AVX3, AVX2, SSE4, ... (default best)");
  c->add_option("--rows", a->rows, "Only these query rows, e.g. 0,17,100-131,last:64,every:1024 (outputs equal the full problem's rows)");
  c->add_option("--max-memory", a->max_memory, "Refuse problems whose estimated memory exceeds this (e.g. 8G)")->capture_default_str();
  // A --problem descriptor sets skv, seed and the rest itself.
  for (const char* o : {"--seq", "--seed", "--sim", "--variant"}) needs(*c, o, "--model");
  return [c, a]() {
    a->given = given_options(*c);
    a->rows_given = was_given(a->given, "--rows");
    return *c ? cmd_run(*a) : -1;
  };
}

}  // namespace indexshare::cli
