// indexshare golden / presets / verify: write, list and check golden sets.
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "ref/bounds.h"
#include "ref/error.h"
#include "ref/layer.h"
#include "ref/problem.h"
#include "tools/cli/cli.h"
#include "tools/lib/golden.h"
#include "tools/lib/golden_kpool.h"
#include "tools/lib/golden_model1.h"
#include "tools/lib/golden_train.h"
#include "tools/lib/golden_hyv4.h"
#include "tools/lib/golden_mtp.h"
#include "tools/lib/golden_v4.h"
#include "tools/lib/kernel_registry.h"
#include "tools/lib/phases.h"
#ifdef INDEXSHARE_MPI
#include "tools/lib/distributed.h"
#endif

namespace indexshare::cli {

namespace {

struct GoldenArgs {
  std::string preset, problem, kind = "stack", out, impl = "ref", model, from, schedule, variant = "deepseek_fp8", target,
      max_memory = "8G", rows, for_kernel;
  // --kind train (tools/lib/golden_train.h)
  std::string loss = "sparse", train_target = "own-layer", kl_form = "kl-of-mean", relu = "yes", train_edges = "no", loss_layers, d_out;
  double loss_coeff = 1.0;
  int64_t layers = 0, seq = 0;
  int64_t seed = -1;
  float sim = 0.8f;
  bool no_logits = false, force = false;
  std::vector<std::string> given;  // the options on the command line
  bool rows_given = false;         // --rows among them
};

#ifdef INDEXSHARE_MPI
bool dist_active() { return dist::active(); }
int dist_rank() { return dist::rank(); }
#else
bool dist_active() { return false; }
int dist_rank() { return 0; }
#endif

// The summary of a set just written, from the manifest written: reading the set back would hold
// it in memory a second time and hash it again (`golden verify` does that on request).
int report(const nlohmann::json& manifest, const GoldenArgs& a, const std::string& replay, std::chrono::steady_clock::time_point t0) {
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s", golden::summary(a.out, manifest, false).c_str());
  if (phases::requested()) std::printf("%s", phases::table().c_str());
  std::printf("time      %.2f s\n__REPRO: %s\n", secs, replay.c_str());
  return 0;
}

int publish(golden::GoldenSet set, const GoldenArgs& a, const std::string& replay,
            std::chrono::steady_clock::time_point t0) {
  return report(golden::write(a.out, std::move(set), a.force), a, replay, t0);
}

#ifdef INDEXSHARE_MPI
// The set computed by every MPI rank, each its block of rows (tools/lib/distributed.h): `windows`
// (each row's causal window) decides the blocks; check_memory refuses a rank's block before it is
// computed (--max-memory is per rank); make builds the rank's part. Rank 0 prints.
int publish_ranks(const GoldenArgs& a, const Problem& p, const std::string& replay, const std::vector<int64_t>& windows,
                  int indexer_layers, const std::function<void(const golden::RowPart&)>& check_memory,
                  const std::function<golden::GoldenSet(const golden::RowPart&)>& make,
                  std::chrono::steady_clock::time_point t0) {
  std::vector<int64_t> bounds;
  golden::RowPart part;
  dist::guarded([&] { part = dist::my_rows(dist::row_work(p, windows, indexer_layers, int64_t(windows.size()) <= cmp::kBudgetAllRows), &bounds); });
  if (dist::rank() == 0)
    std::fprintf(stderr, "golden: %d MPI ranks, %lld query rows split by causal work\n", dist::size(), (long long)windows.size());
  golden::GoldenSet set;
  const auto tc = std::chrono::steady_clock::now();
  dist::guarded([&] {
    check_memory(part);
    set = make(part);
    dist::fault_point("compute");
  });
  const double compute_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - tc).count();
  dist::WriteStats ws;
  const nlohmann::json manifest = dist::write_golden(a.out, std::move(set), a.force, &ws);
  const std::string ranks = dist::rank_report(bounds, compute_s);
  const std::string timing = phases::requested() ? dist::timing_report() : "";
  if (dist::rank() != 0) return 0;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s", golden::summary(a.out, manifest, false).c_str());
  std::printf("%s%s", ranks.c_str(), timing.c_str());
  std::printf("write     MPI-IO %.2f s, SHA-256 of the written file %.2f s (rank 0)\n", ws.write_s, ws.hash_s);
  std::printf("time      %.2f s on %d ranks\n__REPRO: %s\n", secs, dist::size(), replay.c_str());
  return 0;
}
#endif

// decode-model1 (tools/lib/golden_model1.h): a model1 spec (--problem "model1 ...", or the preset
// flashmla-sparse-decode-model1), optionally --for flashmla-sparse-decode-model1.
bool is_model1_request(const GoldenArgs& a) {
  if (!a.preset.empty()) return golden::preset(a.preset).kind == "decode-model1";
  return golden::is_model1_spec(a.problem) || a.kind == "decode-model1" ||
         (!a.for_kernel.empty() && kreg::kernel(a.for_kernel).kind == "decode-model1");
}

int golden_model1(const GoldenArgs& a, std::chrono::steady_clock::time_point t0) {
  reject_given(a.given, {"--layers", "--seq", "--rows", "--no-logits"}, "--problem DESCRIPTOR",
               "a decode-model1 set takes its sizes from its model1 spec");
  require(!was_given(a.given, "--kind") || a.kind == "decode-model1",
          "golden: a model1 spec builds a decode-model1 set, not --kind " + a.kind);
  require(!dist_active(), "golden: a decode-model1 set is computed by one process: run it without mpirun / srun");
  std::string text = a.problem, for_kernel = a.for_kernel;
  if (!a.preset.empty()) {
    const golden::Preset& pr = golden::preset(a.preset);
    text = pr.problem;
    require(for_kernel.empty() || for_kernel == pr.kernel, "golden: preset '" + pr.name + "' is written for " + pr.kernel);
    for_kernel = pr.kernel;
  }
  require(golden::is_model1_spec(text), "golden: a decode-model1 set needs a model1 spec (--problem \"model1 b2 nextn2 hq64 ...\"), got '" +
                                            text + "'");
  golden::Model1DecodeSpec spec = golden::parse_model1_spec(text);
  if (a.seed >= 0) spec.seed = uint64_t(a.seed);
  const kreg::Kernel* kern = for_kernel.empty() ? nullptr : &kreg::kernel(for_kernel);
  if (kern) {
    require(kern->kind == "decode-model1", "golden --for " + kern->name + ": a model1 spec builds a decode-model1 set, not " + kern->kind);
    std::string msg;
    for (const std::string& b : golden::model1_violations(spec)) msg += (msg.empty() ? "" : "; ") + b;
    require(msg.empty(), "golden --for: " + msg);
  }
  const Impl impl = was_given(a.given, "--impl") ? choose_impl(a.impl, true) : Impl::simd;
  const std::string replay = golden::model1_replay(spec, kern ? kern->name : "", impl) + " --out " + a.out;
  std::fprintf(stderr, "golden: computing %s...\n", golden::to_string(spec).c_str());
  golden::GoldenSet set = golden::build_model1_decode(spec, replay, impl);
  if (kern) golden::for_kernel_model1(set, *kern, spec);
  return publish(std::move(set), a, replay, t0);
}

// A training set: a kernel-level problem with the bf16 indexer, its forward and backward; --problem
// or a train preset (written for its kernel), optionally --for a training kernel
// (golden::check_train_kernel: the constraints, refused before computing).
int golden_train(const GoldenArgs& a, std::chrono::steady_clock::time_point t0) {
  require(a.preset.empty() != a.problem.empty() && a.model.empty() && a.from.empty(),
          "golden --kind train: give --problem (a kernel-level problem with indexer=bf16) or a train --preset");
  reject_given(a.given, {"--rows", "--no-logits", "--layers", "--seq", "--seed"}, "stack sets",
               "a train set takes its sizes and seed from --problem and holds the whole stack with its logits");
  require(!dist_active(), "golden: a train set is computed by one process: run it without mpirun / srun");
  require(a.loss == "sparse" || a.loss == "dense", "golden: --loss must be sparse or dense, got '" + a.loss + "'");
  require(a.relu == "yes" || a.relu == "no", "golden: --relu must be yes or no, got '" + a.relu + "'");
  std::string text = a.problem, for_kernel = a.for_kernel;
  if (!a.preset.empty()) {
    const golden::Preset& pr = golden::preset(a.preset);
    require(pr.kind == "train", "golden: preset '" + pr.name + "' is a " + pr.kind + " set, not a train set");
    require(for_kernel.empty() || pr.kernel.empty() || for_kernel == pr.kernel,
            "golden: preset '" + pr.name + "' is written for " + pr.kernel + ", not --for " + for_kernel);
    text = pr.problem;
    if (for_kernel.empty()) for_kernel = pr.kernel;
  }
  const Problem p = parse_problem(text);
  golden::TrainSpec t;
  t.sparse = a.loss == "sparse";
  t.target = a.train_target;
  require(a.kl_form == "kl-of-mean" || a.kl_form == "mean-of-kl",
          "golden: --kl-form must be kl-of-mean or mean-of-kl, got '" + a.kl_form + "'");
  require(a.kl_form == "kl-of-mean" || a.train_target == "served-layers",
          "golden: --kl-form mean-of-kl needs --train-target served-layers (with one teacher the two forms are one number)");
  t.kl_form = a.kl_form;
  t.relu = a.relu == "yes";
  t.loss_coeff = a.loss_coeff;
  require(a.train_edges == "yes" || a.train_edges == "no", "golden: --train-edges must be yes or no, got '" + a.train_edges + "'");
  t.edges = a.train_edges == "yes";
  if (was_given(a.given, "--loss-layers")) t.loss_layers = golden::parse_loss_layers(a.loss_layers);
  t.d_out_file = a.d_out;
  const kreg::Kernel* kern = for_kernel.empty() ? nullptr : &golden::check_train_kernel(for_kernel, p, t);
  const Impl impl = !a.preset.empty() && !was_given(a.given, "--impl") ? Impl::simd : resolve_impl(a.impl, p, p.s_q);
  reject_target_on_ref(a.given, impl);
  const std::string replay = "indexshare golden --problem \"" + to_string(p) + "\" --kind train" + golden::train_options_text(t) +
                             (kern ? " --for " + kern->name : "") + (impl == Impl::ref ? "" : " --impl " + impl_name(impl)) +
                             " --out " + a.out;
  std::fprintf(stderr, "golden: computing %s (%lld layers, forward and backward)...\n", to_string(p).c_str(), (long long)p.n_layers);
  golden::GoldenSet set = golden::build_train(p, t, replay, impl);
  if (kern) golden::for_train_kernel(set, *kern, p, t);
  return publish(std::move(set), a, replay, t0);
}

// A set of a kind that takes everything from its descriptor (v4, mtp, hyv4, kpool): how the kind is
// named in the messages, and whether --impl defaults to simd (v4: the same bytes, simd/ being
// bit-identical to ref/, in seconds at V4-Flash's shapes) or to ref like the other kinds.
struct DescriptorKind {
  std::string kind, a_kind;  // "v4", "a v4"
  std::string form;          // how --problem is written, for the message when neither or both are given
  std::string takes;         // "its sizes, ..." (why the options of other kinds are refused)
  bool simd_default;
};

// The one path of the descriptor kinds: --problem SPEC or a preset of the kind (never --model /
// --from), no option of another kind, one process; the spec is parsed (and refused, naming the
// field) before anything is computed or written. parse(text) -> Spec, replay_of(spec, impl) -> the
// command line, build(spec, replay, impl) -> the set.
template <class Parse, class Replay, class Build>
int golden_descriptor(const GoldenArgs& a, std::chrono::steady_clock::time_point t0, const DescriptorKind& k, Parse parse,
                      Replay replay_of, Build build) {
  require(a.preset.empty() != a.problem.empty() && a.model.empty() && a.from.empty(),
          "golden --kind " + k.kind + ": give " + k.form + " or " + k.a_kind + " --preset, not --model / --from");
  reject_given(a.given, {"--rows", "--for", "--no-logits", "--layers", "--seq", "--seed", "--schedule", "--sim", "--variant",
                         "--loss", "--train-target", "--kl-form", "--relu", "--loss-coeff", "--train-edges", "--loss-layers", "--d-out"},
               "other kinds", k.a_kind + " set takes " + k.takes + " from its descriptor");
  require(!dist_active(), "golden: " + k.a_kind + " set is computed by one process: run it without mpirun / srun");
  const auto s = parse(a.preset.empty() ? a.problem : golden::preset(a.preset).problem);
  const std::optional<Impl> impl = k.simd_default && (a.impl == "auto" || !was_given(a.given, "--impl"))
                                       ? std::optional<Impl>(Impl::simd)
                                       : impl_named(a.impl);
  require(impl.has_value(),
          "golden: --impl must be " + std::string(k.simd_default ? "ref, simd or auto" : "ref or simd") + ", got '" + a.impl + "'");
  reject_target_on_ref(a.given, *impl);
  const std::string replay = replay_of(s, *impl) + " --out " + a.out;
  if constexpr (std::is_same_v<decltype(build(s, replay, *impl)), nlohmann::json>)
    return report(build(s, replay, *impl), a, replay, t0);  // written as it was computed
  else
    return publish(build(s, replay, *impl), a, replay, t0);
}

// A DeepSeek-V4 set (tools/lib/golden_v4.h): --kind v4 --problem SPEC, or a v4 preset.
int golden_v4(const GoldenArgs& a, std::chrono::steady_clock::time_point t0) {
  return golden_descriptor(
      a, t0, {"v4", "a v4", "--problem SPEC (a V4 descriptor)", "its sizes, layer types, schedule and seed", true},
      golden::parse_v4_spec, golden::v4_replay,
      [&a](const golden::V4Spec& s, const std::string& replay, Impl i) {
        std::fprintf(stderr, "golden: computing the V4 stack %s...\n", golden::to_string(s).c_str());
        return golden::write_v4(a.out, a.force, s, replay, i);
      });
}

// An MTP draft-step set (tools/lib/golden_mtp.h): --kind mtp --problem "PROBLEM steps=N accept=a,b,..",
// or an mtp preset; an accepted length beyond the drafted tokens is refused, naming the field.
int golden_mtp(const GoldenArgs& a, std::chrono::steady_clock::time_point t0) {
  return golden_descriptor(
      a, t0, {"mtp", "an mtp", "--problem \"PROBLEM steps=N accept=a,b,..\"", "its sizes, seed and draft", false},
      golden::parse_mtp_spec, golden::mtp_replay, golden::build_mtp);
}

// A Hunyuan HY V4 set (tools/lib/golden_hyv4.h): --kind hyv4 --problem "PROBLEM [rope=R] [vd=V]", or a
// hyv4 preset; the descriptor and its schedule are checked before anything is computed or written.
int golden_hyv4(const GoldenArgs& a, std::chrono::steady_clock::time_point t0) {
  return golden_descriptor(
      a, t0, {"hyv4", "a hyv4", "--problem \"PROBLEM [rope=R] [vd=V]\"", "its sizes, schedule and seed", false},
      golden::parse_hyv4_spec, golden::hyv4_replay,
      [](const golden::Hyv4Spec& s, const std::string& replay, Impl i) { return golden::build_hyv4(s, replay, i); });
}

// A GLM-5.3 KPool-DSA set (tools/lib/golden_kpool.h): --kind kpool --problem SPEC, or a kpool preset.
int golden_kpool(const GoldenArgs& a, std::chrono::steady_clock::time_point t0) {
  return golden_descriptor(
      a, t0, {"kpool", "a kpool", "--problem SPEC (a kpool descriptor)", "its sizes, layers, schedule and seed", false},
      golden::parse_kpool_spec, golden::kpool_replay,
      [&a](const golden::KpoolSpec& s, const std::string& replay, Impl i) { return golden::write_kpool(a.out, a.force, s, replay, i); });
}

// A module-level set (--model, or a module preset): the toy model with a preset's shapes.
int golden_module(const GoldenArgs& a, bool module_preset, std::chrono::steady_clock::time_point t0) {
  require(a.problem.empty() && a.from.empty() && (a.preset.empty() || a.model.empty()),
          "golden: --model excludes --preset, --problem and --from");
  require(!a.rows_given, "golden: --rows works with --problem or a kernel-level --preset, not module-level sets");
  require(!dist_active(), "golden: a module-level set (--model, module presets) is computed by one process: run it "
                          "without mpirun / srun");
  reject_given(a.given, {"--kind", "--no-logits"}, "kernel-level sets (--problem, --preset, --from)",
               "a module-level set has its own tensor list");
  golden::ModelSpec spec;
  spec.preset = module_preset ? golden::preset(a.preset).problem : a.model;
  spec.layers = int(a.layers);
  spec.seq = a.seq;
  spec.schedule = a.schedule;
  spec.seed = a.seed >= 0 ? uint64_t(a.seed) : 1;
  spec.sim = a.sim;
  spec.variant = a.variant;
  spec.impl = resolve_model_impl(a.impl, model_preset(spec.preset), spec.layers, spec.seq);
  reject_target_on_ref(a.given, spec.impl);
  ModelConfig cfg = model_preset(spec.preset);
  if (spec.layers > 0) cfg.n_layers = spec.layers;
  if (spec.seq > 0) cfg.seq = spec.seq;
  check_model_memory(cfg, parse_bytes(a.max_memory), true);
  const std::string replay = golden::model_replay(spec) + " --out " + a.out;
  std::fprintf(stderr, "golden: computing the %s toy model...\n", spec.preset.c_str());
  return publish(golden::build_model(spec, replay), a, replay, t0);
}

// A v4 set from a deepseek_v4 model dump (golden_v4.h load_v4_dump): the dump's descriptor, its inputs.
int golden_v4_from(const GoldenArgs& a, std::chrono::steady_clock::time_point t0) {
  require(a.preset.empty() && a.problem.empty(), "golden --from: a deepseek_v4 dump carries its V4 descriptor (metadata "
                                                 "'problem'); give no --preset or --problem");
  reject_given(a.given, {"--rows", "--for", "--no-logits", "--layers", "--seq", "--seed", "--schedule", "--sim", "--variant", "--kind"},
               "other sets", "a v4 set from a dump takes its sizes, layer types and values from the dump");
  require(!dist_active(), "golden: a v4 set is computed by one process: run it without mpirun / srun");
  golden::V4Dump d = golden::load_v4_dump(a.from);
  const std::optional<Impl> impl =
      a.impl == "auto" || !was_given(a.given, "--impl") ? std::optional<Impl>(Impl::simd) : impl_named(a.impl);
  require(impl.has_value(), "golden: --impl must be ref, simd or auto, got '" + a.impl + "'");
  reject_target_on_ref(a.given, *impl);
  const std::string replay = golden::v4_from_replay(a.from, *impl) + " --out " + a.out;
  std::fprintf(stderr, "golden: computing the V4 stack %s from %s...\n", golden::to_string(d.spec).c_str(), a.from.c_str());
  return report(golden::write_v4(a.out, a.force, d.spec, replay, *impl, &d.inputs,
                                 "from the model dump " + a.from + " (python -m indexshare.dump); the seed is not used"),
                a, replay, t0);
}

// A kernel-level set from per-layer inputs dumped from a real model (--from), on one process or
// MPI ranks (each reading its own rows).
// A hyv4 set from a hy_v4 model dump (golden_hyv4.h load_hyv4_dump): the dump's descriptor, its inputs.
int golden_hyv4_from(const GoldenArgs& a, std::chrono::steady_clock::time_point t0) {
  require(a.problem.empty() && a.preset.empty() && a.model.empty(),
          "golden --from: a hy_v4 dump carries its own descriptor (metadata 'problem'): give no --problem / --preset / --model");
  reject_given(a.given, {"--rows", "--for", "--no-logits", "--layers", "--seq", "--seed", "--schedule", "--sim", "--variant", "--kind"},
               "other dumps", "a hyv4 set from a dump takes everything from the dump");
  require(!dist_active(), "golden: a hyv4 set is computed by one process: run it without mpirun / srun");
  golden::Hyv4Dump d = golden::load_hyv4_dump(a.from);
  const std::optional<Impl> impl = impl_named(a.impl);
  require(impl.has_value(), "golden: --impl must be ref or simd, got '" + a.impl + "'");
  const std::string replay = golden::v4_from_replay(a.from, *impl) + " --out " + a.out;  // the same command line
  golden::GoldenSet set = golden::build_hyv4(d.spec, replay, *impl, &d.inputs);
  set.manifest["conventions"]["inputs"] = "from the model dump " + a.from + " (python -m indexshare.dump); the seed is not used";
  return publish(std::move(set), a, replay, t0);
}

// A kpool set from a glm5_next model dump (golden_kpool.h load_kpool_dump): the dump's descriptor, its inputs.
int golden_kpool_from(const GoldenArgs& a, std::chrono::steady_clock::time_point t0) {
  require(a.problem.empty() && a.preset.empty() && a.model.empty(),
          "golden --from: a glm5_next dump carries its own descriptor (metadata 'problem'): give no --problem / --preset / --model");
  reject_given(a.given, {"--rows", "--for", "--no-logits", "--layers", "--seq", "--seed", "--schedule", "--sim", "--variant", "--kind"},
               "other dumps", "a kpool set from a dump takes everything from the dump");
  require(!dist_active(), "golden: a kpool set is computed by one process: run it without mpirun / srun");
  golden::KpoolDump d = golden::load_kpool_dump(a.from);
  const std::optional<Impl> impl = impl_named(a.impl);
  require(impl.has_value(), "golden: --impl must be ref or simd, got '" + a.impl + "'");
  reject_target_on_ref(a.given, *impl);
  const std::string replay = golden::v4_from_replay(a.from, *impl) + " --out " + a.out;  // the same command line
  return report(golden::write_kpool(a.out, a.force, d.spec, replay, *impl, &d.inputs,
                                    "from the model dump " + a.from + " (python -m indexshare.dump); the seed is not used"),
                a, replay, t0);
}

int golden_from(const GoldenArgs& a, std::chrono::steady_clock::time_point t0) {
  if (golden::is_v4_dump(a.from)) return golden_v4_from(a, t0);
  if (golden::is_hyv4_dump(a.from)) return golden_hyv4_from(a, t0);
  if (golden::is_kpool_dump(a.from)) return golden_kpool_from(a, t0);
  require(a.preset.empty(), "golden: --from excludes --preset (use --problem for top-k, dv, sm and sched)");
  require(!a.rows_given, "golden: --rows works with generated problems, not --from (the dump's rows are given)");
  reject_given(a.given, {"--layers", "--seq", "--seed", "--schedule", "--sim", "--variant", "--kind"},
               "generated sets (--problem, --preset, --model)",
               "--from takes shapes, layers and values from the dump, top-k and sched= from --problem");
  // The layer count comes from the file; the problem gives top-k, d_v, sm and the schedule. The
  // shapes come from the file: the replay line carries the problem that was computed.
#ifdef INDEXSHARE_MPI
  if (dist::active()) {
    // Every rank reads the header and the windows first, then the key side and its own rows
    // only (from their offsets in the file).
    golden::DumpRows dr;
    dist::guarded([&] { dr = golden::dump_rows(a.from, a.problem); });
    const std::string replay = golden::from_replay(a.from, dr.problem, !a.no_logits) + " --out " + a.out;
    return publish_ranks(
        a, dr.problem, replay, dr.windows, dr.indexer_layers, [](const golden::RowPart&) {},
        [&](const golden::RowPart& part) {
          golden::StackInputs si = golden::load_dump(a.from, a.problem, &part);
          return golden::build_from(a.from, std::move(si), !a.no_logits, replay, &part);
        },
        t0);
  }
#endif
  golden::StackInputs si = golden::load_dump(a.from, a.problem);
  const std::string replay = golden::from_replay(a.from, si.problem, !a.no_logits) + " --out " + a.out;
  return publish(golden::build_from(a.from, std::move(si), !a.no_logits, replay), a, replay, t0);
}

int cmd_golden(const GoldenArgs& a) {
  require(!a.out.empty(), "golden: --out DIR is required");
  apply_target(a.target);
  const auto t0 = std::chrono::steady_clock::now();
  const bool module_preset = !a.preset.empty() && golden::preset(a.preset).kind == "module";
  check_overrides(a.given, a.layers, a.seq, a.seed);
  if (a.kind == "v4" || (!a.preset.empty() && golden::preset(a.preset).kind == "v4")) return golden_v4(a, t0);
  if (a.kind == "mtp" || (!a.preset.empty() && golden::preset(a.preset).kind == "mtp")) return golden_mtp(a, t0);
  if (a.kind == "hyv4" || (!a.preset.empty() && golden::preset(a.preset).kind == "hyv4")) return golden_hyv4(a, t0);
  if (a.kind == "kpool" || (!a.preset.empty() && golden::preset(a.preset).kind == "kpool")) return golden_kpool(a, t0);
  if (!a.for_kernel.empty()) {
    require(a.model.empty() && !module_preset && a.from.empty(), "golden: --for works with --problem or a kernel-level --preset");
    require(!a.rows_given, "golden: --for writes whole sets: --rows (sampled query rows) is not a kernel's input layout");
  }
  if (!a.model.empty() || module_preset) return golden_module(a, module_preset, t0);  // module level
  if (!a.from.empty()) return golden_from(a, t0);  // kernel inputs dumped from a real model
  require(a.preset.empty() != a.problem.empty(), "golden: give exactly one of --preset, --problem, --model and --from");
  reject_given(a.given, {"--schedule", "--sim", "--variant"}, "--model",
               "a kernel-level set takes them from its descriptor: sched=, sim=, the indexer mode");
  // Train sets: --kind train, a train preset, or --for a training kernel (which implies the kind).
  const bool train_kernel = !a.for_kernel.empty() && kreg::kernel(a.for_kernel).kind == "train";
  require(!train_kernel || !was_given(a.given, "--kind") || a.kind == "train",
          "golden: --for " + a.for_kernel + " writes a train set, not --kind " + a.kind);
  if (a.kind == "train" || train_kernel || (!a.preset.empty() && golden::preset(a.preset).kind == "train"))
    return golden_train(a, t0);
  reject_given(a.given, {"--loss", "--train-target", "--kl-form", "--relu", "--loss-coeff", "--train-edges", "--loss-layers", "--d-out"}, "--kind train",
               "they shape the training set");
  if (is_model1_request(a)) return golden_model1(a, t0);
  // The preset, the overrides, --for and --rows: the rules the Python package shares (golden.h).
  golden::StackRequest req;
  req.preset = a.preset;
  req.problem = a.problem;
  req.kind = a.kind;
  req.kind_given = was_given(a.given, "--kind");
  req.for_kernel = a.for_kernel;
  req.layers = a.layers;
  req.seq = a.seq;
  req.seed = a.seed;
  req.rows_given = a.rows_given;
  req.rows = a.rows;
  golden::StackPlan plan = golden::plan_stack(req);
  const Problem& p = plan.problem;
  const std::string& kind = plan.kind;
  const kreg::Kernel* kern = plan.kernel;
  const std::vector<int64_t>& rows = plan.rows;
  const int64_t n_rows = a.rows_given ? int64_t(rows.size()) : p.s_q;
  // Kernel presets compute with simd unless --impl is given: the same bytes as ref (simd/ is
  // bit-identical to ref/), in a second instead of half a minute at h_q 64-128.
  const Impl impl = plan.kernel_preset && !was_given(a.given, "--impl") ? Impl::simd : resolve_impl(a.impl, p, n_rows);
  reject_target_on_ref(a.given, impl);
  const bool streams = impl_streams(impl, p);
  const uint64_t max_bytes = parse_bytes(a.max_memory);
  auto memory_check = [&](int64_t rows_here, const std::string& more) {
    check_memory(p, !a.no_logits, streams, max_bytes,
                 "use " + logits_remedy(p, !a.no_logits, streams, max_bytes, rows_here, true, true) + more +
                     (kind == "stack" ? "--rows (fewer query rows), " : "") + "a smaller --problem (s_q, s_kv, nl)",
                 rows_here, true);
  };
  if (!dist_active()) memory_check(n_rows, "");
  const std::string replay = golden::stack_replay(p, kind, kern ? kern->name : "", a.rows_given ? &rows : nullptr,
                                                 impl, !a.no_logits, a.max_memory) +
                             " --out " + a.out;
  if (!dist_active() || dist_rank() == 0)
    std::fprintf(stderr, "golden: computing %s (%lld layers%s)...\n", to_string(p).c_str(), (long long)p.n_layers,
                 a.rows_given ? (", " + std::to_string(n_rows) + " query rows").c_str() : "");
  auto kernel_block = [&](golden::GoldenSet& set) {  // the kernel's call and its tensors in the kernel's form
    if (kern) golden::for_kernel(set, *kern, p);
  };
#ifdef INDEXSHARE_MPI
  if (dist::active()) {
    require(kind != "attention-edge", "golden: an attention-edge set (8 rows whose edge cases depend on the row number) is "
                                      "computed by one process: run it without mpirun / srun");
    const std::vector<int64_t> list = a.rows_given ? rows : ref::all_rows(p);
    const Schedule sched = p.schedule();
    int n_ix = 0;
    for (int l = 0; l < sched.n_layers(); ++l) n_ix += sched.is_full(l) || p.own;
    return publish_ranks(
        a, p, replay, dist::causal_windows(p, list), n_ix,
        [&](const golden::RowPart& part) { memory_check(part.end - part.begin, "more ranks, "); },
        [&](const golden::RowPart& part) {
          golden::GoldenSet set = golden::build(p, kind, !a.no_logits, replay, impl, a.rows_given ? &rows : nullptr, &part);
          kernel_block(set);
          return set;
        },
        t0);
  }
#endif
  golden::GoldenSet set = golden::build(p, kind, !a.no_logits, replay, impl, a.rows_given ? &rows : nullptr);
  kernel_block(set);
  return publish(std::move(set), a, replay, t0);
}

}  // namespace

