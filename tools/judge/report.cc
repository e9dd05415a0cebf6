// indexshare diff: the report as text, JSON and SVG.
#include "tools/judge/walk.h"

namespace indexshare::diff {

using namespace detail;

bool Result::failed() const {
  for (const TensorResult& t : tensors)
    if (t.report.verdict == cmp::Verdict::fail) return true;
  return false;
}

std::set<int> parse_layers(const std::string& text) {
  std::set<int> out;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    const auto dash = part.find('-');
    try {
      size_t used = 0;
      if (dash == std::string::npos) {
        const int v = std::stoi(part, &used);
        if (used != part.size() || v < 0) throw std::invalid_argument("");
        out.insert(v);
      } else {
        const int a = std::stoi(part.substr(0, dash), &used);
        if (used != dash) throw std::invalid_argument("");
        const int b = std::stoi(part.substr(dash + 1), &used);
        if (used != part.size() - dash - 1 || a < 0 || b < a || b - a > 100000) throw std::invalid_argument("");
        for (int v = a; v <= b; ++v) out.insert(v);
      }
    } catch (const std::exception&) {
      throw Error("--layer-list: bad item '" + part + "' in '" + text + "' (expected e.g. 0,3-5)");
    }
  }
  if (out.empty()) throw Error("--layer-list: no layer in '" + text + "'");
  return out;
}

std::string Result::svg(const std::string& title) const { return io::diff_svg(panels, across_layers, title); }

std::string Result::text(const std::string& replay) const {
  std::ostringstream os;
  int pass = 0, fail = 0, mis = 0;
  for (const TensorResult& t : tensors) {
    const std::string v = cmp::verdict_name(t.report.verdict);
    pass += t.report.verdict == cmp::Verdict::pass;
    fail += t.report.verdict == cmp::Verdict::fail;
    mis += t.report.verdict == cmp::Verdict::mistrusted;
    char head[160];
    if (t.layer >= 0) std::snprintf(head, sizeof head, "layer %2d %-16s %-10s", t.layer, t.name.c_str(), v.c_str());
    else std::snprintf(head, sizeof head, "pooled   %-16s %-10s", t.name.c_str(), v.c_str());
    os << head << " " << t.report.stats_line();
    if (t.name == "indexer.topk" || t.name == "attn.indices" || t.name == "mtp.topk" || t.name == "mtp.indices")
      os << " recall_mean=" << t.report.stats.recall_mean << " recall_min=" << t.report.stats.recall_min;
    if (t.report.structure_tests) {
      char st[96];
      std::snprintf(st, sizeof st, " structure=%lld/%.3g", (long long)t.report.structure_tests, t.report.structure_max_ratio);
      os << st;
    }
    if (t.report.precision_ran) {
      char pr[96];
      std::snprintf(pr, sizeof pr, " precision=%.2g/%.2g", t.report.precision_rms, t.report.precision_contract);
      os << pr;
    }
    os << "\n";
    if (!t.note.empty()) os << "         note: " << t.note << "\n";
    for (const std::string& r : t.report.reasons) os << "         " << r << "\n";
    if (t.report.verdict == cmp::Verdict::fail)
      for (const cmp::Mismatch& m : t.report.mismatches) {
        std::string idx = "[";
        for (size_t i = 0; i < m.index.size(); ++i) {
          if (i) idx += ',';
          idx += std::to_string(m.index[i]);
        }
        idx += "]";
        char line[320];
        if (!m.what.empty()) std::snprintf(line, sizeof line, "         %s %s\n", idx.c_str(), m.what.c_str());
        else std::snprintf(line, sizeof line, "         %s expected %.9g got %.9g diff %.3g (bound %.3g)\n", idx.c_str(),
                           m.expected, m.got, m.diff, m.bound);
        os << line;
      }
  }
  if (!diagnoses.empty()) {
    os << "diagnosis:\n";
    for (const std::string& d : diagnoses) os << "  - " << d << "\n";
  } else if (failed()) {
    std::string tested;
    for (const Hypothesis& h : hypotheses()) tested += (tested.empty() ? "" : "; ") + h.name;
    os << "diagnosis: no named hypothesis explains the failure (tested: " << tested << ")\n";
  }
  for (const std::string& n : notes) os << "note: " << n << "\n";
  os << "precision contract: " << contract.text() << "\n";
  os << "tests:" << tensors.size() << " passed:" << pass << " failed:" << fail << " mistrusted:" << mis << "\n";
  os << "__REPRO: " << replay << "\n";
  return os.str();
}

nlohmann::json Result::json() const {
  nlohmann::json j = {{"verdict", failed() ? "FAIL" : "PASS"}, {"checked", checked}, {"diagnoses", diagnoses}, {"notes", notes}};
  nlohmann::json list = nlohmann::json::array();
  for (const TensorResult& t : tensors) {
    const cmp::Stats& s = t.report.stats;
    nlohmann::json mm = nlohmann::json::array();
    for (const cmp::Mismatch& m : t.report.mismatches)
      mm.push_back({{"index", m.index}, {"expected", m.expected}, {"got", m.got}, {"diff", m.diff}, {"bound", m.bound}, {"what", m.what}});
    list.push_back({{"layer", t.layer}, {"tensor", t.name}, {"verdict", cmp::verdict_name(t.report.verdict)},
                    {"reasons", t.report.reasons}, {"note", t.note},
                    {"stats", {{"n", s.n}, {"checked", s.n_checked}, {"failed", s.n_fail}, {"max_abs", s.max_abs},
                               {"max_rel", s.max_rel}, {"metric", s.metric}, {"mean_signed", s.mean_signed},
                               {"max_err_over_bound", s.max_ratio}, {"recall_mean", s.recall_mean}, {"recall_min", s.recall_min}}},
                    {"mismatches", mm}});
    nlohmann::json flagged = nlohmann::json::array();
    for (const cmp::StructureNote& f : t.report.structure_flagged)
      flagged.push_back({{"stat", f.stat}, {"group_kind", f.kind}, {"group", f.label}, {"estimate", f.b}, {"stderr", f.se},
                         {"t", f.t}, {"t_crit", f.t_crit}, {"floor", f.floor}, {"clusters", f.clusters}, {"fits", f.fits}});
    if (t.report.precision_ran)
      list.back()["precision"] = {{"rms_rel", t.report.precision_rms}, {"contract_rms_rel", t.report.precision_contract}};
    if (t.report.structure_tests)
      list.back()["structure"] = {{"tests", t.report.structure_tests}, {"max_ratio", t.report.structure_max_ratio},
                                  {"flagged", flagged}, {"findings", t.report.findings}};
  }
  j["tensors"] = list;
  j["precision_contract"] = {{"logits", contract.logits}, {"logits_declared", contract.logits_declared},
                             {"attn", contract.attention}, {"attn_declared", contract.attention_declared}};
  if (!contract.kl_form.empty()) j["precision_contract"]["kl"] = contract.kl_form;
  return j;
}

}  // namespace indexshare::diff
