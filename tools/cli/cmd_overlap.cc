// indexshare overlap / search: cross-layer top-k overlap statistics and the greedy IndexCache
// pattern search, on a golden set, a generated problem, or inputs dumped from a model; on a
// DeepSeek-V4 stack over its C4A layers' block indices (ref/v4/sharing.h).
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <span>
#include <memory>
#include <string>

#include "ref/error.h"
#include "ref/overlap.h"
#include "ref/stack.h"
#include "ref/hyv4/sharing.h"
#include "ref/kpool/sharing.h"
#include "ref/v4/sharing.h"
#include "tools/cli/cli.h"
#include "tools/lib/golden.h"
#include "tools/lib/golden_hyv4.h"
#include "tools/lib/golden_kpool.h"
#include "tools/lib/golden_v4.h"
#include "simd/simd.h"
#include "tools/lib/svg.h"
#ifdef INDEXSHARE_MPI
#include "tools/lib/distributed.h"
#endif

namespace indexshare::cli {

namespace {

struct Source {  // where the layers come from: exactly one of the three
  std::string golden, problem, from, from_problem;
  std::string impl = "auto";  // the kernels of the recomputations: ref, simd, auto
  std::string max_memory = "8G";  // --problem: refused above this estimate, before generating
  std::vector<std::string> given;  // the options on the command line
};

// --impl: the kernel table (the same bits either way); auto: simd for stacks whose indexer work
// exceeds about 2^28 multiply-accumulates (as run).
ref::Kernels kernels_for(const Source& s, const Problem& p) {
  return indexshare::kernels_for(resolve_impl(s.impl, p));
}

// search --problem: the options the search chooses itself are refused, not ignored.
void check_search_problem(const Problem& p) {
  require(p.sched == Problem{}.sched,
          "search: the problem's sched=" + p.sched + " is not read (the search starts from all-Full and chooses the "
          "Shared layers itself); leave sched= out");
  // own=yes is the default, so p.own false means own=no was written.
  require(p.own,
          "search: the problem's own=no is not read (the search evaluates every layer as Full and as "
          "Shared, so every layer carries its own indexer inputs); leave own= out");
}

golden::StackInputs load(const Source& s, bool all_indexers) {
  const int given = !s.golden.empty() + !s.problem.empty() + !s.from.empty();
  require(given == 1, "give exactly one of --golden, --problem and --from");
  if (!s.golden.empty()) return golden::stack_inputs_of(golden::read(s.golden));
  if (!s.from.empty()) return golden::load_dump(s.from, s.from_problem);
  Problem p = parse_problem(s.problem);
  if (all_indexers) check_search_problem(p);
  const bool streams = impl_streams(resolve_impl(s.impl, p), p);
  const uint64_t max_bytes = parse_bytes(s.max_memory);
  check_memory(p, false, streams, max_bytes,
               "use " + logits_remedy(p, false, streams, max_bytes, p.s_q, false, false) + "a smaller --problem (s_q, s_kv, nl)",
               p.s_q);
  return {p, ref::make_stack_inputs(p, p.schedule())};
}

std::string replay_source(const Source& s, const Problem& p) {
  if (!s.golden.empty()) return "--golden " + s.golden;
  if (!s.from.empty()) return "--from " + s.from + (s.from_problem.empty() ? "" : " --from-problem \"" + s.from_problem + "\"");
  return "--problem \"" + to_string(p) + "\"";
}

void add_source(CLI::App* c, Source& s) {
  c->add_option("--golden,-g", s.golden, help("overlap", "--golden"));
  c->add_option("--problem,-p", s.problem, help("overlap", "--problem"));
  c->add_option("--from", s.from, "Per-layer inputs dumped from a model (golden tensor names)");
  c->add_option("--from-problem", s.from_problem, "With --from: top-k, dv, sm and the schedule, e.g. \"k2048 dv512 sched=glm-5.2\"");
  c->add_option("--impl", s.impl, help("overlap", "--impl"))->capture_default_str();
  c->add_option("--max-memory", s.max_memory, "With --problem: refuse stacks whose estimated memory exceeds this (e.g. 8G)")
      ->capture_default_str();
  // The other sources carry their own problem; --max-memory estimates generated problems.
  needs(*c, "--from-problem", "--from");
  needs(*c, "--max-memory", "--problem");
}

// ---- DeepSeek-V4 stacks (ref/v4/sharing.h): overlap and search on the C4A layers' block indices.
// The golden set's manifest kind ("" when it cannot be read: golden::read reports what is wrong).
std::string set_kind(const std::string& dir) {
  std::ifstream f(dir + "/manifest.json");
  nlohmann::json m;
  try {
    f >> m;
  } catch (const std::exception&) {
    return "";
  }
  return m.is_object() ? m.value("kind", "") : "";
}

// A v4 golden set (manifest kind v4), a deepseek_v4 model dump, or a V4 descriptor (--problem with
// types=; every C4A layer generated with indexer inputs).
bool v4_source(const Source& s) {
  if (!s.golden.empty()) return set_kind(s.golden) == "v4";
  if (!s.from.empty()) return golden::is_v4_dump(s.from);
  return s.problem.find("types=") != std::string::npos;
}

// A kpool golden set, a glm5_next model dump, or a kpool descriptor (--problem with pool=; every DSA
// layer generated with indexer inputs, whatever its sched=).
bool kpool_source(const Source& s) {
  if (!s.golden.empty()) return set_kind(s.golden) == "kpool";
  if (!s.from.empty()) return golden::is_kpool_dump(s.from);
  return s.problem.find("pool=") != std::string::npos;
}

// The kernels of a descriptor kind's source (v4, kpool, hyv4): --impl ref or simd, auto meaning simd.
ref::Kernels kind_kernels(const Source& s) {
  const std::optional<Impl> impl = s.impl == "auto" ? std::optional<Impl>(Impl::simd) : impl_named(s.impl);
  require(impl.has_value(), "--impl must be ref, simd or auto, got '" + s.impl + "'");
  return indexshare::kernels_for(*impl);
}

golden::V4Dump v4_load(const Source& s) {
  const int given = !s.golden.empty() + !s.problem.empty() + !s.from.empty();
  require(given == 1, "give exactly one of --golden, --problem and --from");
  reject_given(s.given, {"--from-problem", "--max-memory"}, "DSA stacks", "a V4 source carries its V4 descriptor");
#ifdef INDEXSHARE_MPI
  require(!dist::active(), "overlap / search of a V4 stack run on one process: run it without mpirun / srun");
#endif
  if (!s.golden.empty()) return golden::v4_set_inputs(golden::read(s.golden));
  if (!s.from.empty()) return golden::load_v4_dump(s.from);
  golden::V4Dump d;
  d.spec = golden::parse_v4_spec(s.problem);
  const ref::v4::Schedule sch = d.spec.schedule();
  const ref::Kernels kern = kind_kernels(s);
  for (size_t l = 0; l < sch.types.size(); ++l)
    d.inputs.push_back(ref::v4::make_layer_inputs(d.spec.cfg, int(l), sch.types[l], sch.types[l] == ref::v4::LayerType::csa, kern));
  return d;
}

std::string v4_replay(const Source& s, const golden::V4Dump& d) {
  if (!s.golden.empty()) return "--golden " + s.golden;
  if (!s.from.empty()) return "--from " + s.from;
  return "--problem \"" + golden::to_string(d.spec) + "\"";
}

struct OverlapArgs {
  Source src;
  std::string json, csv, svg, svg_position;
  int buckets = 8;
  bool no_shared_stats = false;
};

// layers: a V4 (KPool) report's model layer of each C4A (DSA) rank, in the JSON under `layers_key`;
// else empty.
int emit_overlap(const OverlapArgs& a, const std::string& pattern, const std::string& replay, const ref::OverlapReport& r,
                 const std::vector<int>& layers = {}, const std::string& layers_key = "c4a_layers");

// A hyv4 golden set or a hy_v4 model dump (a hyv4 descriptor reads as a stack problem: write its
// set with golden --kind hyv4 first).
bool hyv4_source(const Source& s) {
  if (!s.golden.empty()) return set_kind(s.golden) == "hyv4";
  if (!s.from.empty()) return golden::is_hyv4_dump(s.from);
  return false;
}

// A HY V4 source's descriptor and every layer's inputs, and its replay option.
std::pair<golden::Hyv4Dump, std::string> hyv4_load(const Source& s) {
  reject_given(s.given, {"--from-problem", "--max-memory"}, "DSA stacks", "a HY V4 source carries its hyv4 descriptor");
#ifdef INDEXSHARE_MPI
  require(!dist::active(), "overlap / search of a HY V4 stack run on one process: run it without mpirun / srun");
#endif
  if (!s.golden.empty()) return {golden::hyv4_set_inputs(golden::read(s.golden)), "--golden " + s.golden};
  return {golden::load_hyv4_dump(s.from), "--from " + s.from};
}

// overlap of HY V4 layers' own top-k (ref/hyv4/sharing.h).
int overlap_hyv4(const OverlapArgs& a) {
  const ref::Kernels kern = kind_kernels(a.src);
  const auto [d, replay] = hyv4_load(a.src);
  const ref::OverlapReport r = ref::hyv4::hyv4_overlap_report(d.spec.cfg, ref::hyv4::own_topk(d.spec.cfg, d.inputs, kern),
                                                              d.spec.problem.schedule().pattern(), golden::to_string(d.spec), a.buckets);
  return emit_overlap(a, d.spec.problem.schedule().pattern(), replay, r);
}

// A KPool source's descriptor and DSA layers' inputs (a descriptor generates every layer's indexer
// inputs, whatever its sched=), and its replay option.
std::pair<golden::KpoolDump, std::string> kpool_load(const Source& s, const ref::Kernels& kern) {
  require(!s.golden.empty() + !s.problem.empty() + !s.from.empty() == 1, "give exactly one of --golden, --problem and --from");
  reject_given(s.given, {"--from-problem", "--max-memory"}, "DSA stacks", "a KPool source carries its kpool descriptor");
#ifdef INDEXSHARE_MPI
  require(!dist::active(), "overlap / search of a KPool stack run on one process: run it without mpirun / srun");
#endif
  if (!s.golden.empty()) return {golden::kpool_set_inputs(golden::read(s.golden)), "--golden " + s.golden};
  if (!s.from.empty()) return {golden::load_kpool_dump(s.from), "--from " + s.from};
  golden::KpoolDump d;
  d.spec = golden::parse_kpool_spec(s.problem);
  d.spec.cfg.validate();
  for (int l : d.spec.dsa_layers()) d.inputs.push_back(ref::kpool::make_kpool_layer_inputs(d.spec.cfg, l, true, kern));
  std::string replay = "--problem \"" + golden::to_string(d.spec) + "\"";
  return {std::move(d), std::move(replay)};
}

// overlap of GLM-5.3's pools over the DSA layers (ref/kpool/sharing.h); JSON "dsa_layers" maps the
// report's DSA ranks to model layers.
int overlap_kpool(const OverlapArgs& a) {
  const ref::Kernels kern = kind_kernels(a.src);
  const auto [d, replay] = kpool_load(a.src, kern);
  std::vector<int> dsa;
  const ref::OverlapReport r = golden::kpool_overlap(d, a.buckets, kern, dsa);
  return emit_overlap(a, "DSA " + d.spec.pattern, replay, r, dsa, "dsa_layers");
}

int overlap_v4(const OverlapArgs& a) {
  golden::V4Dump d = v4_load(a.src);
  std::vector<int> c4a_layers;
  const ref::OverlapReport r = golden::v4_overlap(d, a.buckets, kind_kernels(a.src), c4a_layers);
  return emit_overlap(a, "C4A " + golden::csa_pattern(d.spec.schedule()), v4_replay(a.src, d), r, c4a_layers);
}

#ifdef INDEXSHARE_MPI
// relative_error(got, ref) of the whole tensors, whose rows are spread over the ranks in blocks:
// rank 0 continues one process's sums over every rank's block in row order (ref::RelativeError),
// so the value has one process's bits; every rank gets it.
double ranks_relative_error(const Tensor<float>& got, const Tensor<float>& ref) {
  std::vector<float> both(got.data.begin(), got.data.end());  // a block: got's rows, then ref's
  both.insert(both.end(), ref.data.begin(), ref.data.end());
  ref::RelativeError e;
  std::vector<float> block;
  dist::fold_in_order({reinterpret_cast<const uint8_t*>(both.data()), both.size() * sizeof(float)},
                      [&](std::span<const uint8_t> b) {
                        block.resize(b.size() / sizeof(float));
                        if (!b.empty()) std::memcpy(block.data(), b.data(), b.size());
                        const int64_t n = int64_t(block.size() / 2);
                        e.add(block.data(), block.data() + n, n);
                      });
  return dist::from_rank0(dist::rank() == 0 ? e.value() : 0.0);
}

// Every rank's values, concatenated in rank (row) order on rank 0; empty on the other ranks.
std::vector<double> ranks_concat(const std::vector<double>& local) {
  std::vector<double> all;
  dist::fold_in_order({reinterpret_cast<const uint8_t*>(local.data()), local.size() * sizeof(double)},
                      [&](std::span<const uint8_t> b) {
                        const size_t at = all.size();
                        all.resize(at + b.size() / sizeof(double));
                        if (!b.empty()) std::memcpy(all.data() + at, b.data(), b.size());
                      });
  return all;
}

// overlap on every MPI rank (tools/lib/distributed.h): each rank computes its block of rows'
// own top-k (the indexer, the bulk of the work); rank 0 gathers every layer's top-k and the
// windows in row order and computes the report from them, the same as one process. The Shared
// layers' statistics: each rank computes its rows' values (the dense attention per row) and its
// rows of the layer's output over its own positions; rank 0 concatenates the values in row order
// (so every distribution is one process's) and continues the output error's sums block by block.
// Under MPI ranks: the source's problem, and each row's causal window (what the work split reads):
// a generated problem's from its descriptor (no inputs yet), a loaded source's from its ks / ke.
struct RankSource {
  golden::StackInputs si;
  std::vector<int64_t> windows;
  bool generated = false;
};
RankSource rank_source(const Source& src, bool all_indexers) {
  RankSource r;
  r.generated = !src.problem.empty();
  if (r.generated) {
    require(src.golden.empty() && src.from.empty(), "give exactly one of --golden, --problem and --from");
    r.si.problem = parse_problem(src.problem);
    r.windows = dist::causal_windows(r.si.problem, ref::all_rows(r.si.problem));
  } else {
    r.si = load(src, all_indexers);
    r.windows = dist::input_windows(r.si.inputs.at(0));
  }
  return r;
}

// This rank's block of rows of every layer's inputs: generated (after the per-rank memory check)
// or cut from the loaded inputs (moved out of `r`).
std::vector<ref::LayerInputs> rank_inputs(const Source& src, RankSource& r, const golden::RowPart& part) {
  const Problem& p = r.si.problem;
  if (!r.generated) {
    std::vector<ref::LayerInputs> in = std::move(r.si.inputs);
    for (ref::LayerInputs& li : in) golden::slice_rows(li, part.begin, part.end);
    return in;
  }
  const bool streams = impl_streams(resolve_impl(src.impl, p), p);
  const uint64_t max_bytes = parse_bytes(src.max_memory);
  check_memory(p, false, streams, max_bytes,
               "use " + logits_remedy(p, false, streams, max_bytes, part.end - part.begin, false, false) +
                   "more ranks, a smaller --problem (s_q, s_kv, nl)",
               part.end - part.begin);
  const std::vector<int64_t> all = ref::all_rows(p);
  return ref::make_stack_inputs(p, p.schedule(), std::vector<int64_t>(all.begin() + part.begin, all.begin() + part.end));
}

int overlap_ranks(const OverlapArgs& a) {
  RankSource rs = rank_source(a.src, false);
  const std::vector<int64_t>& windows = rs.windows;
  golden::StackInputs& si = rs.si;
  const Problem& p = si.problem;
  const Schedule sched = p.schedule();
  int n_ix = 0;
  for (int l = 0; l < sched.n_layers(); ++l) n_ix += sched.is_full(l) || p.own;
  std::vector<int64_t> bounds;
  golden::RowPart part;
  dist::guarded([&] { part = dist::my_rows(dist::row_work(p, windows, n_ix), &bounds); });
  const ref::Kernels kern = kernels_for(a.src, p);
  std::vector<ref::LayerInputs> in;
  std::vector<ref::StackLayerOutputs> outs;
  dist::guarded([&] {
    in = rank_inputs(a.src, rs, part);
    outs = ref::run_stack(p, sched, in, false, kern);
    dist::fault_point("compute");
  });
  // Rank 0: every layer's own top-k and the windows, whole, in row order.
  auto gather = [&](const Tensor<int32_t>& t, Shape whole) {
    Tensor<int32_t> full;
    if (dist::rank() == 0) full = Tensor<int32_t>(whole);
    size_t at = 0;
    dist::fold_in_order({reinterpret_cast<const uint8_t*>(t.data.data()), t.data.size() * sizeof(int32_t)},
                        [&](std::span<const uint8_t> b) {
                          std::memcpy(full.data.data() + at, b.data(), b.size());
                          at += b.size() / sizeof(int32_t);
                        });
    return full;
  };
  const int64_t s_q = int64_t(windows.size());
  const Tensor<int32_t> ks = gather(in[0].ks, {s_q}), ke = gather(in[0].ke, {s_q});
  std::vector<ref::LayerInputs> in_all(outs.size());
  std::vector<ref::StackLayerOutputs> out_all(outs.size());
  for (size_t l = 0; l < outs.size(); ++l) {
    in_all[l].has_indexer = in[l].has_indexer;
    in_all[l].ks = ks;
    in_all[l].ke = ke;
    out_all[l].layer = outs[l].layer;
    out_all[l].kind = outs[l].kind;
    out_all[l].source = outs[l].source;
    if (outs[l].own_topk.numel()) out_all[l].own_topk = gather(outs[l].own_topk, {s_q, p.index_topk});
  }
  // The Shared layers' statistics, in layer order (as overlap_report), each rank its rows.
  std::vector<ref::SharedLayerStats> shared;
  for (size_t l = 0; l < outs.size() && !a.no_shared_stats; ++l) {
    const ref::StackLayerOutputs& o = outs[l];
    if (o.kind != LayerKind::shared || o.own_topk.numel() == 0) continue;
    ref::SharedLayerRows rows;
    dist::guarded([&] { rows = ref::shared_layer_rows(p, in[l], o, kern); });
    const double err = ranks_relative_error(o.attn.out, rows.own_out);
    ref::SharedLayerRows all;
    all.trivial_rows = dist::sum(rows.trivial_rows);
    all.recall = ranks_concat(rows.recall);
    all.mass_used = ranks_concat(rows.mass_used);
    all.mass_own = ranks_concat(rows.mass_own);
    all.mass_recall = ranks_concat(rows.mass_recall);
    shared.push_back(ref::shared_layer_stats(int(l), o.source, s_q, std::move(all), err));
  }
  if (dist::rank() != 0) return 0;
  ref::OverlapOptions opt;
  opt.kernels = kern;
  opt.n_buckets = a.buckets;
  opt.shared_stats = false;
  ref::OverlapReport r = ref::overlap_report(p, in_all, out_all, opt);
  r.shared = std::move(shared);
  return emit_overlap(a, p.sched, replay_source(a.src, p), r);
}
#endif

int cmd_overlap(const OverlapArgs& a) {
  if (v4_source(a.src)) return overlap_v4(a);
  if (kpool_source(a.src)) return overlap_kpool(a);
  if (hyv4_source(a.src)) return overlap_hyv4(a);
#ifdef INDEXSHARE_MPI
  if (dist::active()) return overlap_ranks(a);
#endif
  const golden::StackInputs si = load(a.src, false);
  const Problem& p = si.problem;
  ref::OverlapOptions opt;
  opt.kernels = kernels_for(a.src, p);
  const auto outs = ref::run_stack(p, p.schedule(), si.inputs, false, opt.kernels);
  opt.n_buckets = a.buckets;
  opt.shared_stats = !a.no_shared_stats;
  return emit_overlap(a, p.sched, replay_source(a.src, p), ref::overlap_report(p, si.inputs, outs, opt));
}

int emit_overlap(const OverlapArgs& a, const std::string& pattern, const std::string& replay, const ref::OverlapReport& r,
                 const std::vector<int>& layers, const std::string& layers_key) {
  std::printf("%s", io::overlap_table(r).c_str());
  std::vector<std::pair<std::string, std::string>> files;  // written together: all or none
  if (!a.json.empty()) {
    nlohmann::json j = io::overlap_to_json(r);
    if (!layers.empty()) j[layers_key] = layers;  // the report's layers are C4A / DSA ranks
    files.emplace_back(a.json, j.dump(2) + "\n");
  }
  if (!a.csv.empty()) files.emplace_back(a.csv, io::overlap_csv(r));
  if (!a.svg.empty()) files.emplace_back(a.svg, io::overlap_heatmap_svg(r, {"Top-k overlap between layers: " + pattern, false, 0, 1}));
  if (!a.svg_position.empty())
    files.emplace_back(a.svg_position, io::overlap_by_position_svg(r, "Adjacent-layer overlap by query position"));
  io::write_text_files(files);
  std::printf("__REPRO: indexshare overlap %s\n", replay.c_str());
  return 0;
}

struct SearchArgs {
  Source src;
  int full_layers = 1;
  std::string loss = "output", json, csv, svg;
};

void require_indexers(const std::vector<ref::LayerInputs>& in) {
  for (size_t l = 0; l < in.size(); ++l)
    require(in[l].has_indexer, "search: layer " + std::to_string(l) +
                                   " has no indexer inputs; every layer needs its own (golden sets made with own=yes; "
                                   "a model dump of every layer Full: a model whose Shared layers have no indexer, "
                                   "like GLM-5's, cannot be searched)");
}

// layers, layers_key: as emit_overlap's (the model layer of each searched C4A / DSA rank).
int emit_search(const SearchArgs& a, const std::string& replay, const ref::SearchResult& r, const std::vector<int>& layers = {},
                const std::string& layers_key = "c4a_layers");

int search_hyv4(const SearchArgs& a) {
  ref::SearchOptions opt;
  opt.n_full = a.full_layers;
  opt.loss = ref::parse_search_loss(a.loss);
  opt.kernels = kind_kernels(a.src);
  const auto [d, replay] = hyv4_load(a.src);
  const std::vector<Tensor<int32_t>> own = ref::hyv4::own_topk(d.spec.cfg, d.inputs, opt.kernels);
  return emit_search(a, replay, ref::hyv4::hyv4_search(d.spec.cfg, d.inputs, own, golden::to_string(d.spec), opt));
}

int search_kpool(const SearchArgs& a) {
  ref::SearchOptions opt;
  opt.n_full = a.full_layers;
  opt.loss = ref::parse_search_loss(a.loss);
  opt.kernels = kind_kernels(a.src);
  const auto [d, replay] = kpool_load(a.src, opt.kernels);
  const ref::kpool::PoolLayers p = ref::kpool::pool_layers(d.spec.cfg, d.spec.dsa_layers(), d.inputs, opt.kernels);
  return emit_search(a, replay, ref::kpool::pool_search(d.spec.cfg, d.inputs, p, golden::to_string(d.spec), opt), p.layer, "dsa_layers");
}

int search_v4(const SearchArgs& a) {
  golden::V4Dump d = v4_load(a.src);
  ref::SearchOptions opt;
  opt.n_full = a.full_layers;
  opt.loss = ref::parse_search_loss(a.loss);
  opt.kernels = kind_kernels(a.src);
  const ref::v4::BlockLayers b = ref::v4::block_layers(d.spec.cfg, d.spec.schedule().types, d.inputs, opt.kernels);
  return emit_search(a, v4_replay(a.src, d), ref::v4::block_search(d.spec.cfg, d.inputs, b, golden::to_string(d.spec), opt), b.layer);
}

#ifdef INDEXSHARE_MPI
// The search's evaluator on one rank: it holds the rank's block of rows (each layer's own top-k
// and, for the output loss, its all-Full attention output over them), and every cost c(l, j) is
// combined on rank 0 from every rank's block in row order (fold_in_order), with the sums of one
// process, then sent to every rank. Every rank runs the same greedy search on the same costs, so
// the costs are asked for in the same order everywhere (each one a collective step).
class RanksEvaluator : public ref::ScheduleEvaluator {
 public:
  using ScheduleEvaluator::ScheduleEvaluator;