Action register_golden(CLI::App& app) {
  auto a = std::make_shared<GoldenArgs>();
  CLI::App* c = app.add_subcommand("golden", "Compute a golden set and write it (safetensors + manifest.json)");
  c->add_option("--preset", a->preset, help("golden", "--preset"));
  c->add_option("--problem,-p", a->problem, help("golden", "--problem"));
  c->add_option("--kind", a->kind, help("golden", "--kind"))->capture_default_str();
  c->add_option("--loss", a->loss, help("golden", "--loss"))
      ->group("Training sets (--kind train)")->capture_default_str();
  c->add_option("--train-target", a->train_target,
                help("golden", "--train-target"))
      ->group("Training sets (--kind train)")->capture_default_str();
  c->add_option("--kl-form", a->kl_form, help("golden", "--kl-form"))
      ->group("Training sets (--kind train)")->capture_default_str();
  c->add_option("--relu", a->relu, help("golden", "--relu"))
      ->group("Training sets (--kind train)")->capture_default_str();
  c->add_option("--loss-coeff", a->loss_coeff, help("golden", "--loss-coeff"))->group("Training sets (--kind train)")->capture_default_str();
  c->add_option("--loss-layers", a->loss_layers,
                help("golden", "--loss-layers"))
      ->group("Training sets (--kind train)");
  c->add_option("--d-out", a->d_out,
                "A safetensors file with every layer's layers.{l}.attn.d_out (BF16 [s_q, h_q, d_v]): the upstream "
                "gradients, instead of drawn ones (--kind train)")
      ->group("Training sets (--kind train)");
  c->add_option("--train-edges", a->train_edges,
                help("golden", "--train-edges"))
      ->group("Training sets (--kind train)")->capture_default_str();
  c->add_option("--model", a->model, help("golden", "--model"));
  c->add_option("--from", a->from, help("golden", "--from"));
  c->add_option("--layers", a->layers, help("golden", "--layers"));
  c->add_option("--seq", a->seq, help("golden", "--seq"));
  c->add_option("--seed", a->seed, help("golden", "--seed"));
  c->add_option("--schedule", a->schedule, help("golden", "--schedule"));
  c->add_option("--sim", a->sim, help("golden", "--sim"))->capture_default_str();
  c->add_option("--variant", a->variant, help("golden", "--variant"))->capture_default_str();
  c->add_option("--impl", a->impl, help("golden", "--impl"))->capture_default_str();
  c->add_option("--target", a->target, "Highway target for simd (default best)");
  c->add_option("--max-memory", a->max_memory, "Refuse problems whose estimated memory exceeds this (e.g. 8G)")->capture_default_str();
  c->add_option("--rows", a->rows, help("golden", "--rows"));
  c->add_flag("--no-logits", a->no_logits, help("golden", "--no-logits"));
  c->add_flag("--force", a->force, "Replace an existing golden set in --out");
  c->add_option("--out,-o", a->out, "Output folder (written atomically)");
  c->add_option("--for", a->for_kernel,
                help("golden", "--for"));
  excludes(*c, "--preset", {"--kind"});  // a preset has its own kind
  return [c, a]() {
    a->given = given_options(*c);
    a->rows_given = was_given(a->given, "--rows");
    return *c ? cmd_golden(*a) : -1;
  };
}

