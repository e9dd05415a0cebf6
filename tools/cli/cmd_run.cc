// indexshare run: compute a DSA layer stack and print a summary.
//   --problem DESC    kernel-level stack from generated kernel inputs (ref/stack.h)
//   --model NAME      the toy module-level model with a preset's real shapes (ref/model.h)
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <set>
#include <string>

#include "ref/config.h"
#include "ref/error.h"
#include "ref/model.h"
#include "ref/problem.h"
#include "ref/stack.h"
#include "simd/simd.h"
#include "tools/cli/cli.h"

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

template <typename T>
uint64_t fingerprint(const std::vector<T>& v) {  // FNV-1a over the bytes: a summary, not a hash
  uint64_t h = 0xCBF29CE484222325ull;
  const auto* b = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(T); ++i) h = (h ^ b[i]) * 0x100000001B3ull;
  return h;
}

// Mean over rows of |A ∩ B| / |A| for two [rows, k] position tensors (valid entries only).
double recall(const Tensor<int32_t>& a, const Tensor<int32_t>& b) {
  if (a.numel() == 0 || b.numel() == 0) return std::nan("");
  const int64_t rows = a.dim(0), k = a.dim(1);
  double sum = 0;
  for (int64_t t = 0; t < rows; ++t) {
    std::set<int32_t> sa, sb;
    for (int64_t j = 0; j < k; ++j) {
      if (a.at(t, j) >= 0) sa.insert(a.at(t, j));
      if (b.at(t, j) >= 0) sb.insert(b.at(t, j));
    }
    int64_t common = 0;
    for (int32_t v : sa) common += sb.count(v);
    sum += sa.empty() ? 1.0 : double(common) / double(sa.size());
  }
  return sum / double(rows);
}

void print_layer(int l, bool full, int source, const Tensor<int32_t>& own, const Tensor<int32_t>& used,
                 const ref::AttentionOut& attn) {
  double ss = 0;
  for (float v : attn.out.data) ss += double(v) * v;
  const double rms = std::sqrt(ss / double(std::max<int64_t>(1, attn.out.numel())));
  std::printf("layer %3d %-6s source %3d  own-vs-used recall %-6s  out rms %.5f  fingerprint %016llx\n", l,
              full ? "full" : "shared", source,
              own.numel() ? (std::to_string(recall(own, used)).substr(0, 5)).c_str() : "-", rms,
              (unsigned long long)fingerprint(attn.out.data));
}

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
  const std::string impl = resolve_impl(a.impl, p, n_rows);
  reject_target_on_ref(a.given, impl);
  const bool streams = impl_streams(impl, p);
  const uint64_t max_bytes = parse_bytes(a.max_memory);
  check_memory(p, false, streams, max_bytes,
               "use " + logits_remedy(p, false, streams, max_bytes, n_rows, false, false) +
                   "--rows (fewer query rows), a smaller --problem (s_q, s_kv, nl)",
               n_rows);
  if (!a.rows_given) rows = ref::all_rows(p);
  apply_target(a.target);
  std::printf("problem   %s\nschedule  %s (%d full of %d)\nimpl      %s%s\n", to_string(p).c_str(), s.pattern().c_str(),
              s.n_full(), s.n_layers(), impl.c_str(), impl == "simd" ? (" (Highway target " + simd::current_target() + ")").c_str() : "");
  if (a.rows_given) std::printf("rows      %lld of %lld query rows: %s\n", (long long)n_rows, (long long)p.s_q, ref::format_rows(rows).c_str());
  auto t0 = std::chrono::steady_clock::now();
  const auto in = ref::make_stack_inputs(p, s, rows, impl == "simd" ? simd::kernels() : ref::Kernels{});
  const double t_gen = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  const auto out = impl == "simd" ? simd::run_stack(p, s, in, false) : ref::run_stack(p, s, in, false);
  const double t_run = seconds_since(t0);
  int64_t short_rows = 0;
  for (int64_t t = 0; t < n_rows; ++t) short_rows += in[0].ke[t] - in[0].ks[t] <= p.index_topk;
  std::printf("top-k     k=%lld; %lld of %lld rows are shorter than k (dense)\n", (long long)p.index_topk,
              (long long)short_rows, (long long)n_rows);
  for (const auto& o : out) print_layer(o.layer, o.kind == LayerKind::full, o.source, o.own_topk, o.used_topk, o.attn);
  std::printf("time      inputs %.3f s, stack %.3f s (impl %s)\n", t_gen, t_run, impl.c_str());
  std::printf("__REPRO: indexshare run --impl %s --problem \"%s\"%s\n", impl.c_str(), to_string(p).c_str(),
              a.rows_given ? (" --rows " + ref::format_rows(rows)).c_str() : "");
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
  const std::string impl = resolve_model_impl(a.impl, cfg, cfg.n_layers, cfg.seq);
  reject_target_on_ref(a.given, impl);
  const ref::ToyForward f = ref::forward(m, cache, ref::toy_hidden(cfg, uint64_t(a.seed), 0, cfg.seq),
                                         impl == "simd" ? simd::kernels() : ref::Kernels{});
  const double t_run = seconds_since(t0);
  for (int l = 0; l < s.n_layers(); ++l) {
    const auto& tr = f.layers[size_t(l)];
    print_layer(l, s.is_full(l), s.source(l), tr.own_topk, tr.used_topk, tr.attn);
  }
  std::printf("time      weights %.3f s, forward %.3f s (impl %s)\n", t_gen, t_run, impl.c_str());
  std::printf("__REPRO: indexshare run --model %s --impl %s --layers %d --seq %lld --seed %lld --sim %.9g --variant %s%s\n",
              a.model.c_str(), impl.c_str(), cfg.n_layers, (long long)cfg.seq, (long long)a.seed, double(a.sim), a.variant.c_str(),
              a.schedule.empty() ? "" : (" --schedule " + a.schedule).c_str());
  return 0;
}

int cmd_run(const RunArgs& a) {
  require(a.problem.empty() || a.model.empty(), "run: give --problem or --model, not both");
  require(a.model.empty() || !a.rows_given, "--rows: only with --problem (kernel-level stacks), not --model");
  check_overrides(a.given, a.layers, a.seq, a.seed);
  if (a.model.empty())
    reject_given(a.given, {"--seq", "--seed", "--sim", "--variant"}, "--model",
                 "a --problem descriptor sets skv, seed and the rest itself");
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
  return [c, a]() {
    a->given = given_options(*c);
    a->rows_given = was_given(a->given, "--rows");
    return *c ? cmd_run(*a) : -1;
  };
}

}  // namespace indexshare::cli
