// indexshare cost: FLOPs and bytes per decoded token and per whole prefill of a DSA model under a
// layer schedule, compared with every layer Full (the cost model of ref/cost.h).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "ref/config.h"
#include "ref/cost.h"
#include "ref/error.h"
#include "ref/schedule.h"
#include "tools/cli/cli.h"
#include "tools/lib/cost_report.h"
#include "tools/lib/json_io.h"
#include "tools/lib/svg.h"

namespace indexshare::cli {

namespace {

using nlohmann::json;

constexpr const char* kDefaultContexts = "4096,16384,65536,131072,262144,1048576";

struct CostArgs {
  std::string model, config, contexts = kDefaultContexts, schedule, mode = "both", json_path;
  bool alternatives = false, print_config = false;
  CostOptions options;
  std::vector<std::string> given;  // the options on the command line
};

// 3.456e11 -> "345.6 G".
std::string si(double x) {
  static const char* prefix[] = {"", "k", "M", "G", "T", "P", "E", "Z"};
  int p = 0;
  while (std::abs(x) >= 999.95 && p < 7) { x /= 1000; ++p; }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g %s", x, prefix[p]);
  return buf;
}

std::string pct(double share) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * share);
  return buf;
}

std::string fixed(double x, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

void print_mode(CostMode mode, const ModelConfig& cfg, const Schedule& sched, const Schedule& full,
                const std::vector<int64_t>& contexts, const CostOptions& o) {
  const bool dec = mode == CostMode::decode;
  std::printf("\n%s\n", dec ? "decode: one token at context L (batch 1: every weight it uses is read once)"
                            : "prefill: the whole prefill of L tokens (causal sums; every weight read once)");
  std::printf("  %9s  %14s %14s %7s  %14s %14s %7s  %s\n", "context", "FLOPs sched", "FLOPs all-full", "ratio",
              "bytes sched", "bytes all-full", "ratio", "indexer FLOPs share sched / all-full");
  std::vector<std::pair<CostBreakdown, CostBreakdown>> all;
  for (int64_t L : contexts) {
    const CostBreakdown s = cost(cfg, sched, L, mode, o), f = cost(cfg, full, L, mode, o);
    const double fr = f.total_flops() / s.total_flops(), br = f.total_bytes() / s.total_bytes();
    std::printf("  %9lld  %14s %14s %7s  %14s %14s %7s  %s / %s\n", (long long)L, (si(s.total_flops()) + "FLOP").c_str(),
                (si(f.total_flops()) + "FLOP").c_str(), fixed(fr, 3).c_str(), (si(s.total_bytes()) + "B").c_str(),
                (si(f.total_bytes()) + "B").c_str(), fixed(br, 3).c_str(), pct(s.indexer_flops_share()).c_str(),
                pct(f.indexer_flops_share()).c_str());
    all.emplace_back(s, f);
  }
  for (size_t c = 0; c < contexts.size(); ++c) {
    const CostBreakdown &s = all[c].first, &f = all[c].second;
    std::printf("  breakdown at L = %lld:\n", (long long)contexts[c]);
    std::printf("    %-14s %14s %6s %14s %6s  %14s %6s %14s %6s\n", "item", "FLOPs sched", "share", "FLOPs all-full",
                "share", "bytes sched", "share", "bytes all-full", "share");
    for (size_t i = 0; i < s.items.size(); ++i) {
      const CostItem &a = s.items[i], &b = f.items[i];
      std::printf("    %-14s %14s %6s %14s %6s  %14s %6s %14s %6s\n", a.name.c_str(), (si(a.flops) + "FLOP").c_str(),
                  pct(a.flops / s.total_flops()).c_str(), (si(b.flops) + "FLOP").c_str(),
                  pct(b.flops / f.total_flops()).c_str(), (si(a.bytes) + "B").c_str(),
                  pct(a.bytes / s.total_bytes()).c_str(), (si(b.bytes) + "B").c_str(),
                  pct(b.bytes / f.total_bytes()).c_str());
    }
  }
}

int cmd_cost(const CostArgs& a) {
  require(a.model.empty() != a.config.empty(), "cost: give exactly one of --model NAME or --config FILE");
  ModelConfig cfg;
  if (a.model.empty()) {
    // A regular file of strict JSON first (a duplicated key silently took the last value, a folder
    // read as "invalid JSON"), then the config's own fields.
    const std::string text = io::read_text_file(a.config);
    (void)io::parse_json_strict(text, a.config);
    cfg = parse_config_json(text, a.config);
  } else {
    cfg = model_preset(a.model);
  }
  if (a.print_config) {
    std::printf("%s", config_json_text(cfg).c_str());
    return 0;
  }
  require(a.mode == "decode" || a.mode == "prefill" || a.mode == "both",
          "--mode: expected decode, prefill or both, got '" + a.mode + "'");
  if (a.mode == "decode") reject_given(a.given, {"--prefill-tile"}, "--mode prefill or both", "decode has no query tiles");
  a.options.validate();
  const std::vector<int64_t> contexts = parse_contexts(a.contexts);
  const Schedule sched = a.schedule.empty() ? cfg.resolve_schedule() : parse_schedule(a.schedule, cfg.n_layers);
  const Schedule full = all_full_schedule(cfg);
  const CostOptions& o = a.options;

  std::printf("model     %s: %d layers, dim %lld, MLA %lld heads, indexer H %lld x D %lld, top-k %lld, "
              "MoE %lld+%lld of %lld experts\n",
              cfg.name.c_str(), cfg.n_layers, (long long)cfg.dim, (long long)cfg.n_heads,
              (long long)cfg.index_n_heads, (long long)cfg.index_head_dim, (long long)cfg.index_topk,
              (long long)cfg.n_activated_experts, (long long)cfg.n_shared_experts, (long long)cfg.n_routed_experts);
  std::printf("schedule  %s (%d full, %d shared of %d)%s; compared with all-full\n", sched.pattern().c_str(),
              sched.n_full(), sched.n_layers() - sched.n_full(), sched.n_layers(),
              a.schedule.empty() ? " from the config" : "");
  std::printf("accounting %g FLOPs per MAC; FP8 indexer-scoring MAC weight %g; top-k %g ops per key; "
              "%d MTP layers; FP8 weights %g B/param, bf16 2 B; prefill k-cache tile %lld queries; "
              "elementwise ops not counted\n",
              o.flops_per_mac, o.fp8_score_weight, o.topk_ops_per_key, o.mtp_layers, o.fp8_weight_bytes,
              (long long)o.prefill_query_tile);

  if (a.mode != "prefill") print_mode(CostMode::decode, cfg, sched, full, contexts, o);
  if (a.mode != "decode") print_mode(CostMode::prefill, cfg, sched, full, contexts, o);

  // The FLOPs ratio under each accounting of ref/cost.h (independent of the options above).
  if (a.alternatives) {
    std::printf("\nFLOPs ratio all-full / schedule under other accountings:\n  %-18s", "accounting");
    for (int64_t L : contexts) std::printf(" %9lld", (long long)L);
    std::printf("  description\n");
    for (const Accounting& acc : accounting_alternatives()) {
      std::printf("  %-18s", acc.name.c_str());
      for (int64_t L : contexts) std::printf(" %9s", fixed(flops_ratio(cfg, sched, L, acc), 3).c_str());
      std::printf("  %s\n", acc.description.c_str());
    }
  }
  const json out = cost_report_json(cfg, sched, contexts, a.mode, o);
  if (!a.json_path.empty()) io::write_text_file(a.json_path, out.dump(2) + "\n");
  return 0;
}

}  // namespace

