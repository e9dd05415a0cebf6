// indexshare: the cost model's report (ref/cost.h) as JSON, shared by `indexshare cost --json` and
// the Python package's indexshare.cost: the model, the schedule against all-Full, per mode (decode /
// prefill) and context the FLOPs and bytes of both with their items, and the FLOPs ratio under every
// accounting of accounting_alternatives().
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "ref/config.h"
#include "ref/cost.h"
#include "ref/schedule.h"

namespace indexshare {

// "4096,16K,1M": decimal integers, optional suffix K (x1024) or M (x1048576); Error naming --context.
std::vector<int64_t> parse_contexts(const std::string& text);

// One mode's rows: per context {context, flops_ratio, bytes_ratio, schedule, all_full} (breakdowns).
nlohmann::json cost_mode_json(CostMode mode, const ModelConfig& cfg, const Schedule& sched,
                              const std::vector<int64_t>& contexts, const CostOptions& o);
// The whole report; mode "decode", "prefill" or "both" (the modes it holds).
nlohmann::json cost_report_json(const ModelConfig& cfg, const Schedule& sched, const std::vector<int64_t>& contexts,
                                const std::string& mode, const CostOptions& o);

}  // namespace indexshare
