// indexshare calibrate: the judge against correct kernels (false positives, margins) and its
// power against systematic faults (judge/calibrate.h).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "ref/error.h"
#include "simd/simd.h"
#include "tools/judge/structure.h"
#include "tools/judge/calibrate.h"
#include "tools/lib/golden.h"
#include "tools/cli/cli.h"
#include "tools/lib/svg.h"

namespace indexshare::cli {

namespace {
struct CalibrateArgs {
  int runs = 200, first = 0;
  int64_t seed = 1;
  std::string power, json, preset;
  bool catalogue = false, values = false, families = false;
  int layer = -1;
  int64_t max_work = calib::kDefaultWork;
};

std::string scratch() {
  return (std::filesystem::temp_directory_path() / ("indexshare-calibrate-" + std::to_string(::getpid()))).string();
}

int cmd_calibrate(const CalibrateArgs& a) {
  const std::string tmp = scratch();
  struct Cleanup { std::string d; ~Cleanup() { std::error_code ec; std::filesystem::remove_all(d, ec); } } cleanup{tmp};
  nlohmann::json j;
  int rc = 0;
  if (a.catalogue) {
    std::printf("diagnosis accuracy: planted kernel bugs on %s, each named right when the first diagnosis names it\n",
                a.preset.empty() ? calib::kCatalogueProblem : ("kernel preset " + a.preset).c_str());
    std::printf("(a bug with no hypothesis is right when nothing is named; wrong: the first diagnosis names another bug)\n");
    std::printf("%-62s %-7s %s\n", "bug", "outcome", "first diagnosis");
    int right = 0, n = 0;
    std::map<std::string, int> outcomes;
    std::map<std::string, std::map<std::string, int>> by_family;  // family (the bug's "V4:" prefix, else stack) -> outcome -> count
    nlohmann::json rows = nlohmann::json::array();
    const auto show = [](const calib::CatalogueRow& r) {
      const std::string o = r.outcome() == "right" || r.outcome() == "n/a" || r.named ? r.outcome() : r.outcome() + "!";
      std::printf("%-62s %-7s %s\n", r.bug.c_str(), o.c_str(),
                  !r.not_applicable.empty() ? r.not_applicable.c_str() : r.first.empty() ? "(none)" : r.first.c_str());
      std::fflush(stdout);
    };
    for (const calib::CatalogueRow& r : a.preset.empty() ? calib::catalogue(simd::kernels(), tmp, show)
                                                         : calib::catalogue_preset(a.preset, simd::kernels(), tmp, show)) {
      right += r.named_first;
      ++outcomes[r.outcome()];
      const size_t colon = r.bug.find(": ");
      const std::string fam = colon != std::string::npos && colon <= 6 ? r.bug.substr(0, colon) : "stack";
      ++by_family[fam][r.outcome()];
      ++n;
      rows.push_back({{"bug", r.bug}, {"expect", r.expect}, {"first_diagnosis", r.first}, {"failed", r.failed},
                      {"named_first", r.named_first}, {"named", r.named}, {"outcome", r.outcome()}, {"not_applicable", r.not_applicable}});
    }
    std::printf("named right first: %d of %d; wrong names: %d; missing names: %d; not detected: %d; not applicable: %d\n", right,
                n - outcomes["n/a"], outcomes["wrong"], outcomes["missing"], outcomes["passed"], outcomes["n/a"]);
    nlohmann::json fams = nlohmann::json::object();
    for (auto& [fam, o] : by_family) {
      std::printf("  %-6s right %d, wrong %d, missing %d, not detected %d\n", fam.c_str(), o["right"], o["wrong"], o["missing"], o["passed"]);
      fams[fam] = {{"right", o["right"]}, {"wrong", o["wrong"]}, {"missing", o["missing"]}, {"not_detected", o["passed"]}};
    }
    j = {{"problem", a.preset.empty() ? calib::kCatalogueProblem : golden::preset(a.preset).problem}, {"preset", a.preset},
         {"named_first", right}, {"bugs", n - outcomes["n/a"]}, {"not_applicable", outcomes["n/a"]}, {"wrong", outcomes["wrong"]},
         {"missing", outcomes["missing"]}, {"not_detected", outcomes["passed"]}, {"by_family", fams}, {"catalogue", rows}};
  } else if (!a.power.empty()) {
    const std::vector<calib::PowerRow> power = calib::power(a.power, a.layer, simd::kernels(), tmp);  // bad input: nothing printed
    std::printf("power of the judge on %s, layer %s (faults on a correct emulation; smallest failing eps, to ~5%%)\n",
                a.power.c_str(), a.layer < 0 ? "default" : std::to_string(a.layer).c_str());
    std::printf("%-55s %-10s %-10s %s\n", "fault", "detected", "named", "caught by / diagnosis at the named size");
    nlohmann::json rows = nlohmann::json::array();
    for (const calib::PowerRow& r : power) {
      std::printf("%-55s %-10.3g %-10.3g %s\n%77s%s\n", r.fault.c_str(), r.smallest, r.named, r.caught_by.c_str(), "", r.diagnosis.c_str());
      std::fflush(stdout);
      rows.push_back({{"fault", r.fault}, {"tensor", r.tensor}, {"detected", r.smallest}, {"caught_by", r.caught_by}, {"named", r.named},
                      {"diagnosis", r.diagnosis}});
    }
    j = {{"golden", a.power}, {"layer", a.layer}, {"power", rows}};
  } else {
    require(a.runs >= 1 && a.runs <= 100000, "--runs: expected 1..100000, got " + std::to_string(a.runs));
    require(a.first >= 0 && a.first <= 1000000000, "--first: expected 0..10^9, got " + std::to_string(a.first));
    require(a.preset.empty() || !golden::preset(a.preset).kernel.empty(),
            "--preset: '" + a.preset + "' is not a kernel preset (indexshare kernels lists them)");
    std::printf("calibration: %d runs of the correct-kernel family%s from run %d, seed %lld\n", a.runs,
                a.values     ? " (f32 indexer scores of v4, hyv4 and kpool sets)"
                : a.families ? " (the attention of v4, hyv4, kpool, mtp and decode-model1 sets; the gradients of train sets)"
                : !a.preset.empty() ? (" on kernel preset " + a.preset).c_str()
                             : "",
                a.first, (long long)a.seed);
    nlohmann::json runs = nlohmann::json::array();
    const auto progress = [&](const calib::Run& r) {
      double worst = -cmp::kRatioCap, precision = 0;
      for (const calib::TensorMargin& m : r.tensors) worst = std::max(worst, m.structure_ratio), precision = std::max(precision, m.precision_ratio);
      if (a.values)
        std::printf("run %4d %-4s %5.1fs precision<=%.3g  %s (%s) | %s\n", r.index, r.passed ? "PASS" : "FAIL", r.seconds, precision,
                    r.problem.c_str(), r.kind.c_str(), r.logits_variant.c_str());
      else
        std::printf("run %4d %-4s %5.1fs structure<=%.3g  %s (%s) | %s | %s\n", r.index, r.passed ? "PASS" : "FAIL", r.seconds, worst,
                    r.problem.c_str(), r.kind.c_str(), r.attention_variant.c_str(), r.logits_variant.c_str());
      for (const std::string& why : r.reasons) std::printf("         %s\n", why.c_str());
      std::fflush(stdout);
    };
    const auto list = a.values     ? calib::calibrate_values(a.first, a.runs, uint64_t(a.seed), simd::kernels(), tmp, progress)
                      : a.families ? calib::calibrate_families(a.first, a.runs, uint64_t(a.seed), simd::kernels(), tmp, progress)
                      : !a.preset.empty()
                          ? calib::calibrate_preset(a.preset, a.first, a.runs, uint64_t(a.seed), simd::kernels(), tmp, progress)
                          : calib::calibrate(a.first, a.runs, uint64_t(a.seed), simd::kernels(), tmp, progress, a.max_work);
    for (const calib::Run& r : list) {
      nlohmann::json t = nlohmann::json::array();
      for (const calib::TensorMargin& m : r.tensors)
        t.push_back({{"tensor", m.tensor}, {"verdict", m.verdict}, {"structure_ratio", m.structure_ratio}, {"err_over_bound", m.bound_ratio},
                     {"calc_diff", m.calc_diff}, {"precision_ratio", m.precision_ratio}, {"near_ties", m.near_ties}});
      runs.push_back({{"run", r.index}, {"problem", r.problem}, {"kind", r.kind}, {"attention_variant", r.attention_variant},
                      {"logits_variant", r.logits_variant}, {"passed", r.passed}, {"reasons", r.reasons}, {"tensors", t}});
    }
    j = calib::summary(list);
    std::printf("%s\n", j.dump(2).c_str());
    j["run_list"] = runs;
    rc = j["false_positives"].get<int>() ? 1 : 0;
  }
  if (!a.json.empty()) io::write_text_file(a.json, j.dump(2) + "\n");
  return rc;
}
}  // namespace

Action register_calibrate(CLI::App& app) {
  auto a = std::make_shared<CalibrateArgs>();
  CLI::App* c = app.add_subcommand("calibrate", "Run the judge on a family of correct kernel emulations (false positives, margins), "
                                                "or measure its power on a golden set (--power DIR): exit 1 on a false positive");
  c->add_option("--runs", a->runs, "Calibration runs")->capture_default_str();
  c->add_option("--first", a->first, "First run index (runs are deterministic per index and seed)")->capture_default_str();
  c->add_option("--seed", a->seed, "Seed of the run problems")->capture_default_str()->check(CLI::NonNegativeNumber);
  c->add_option("--max-work", a->max_work, "Calibration: at most this many (query row, head, key) triples per layer (sets the rows)")
      ->capture_default_str()->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  c->add_option("--power", a->power, "Measure the smallest systematic faults the judge catches on this golden set");
  c->add_option("--layer", a->layer, "With --power: the layer to inject faults into (default 0; on a v4, hyv4 or kpool set its first Full layer)");
  c->add_flag("--catalogue", a->catalogue, "Measure the diagnosis accuracy on a catalogue of planted kernel bugs");
  c->add_option("--preset", a->preset,
                "A kernel preset: calibration runs on its set (its seed moved each run; correct kernels of its family hand in what the "
                "kernel writes), or with --catalogue the bugs planted on it (a bug the kernel cannot have is n/a)");
  c->add_flag("--values", a->values, "Calibration runs of the values kind: f32 indexer scores (and their top-k) of v4, hyv4 and kpool sets");
  c->add_flag("--families", a->families,
              "Calibration runs of the 2026 families and training: correct attention kernels on v4, hyv4, kpool, mtp and decode-model1 sets, "
              "correct backward and indexer-loss kernels on train sets (a diagnosis counts as a false positive)");
  c->add_option("--json", a->json, "Also write the results as JSON");
  // The three modes take their own options (the catalogue plants its bugs into its own set, --power
  // measures faults on the given set, --values runs draw their own shapes).
  excludes(*c, "--catalogue", {"--runs", "--first", "--seed", "--max-work", "--power", "--layer", "--values", "--families"});
  excludes(*c, "--power", {"--runs", "--first", "--seed", "--max-work", "--values", "--families"});
  excludes(*c, "--values", {"--max-work", "--families"});
  excludes(*c, "--families", {"--max-work"});
  excludes(*c, "--preset", {"--max-work", "--power", "--values", "--families"});
  needs(*c, "--layer", "--power");
  return [c, a]() {
    if (!*c) return -1;
    return cmd_calibrate(*a);
  };
}

}  // namespace indexshare::cli