Action register_presets(CLI::App& app) {
  CLI::App* c = app.add_subcommand("presets", "List the golden presets");
  return [c]() {
    if (!*c) return -1;
    // Two lines per preset; a kernel preset's second line ends with the kernel it serves (its set
    // is written as with golden --for KERNEL).
    for (const golden::Preset& p : golden::presets())
      std::printf("%-16s %-15s %s\n%16s %-15s %s%s\n", p.name.c_str(), p.kind.c_str(), p.description.c_str(), "", "",
                  p.problem.c_str(), p.kernel.empty() ? "" : ("  [serves kernel " + p.kernel + "]").c_str());
    return 0;
  };
}

Action register_kernels(CLI::App& app) {
  CLI::App* c = app.add_subcommand("kernels", "List the GPU kernels golden --for writes sets for, with their constraints");
  return [c]() {
    if (!*c) return -1;
    for (const kreg::Kernel& k : kreg::kernels()) {
      std::ostringstream cons;  // "h_q in 64|128, topk %128 (h_q=128), ..."
      for (size_t c = 0; c < k.constraints.size(); ++c) {
        const kreg::Constraint& x = k.constraints[c];
        cons << (c ? ", " : "") << x.field;
        if (x.multiple_of) cons << " %" << x.multiple_of;
        for (size_t i = 0; i < x.one_of.size(); ++i) cons << (i ? "|" : " in ") << x.one_of[i];
        if (!x.when_field.empty()) cons << " (" << x.when_field << "=" << x.when_value << ")";
      }
      std::printf("%-32s %-8s %-6s %s\n%32s   %s\n", k.name.c_str(), k.library.c_str(), k.kind.c_str(), cons.str().c_str(), "", k.call.c_str());
    }
    return 0;
  };
}

Action register_verify(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  CLI::App* c = app.add_subcommand("verify", "Check a golden set: manifest, every tensor's dtype, shape and SHA-256");
  c->add_option("--golden,-g", *dir, "Golden set folder")->required();
  return [c, dir]() {
    if (!*c) return -1;
    // Tensors above 64 MiB are streamed through SHA-256, never held: a set larger than memory
    // (the 16K-token V4 stack's 27.6 GB) verifies in the memory of its largest kept tensors.
    std::printf("%sverified: every tensor matches its manifest entry and SHA-256\n",
                golden::summary(golden::read(*dir, uint64_t(64) << 20)).c_str());
    return 0;
  };
}

}  // namespace indexshare::cli
