// indexshare golden / presets / verify: write, list and check golden sets.
#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ref/error.h"
#include "ref/layer.h"
#include "ref/problem.h"
#include "tools/cli/cli.h"
#include "tools/lib/golden.h"
#include "tools/lib/kernel_registry.h"

namespace indexshare::cli {

namespace {

struct GoldenArgs {
  std::string preset, problem, kind = "stack", out, impl = "ref", model, from, schedule, variant = "deepseek_fp8", target,
      max_memory = "8G", rows, for_kernel;
  int64_t layers = 0, seq = 0;
  int64_t seed = -1;
  float sim = 0.8f;
  bool no_logits = false, force = false;
  std::vector<std::string> given;  // the options on the command line
  bool rows_given = false;         // --rows among them
};

int publish(golden::GoldenSet set, const GoldenArgs& a, const std::string& replay,
            std::chrono::steady_clock::time_point t0) {
  uint64_t bytes = 0;
  for (const io::TensorView& v : set.tensors) bytes += v.bytes.size();
  // The summary comes from the manifest just written: reading the set back would hold it in
  // memory a second time and hash it again (`golden verify` does that on request).
  const nlohmann::json manifest = golden::write(a.out, std::move(set), a.force);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s", golden::summary(a.out, manifest, bytes).c_str());
  std::printf("time      %.2f s\n__REPRO: %s\n", secs, replay.c_str());
  return 0;
}

int cmd_golden(const GoldenArgs& a) {
  require(!a.out.empty(), "golden: --out DIR is required");
  apply_target(a.target);
  const auto t0 = std::chrono::steady_clock::now();
  const bool module_preset = !a.preset.empty() && golden::preset(a.preset).kind == "module";
  check_overrides(a.given, a.layers, a.seq, a.seed);
  if (!a.for_kernel.empty()) {
    require(a.model.empty() && !module_preset && a.from.empty(), "golden: --for works with --problem or a kernel-level --preset");
    require(!a.rows_given, "golden: --for writes whole sets: --rows (sampled query rows) is not a kernel's input layout");
  }
  if (!a.model.empty() || module_preset) {  // module level: the toy model with a preset's shapes
    require(a.problem.empty() && a.from.empty() && (a.preset.empty() || a.model.empty()),
            "golden: --model excludes --preset, --problem and --from");
    require(!a.rows_given, "golden: --rows works with --problem or a kernel-level --preset, not module-level sets");
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
    spec.simd = resolve_model_impl(a.impl, model_preset(spec.preset), spec.layers, spec.seq) == "simd";
    reject_target_on_ref(a.given, spec.simd ? "simd" : "ref");
    ModelConfig cfg = model_preset(spec.preset);
    if (spec.layers > 0) cfg.n_layers = spec.layers;
    if (spec.seq > 0) cfg.seq = spec.seq;
    check_model_memory(cfg, parse_bytes(a.max_memory), true);
    const std::string replay = golden::model_replay(spec) + " --out " + a.out;
    std::fprintf(stderr, "golden: computing the %s toy model...\n", spec.preset.c_str());
    return publish(golden::build_model(spec, replay), a, replay, t0);
  }
  if (!a.from.empty()) {  // kernel inputs dumped from a real model
    require(a.preset.empty(), "golden: --from excludes --preset (use --problem for top-k, dv, sm and sched)");
    require(!a.rows_given, "golden: --rows works with generated problems, not --from (the dump's rows are given)");
    reject_given(a.given, {"--layers", "--seq", "--seed", "--schedule", "--sim", "--variant", "--kind"},
                 "generated sets (--problem, --preset, --model)",
                 "--from takes shapes, layers and values from the dump, top-k and sched= from --problem");
    // The layer count comes from the file; the problem gives top-k, d_v, sm and the schedule. The
    // shapes come from the file: the replay line carries the problem that was computed.
    golden::StackInputs si = golden::load_dump(a.from, a.problem);
    const std::string replay = golden::from_replay(a.from, si.problem, !a.no_logits) + " --out " + a.out;
    return publish(golden::build_from(a.from, std::move(si), !a.no_logits, replay), a, replay, t0);
  }
  require(a.preset.empty() != a.problem.empty(), "golden: give exactly one of --preset, --problem, --model and --from");
  reject_given(a.given, {"--schedule", "--sim", "--variant"}, "--model",
               "a kernel-level set takes them from its descriptor: sched=, sim=, the indexer mode");
  if (!a.preset.empty()) reject_given(a.given, {"--kind"}, "--problem", "a preset has its own kind");
  std::string desc = a.problem, kind = a.kind;
  if (!a.preset.empty()) {
    const golden::Preset& pr = golden::preset(a.preset);
    desc = pr.problem;
    kind = pr.kind;
  }
  Problem p = parse_problem(desc);
  if (a.layers > 0) p.n_layers = a.layers;
  if (a.seq > 0) { p.s_kv = a.seq; p.s_q = std::min(p.s_q, a.seq); }
  if (a.seed >= 0) p.seed = uint64_t(a.seed);
  p.validate();
  // --for KERNEL: the problem must fit the kernel's constraints (tools/lib/kernel_registry.h), checked
  // before anything is computed; the set is the kernel's kind.
  const kreg::Kernel* kern = a.for_kernel.empty() ? nullptr : &kreg::kernel(a.for_kernel);
  if (kern) {
    require(!was_given(a.given, "--kind") || a.kind == kern->kind,
            "golden: --for " + kern->name + " writes a " + kern->kind + " set, not --kind " + a.kind);
    require(a.preset.empty() || kind == kern->kind,
            "golden: --for " + kern->name + " needs a " + kern->kind + " set; preset '" + a.preset + "' is " + kind);
    kind = kern->kind;
    const std::vector<std::string> bad = kreg::violations(*kern, p);
    std::string msg;
    for (const std::string& b : bad) msg += (msg.empty() ? "" : "; ") + b;
    require(bad.empty(), "golden --for: " + msg);
  }
  // --rows: a sampled set of those query rows (golden.h); the replay line carries the list.
  std::vector<int64_t> rows;
  if (a.rows_given) {
    require(kind == "stack", "--rows: sampled sets are kind stack only, not '" + kind + "'");
    rows = parse_rows(a.rows, p);
  }
  const int64_t n_rows = a.rows_given ? int64_t(rows.size()) : p.s_q;
  const std::string impl = resolve_impl(a.impl, p, n_rows);
  reject_target_on_ref(a.given, impl);
  const bool streams = impl_streams(impl, p);
  const uint64_t max_bytes = parse_bytes(a.max_memory);
  check_memory(p, !a.no_logits, streams, max_bytes,
               "use " + logits_remedy(p, !a.no_logits, streams, max_bytes, n_rows, true, true) +
                   (kind == "stack" ? "--rows (fewer query rows), " : "") + "a smaller --problem (s_q, s_kv, nl)",
               n_rows, true);
  const std::string replay = golden::stack_replay(p, kind, kern ? kern->name : "", a.rows_given ? &rows : nullptr,
                                                 impl == "simd", !a.no_logits, a.max_memory) +
                             " --out " + a.out;
  std::fprintf(stderr, "golden: computing %s (%lld layers%s)...\n", to_string(p).c_str(), (long long)p.n_layers,
               a.rows_given ? (", " + std::to_string(n_rows) + " query rows").c_str() : "");
  golden::GoldenSet set = golden::build(p, kind, !a.no_logits, replay, impl == "simd", a.rows_given ? &rows : nullptr);
  if (kern) {  // the kernel's call, arguments mapped to the set's tensors
    std::map<std::string, int64_t> extra;
    for (const io::TensorView& v : set.tensors) {
      if (v.name == "layers.0.attn.kv_cache_fp8") extra["num_blocks"] = v.shape[0];
      if (v.name == "block_table") extra["max_blocks"] = v.shape[1];
    }
    set.manifest["kernel"] = kreg::manifest_block(*kern, p, set.manifest["config"]["sm_scale"].get<float>(), set.manifest["layers"], extra);
  }
  return publish(std::move(set), a, replay, t0);
}

}  // namespace

Action register_golden(CLI::App& app) {
  auto a = std::make_shared<GoldenArgs>();
  CLI::App* c = app.add_subcommand("golden", "Compute a golden set and write it (safetensors + manifest.json)");
  c->add_option("--preset", a->preset, "Golden preset (see `indexshare presets`)");
  c->add_option("--problem,-p", a->problem, "Problem descriptor");
  c->add_option("--kind", a->kind, "stack or attention-edge (with --problem)")->capture_default_str();
  c->add_option("--model", a->model, "Module-level set from the toy model with a preset's shapes (tiny-glm, tiny-deepseek, glm-5.2, ...)");
  c->add_option("--from", a->from, "Kernel-level stack from per-layer inputs dumped from a real model (golden tensor names)");
  c->add_option("--layers", a->layers, "Override the number of layers");
  c->add_option("--seq", a->seq, "Override the sequence length (kernel sets: s_kv, s_q capped at it)");
  c->add_option("--seed", a->seed, "Override the seed");
  c->add_option("--schedule", a->schedule, "Layer schedule (--model)");
  c->add_option("--sim", a->sim, "Cross-layer weight similarity (--model)")->capture_default_str();
  c->add_option("--variant", a->variant, "Indexer variant deepseek_fp8 or hf_bf16 (--model)")->capture_default_str();
  c->add_option("--impl", a->impl, "Implementation: ref, simd or auto (the same bytes; auto takes simd for large problems)")->capture_default_str();
  c->add_option("--target", a->target, "Highway target for simd (default best)");
  c->add_option("--max-memory", a->max_memory, "Refuse problems whose estimated memory exceeds this (e.g. 8G)")->capture_default_str();
  c->add_option("--rows", a->rows, "Sampled set of these query rows, e.g. 0,17,100-131,last:64,every:1024 (kind stack)");
  c->add_flag("--no-logits", a->no_logits, "Leave out the [s_q, s_kv] indexer logits");
  c->add_flag("--force", a->force, "Replace an existing golden set in --out");
  c->add_option("--out,-o", a->out, "Output folder (written atomically)");
  c->add_option("--for", a->for_kernel,
                "Check the problem against a GPU kernel's constraints and write its call in the manifest (see `indexshare kernels`)");
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
    for (const golden::Preset& p : golden::presets())
      std::printf("%-16s %-15s %s\n%16s %-15s %s\n", p.name.c_str(), p.kind.c_str(), p.description.c_str(), "", "",
                  p.problem.c_str());
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
    std::printf("%sverified: every tensor matches its manifest entry and SHA-256\n",
                golden::summary(golden::read(*dir)).c_str());
    return 0;
  };
}

}  // namespace indexshare::cli
