// The cost model's report as JSON (tools/lib/cost_report.h).
#include "tools/lib/cost_report.h"

#include "ref/error.h"

namespace indexshare {

using nlohmann::json;

// "4096,16K,1M": decimal integers, optional suffix K (x1024) or M (x1048576).
std::vector<int64_t> parse_contexts(const std::string& text) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (true) {
    const size_t comma = text.find(',', pos);
    const std::string tok = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t n = 0;
    while (n < tok.size() && tok[n] >= '0' && tok[n] <= '9') ++n;
    int64_t mult = 1;
    const std::string suffix = tok.substr(n);
    if (suffix == "K" || suffix == "k") mult = 1024;
    else if (suffix == "M" || suffix == "m") mult = 1024 * 1024;
    else require(suffix.empty(), "--context: bad context length '" + tok + "' (expected e.g. 4096, 16K or 1M)");
    require(n >= 1 && n <= 9, "--context: bad context length '" + tok + "' (expected e.g. 4096, 16K or 1M)");
    const int64_t v = std::stoll(tok.substr(0, n)) * mult;
    require(v >= 1, "--context: context length '" + tok + "' must be >= 1");
    out.push_back(v);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

namespace {

json breakdown_json(const CostBreakdown& b) {
  json items = json::array();
  for (const CostItem& it : b.items) items.push_back({{"name", it.name}, {"flops", it.flops}, {"bytes", it.bytes}});
  return {{"total_flops", b.total_flops()}, {"total_bytes", b.total_bytes()},
          {"indexer_flops_share", b.indexer_flops_share()}, {"indexer_bytes_share", b.indexer_bytes_share()},
          {"items", items}};
}

json options_json(const CostOptions& o) {
  return {{"flops_per_mac", o.flops_per_mac}, {"fp8_score_weight", o.fp8_score_weight},
          {"topk_ops_per_key", o.topk_ops_per_key}, {"mtp_layers", o.mtp_layers},
          {"fp8_weight_bytes", o.fp8_weight_bytes}, {"prefill_query_tile", o.prefill_query_tile}};
}

}  // namespace

json cost_mode_json(CostMode mode, const ModelConfig& cfg, const Schedule& sched, const std::vector<int64_t>& contexts,
                    const CostOptions& o) {
  const Schedule full = all_full_schedule(cfg);
  json rows = json::array();
  for (int64_t L : contexts) {
    const CostBreakdown s = cost(cfg, sched, L, mode, o), f = cost(cfg, full, L, mode, o);
    rows.push_back({{"context", L}, {"flops_ratio", f.total_flops() / s.total_flops()},
                    {"bytes_ratio", f.total_bytes() / s.total_bytes()}, {"schedule", breakdown_json(s)},
                    {"all_full", breakdown_json(f)}});
  }
  return rows;
}

json cost_report_json(const ModelConfig& cfg, const Schedule& sched, const std::vector<int64_t>& contexts,
                      const std::string& mode, const CostOptions& o) {
  json out = {{"model", cfg.name},
              {"n_layers", cfg.n_layers},
              {"schedule", sched.pattern()},
              {"n_full", sched.n_full()},
              {"compared_with", "all-full"},
              {"options", options_json(o)},
              {"config", json::parse(config_json_text(cfg))}};
  if (mode != "prefill") out[cost_mode_name(CostMode::decode)] = cost_mode_json(CostMode::decode, cfg, sched, contexts, o);
  if (mode != "decode") out[cost_mode_name(CostMode::prefill)] = cost_mode_json(CostMode::prefill, cfg, sched, contexts, o);
  json alts = json::array();
  for (const Accounting& acc : accounting_alternatives()) {
    json ratios = json::array();
    for (int64_t L : contexts) ratios.push_back({{"context", L}, {"flops_ratio", flops_ratio(cfg, sched, L, acc)}});
    alts.push_back({{"name", acc.name}, {"description", acc.description},
                    {"mode", cost_mode_name(acc.mode)}, {"options", options_json(acc.options)},
                    {"items", acc.items}, {"ratios", ratios}});
  }
  out["alternatives"] = alts;
  return out;
}

}  // namespace indexshare