 protected:
  double output_cost(const Tensor<float>& got, const Tensor<float>& own) override {
    dist::fault_point("cost");
    return ranks_relative_error(got, own);
  }
  double row_mean_cost(const std::vector<double>& terms) override {
    dist::fault_point("cost");
    double sum = 0.0;  // in row order, as one process
    int64_t rows = 0;
    dist::fold_in_order({reinterpret_cast<const uint8_t*>(terms.data()), terms.size() * sizeof(double)},
                        [&](std::span<const uint8_t> b) {
                          for (size_t i = 0; i < b.size() / sizeof(double); ++i) {
                            double v;
                            std::memcpy(&v, b.data() + i * sizeof(double), sizeof v);
                            sum += v;
                            ++rows;
                          }
                        });
    return dist::from_rank0(rows ? sum / double(rows) : 0.0);
  }
};

// search on every MPI rank: each rank computes its block of rows (every layer's own top-k, the
// bulk of the work, and each cost's per-row part); rank 0 combines the costs in row order and
// prints the report, the same as one process.
int search_ranks(const SearchArgs& a) {
  RankSource rs = rank_source(a.src, true);
  if (rs.generated)
    check_search_problem(rs.si.problem);
  else
    require_indexers(rs.si.inputs);
  const std::vector<int64_t>& windows = rs.windows;
  golden::StackInputs& si = rs.si;
  const Problem& p = si.problem;
  ref::SearchOptions opt;
  opt.n_full = a.full_layers;
  opt.loss = ref::parse_search_loss(a.loss);
  opt.kernels = kernels_for(a.src, p);
  golden::RowPart part;
  dist::guarded([&] { part = dist::my_rows(dist::row_work(p, windows, int(p.n_layers))); });
  std::vector<ref::LayerInputs> in;
  std::unique_ptr<RanksEvaluator> ev;
  dist::guarded([&] {
    in = rank_inputs(a.src, rs, part);
    ev = std::make_unique<RanksEvaluator>(p, in, opt.loss, opt.kernels);
    dist::fault_point("compute");
  });
  // The cost steps end in no collective check: a rank that fails in one (out of memory, say) ends
  // the whole job (MPI_Abort), rather than leaving the other ranks waiting for its block.
  ref::SearchResult r;
  try {
    r = ref::greedy_search(p, *ev, opt);
  } catch (const std::exception& e) {
    dist::abort_job(e.what());
  }
  return dist::rank() == 0 ? emit_search(a, replay_source(a.src, p), r) : 0;
}
#endif

int cmd_search(const SearchArgs& a) {
  if (v4_source(a.src)) return search_v4(a);
  if (kpool_source(a.src)) return search_kpool(a);
  if (hyv4_source(a.src)) return search_hyv4(a);
#ifdef INDEXSHARE_MPI
  if (dist::active()) return search_ranks(a);
#endif
  const golden::StackInputs si = load(a.src, true);
  require_indexers(si.inputs);
  ref::SearchOptions opt;
  opt.n_full = a.full_layers;
  opt.loss = ref::parse_search_loss(a.loss);
  opt.kernels = kernels_for(a.src, si.problem);
  return emit_search(a, replay_source(a.src, si.problem), ref::greedy_search(si.problem, si.inputs, opt));
}

int emit_search(const SearchArgs& a, const std::string& replay, const ref::SearchResult& r, const std::vector<int>& layers,
                const std::string& layers_key) {
  std::printf("%s", io::search_table(r).c_str());
  std::vector<std::pair<std::string, std::string>> files;  // written together: all or none
  if (!a.json.empty()) {
    nlohmann::json j = io::search_to_json(r);
    if (!layers.empty()) j[layers_key] = layers;
    files.emplace_back(a.json, j.dump(2) + "\n");
  }
  if (!a.csv.empty()) files.emplace_back(a.csv, io::search_csv(r));
  if (!a.svg.empty()) files.emplace_back(a.svg, io::search_loss_svg(r, "Greedy search: " + a.loss + " loss"));
  io::write_text_files(files);
  std::printf("__REPRO: indexshare search %s --full-layers %d --loss %s\n", replay.c_str(),
              a.full_layers, a.loss.c_str());
  return 0;
}

}  // namespace

Action register_overlap(CLI::App& app) {
  auto a = std::make_shared<OverlapArgs>();
  CLI::App* c = app.add_subcommand("overlap", "Cross-layer top-k overlap statistics (table, JSON, CSV, SVG heatmap)");
  add_source(c, a->src);
  c->add_option("--json", a->json, "Write the statistics as JSON");
  c->add_option("--csv", a->csv, "Write the statistics as CSV");
  c->add_option("--svg", a->svg, "Write the layers x layers overlap heatmap (SVG)");
  c->add_option("--svg-position", a->svg_position, "Write overlap vs query position (SVG)");
  c->add_option("--buckets", a->buckets, help("overlap", "--buckets"))->capture_default_str();
  c->add_flag("--no-shared-stats", a->no_shared_stats, help("overlap", "--no-shared-stats"));
  return [c, a]() {
    a->src.given = given_options(*c);
    return *c ? cmd_overlap(*a) : -1;
  };
}

Action register_search(CLI::App& app) {
  auto a = std::make_shared<SearchArgs>();
  CLI::App* c = app.add_subcommand("search", "Training-free greedy Full/Shared pattern search (IndexCache)");
  add_source(c, a->src);
  c->add_option("--full-layers,-n", a->full_layers, "Stop at this many Full layers")->capture_default_str();
  c->add_option("--loss", a->loss, "Proxy loss: output, mass or kl")->capture_default_str();
  c->add_option("--json", a->json, "Write the search as JSON");
  c->add_option("--csv", a->csv, "Write the loss per step as CSV");
  c->add_option("--svg", a->svg, "Write the loss curve (SVG)");
  return [c, a]() {
    a->src.given = given_options(*c);
    return *c ? cmd_search(*a) : -1;
  };
}

}  // namespace indexshare::cli