Action register_cost(CLI::App& app) {
  auto a = std::make_shared<CostArgs>();
  CLI::App* c = app.add_subcommand(
      "cost", "FLOPs and bytes per decoded token and per prefill, with a schedule and with every layer full");
  auto* p = c->add_option(renamed("cost", "--model", "--preset"), a->model, help("cost", "--model"));
  auto* f = c->add_option("--config", a->config, "Model config JSON file (ModelConfig field names; see ref/cost.h)");
  p->excludes(f);
  c->add_option("--context", a->contexts, help("cost", "--context"))->capture_default_str();
  c->add_option("--schedule", a->schedule, help("cost", "--schedule"));
  c->add_option("--mode", a->mode, help("cost", "--mode"))->capture_default_str();
  c->add_option("--json", a->json_path, "Also write the numbers as JSON to this file");
  c->add_flag("--alternatives", a->alternatives, "Also print the FLOPs ratio under the other accountings");
  c->add_flag("--print-config", a->print_config, "Print the model config as JSON (a --config template) and exit");
  c->add_option("--flops-per-mac", a->options.flops_per_mac, "FLOPs per multiply-accumulate")->capture_default_str();
  c->add_option("--fp8-score-weight", a->options.fp8_score_weight,
                "Weight of an FP8 indexer-scoring MAC relative to a bf16 MAC")->capture_default_str();
  c->add_option("--topk-ops-per-key", a->options.topk_ops_per_key, "Top-k operations per scored key")
      ->capture_default_str();
  c->add_option("--mtp-layers", a->options.mtp_layers, "MTP layers run per token (always full)")->capture_default_str();
  c->add_option("--weight-bytes", a->options.fp8_weight_bytes, "Bytes per parameter of the FP8 linears")
      ->capture_default_str();
  c->add_option("--prefill-tile", a->options.prefill_query_tile,
                "Prefill queries sharing one read of the indexer k cache")->capture_default_str();
  // --print-config prints the model config and exits: the cost tables' options are refused.
  excludes(*c, "--print-config", {"--context", "--schedule", "--mode", "--json", "--alternatives", "--flops-per-mac",
                                  "--fp8-score-weight", "--topk-ops-per-key", "--mtp-layers", "--weight-bytes", "--prefill-tile"});
  return [c, a]() {
    a->given = given_options(*c);
    return *c ? cmd_cost(*a) : -1;
  };
}

}  // namespace indexshare::cli
