// indexshare diff: judge a candidate's outputs against a golden set.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ref/error.h"
#include "tools/cli/cli.h"
#include "tools/judge/diff.h"
#include "tools/lib/phases.h"
#include "tools/lib/svg.h"

namespace indexshare::cli {

namespace {
struct DiffArgs {
  std::string golden, candidate, layers, json, svg, impl = "auto", precision;
};

// --impl for the recomputations of diff (the same bits either way): auto takes simd for sets
// above 64 MiB of tensors.
// auto: simd, whatever the set's size. The judge's recomputations (expected attention, bounds,
// emulations) are the same bits on either table, and ref's single-threaded bounds were 13 s of a
// 14 s diff on a 59 MB set (sq96 skv2048 hq64 d576 k512 nl2) where simd takes 0.3 s.
Impl diff_impl(const DiffArgs& a) { return choose_impl(a.impl, true); }

int cmd_diff(const DiffArgs& a) {
  // Tensors above 1 MiB stay in the file (verified now, read when the judge needs them, layer by
  // layer, and freed after it): the golden set is never held whole beside the candidate.
  phases::begin("read (golden verified, candidate index)");
  // Each tensor above 1 MiB is hashed once: when the judge reads it, or by verify_rest below.
  const golden::Loaded g = golden::read(a.golden, diff::kGoldenKeepBytes, true);
  const io::SafetensorsIndex c = io::read_safetensors_index(a.candidate, diff::kCandidateKeepBytes);
  const prec::Contract contract = prec::parse_contract(a.precision);
  const diff::Result r = diff::judge(g, c, a.candidate, a.layers.empty() ? std::set<int>{} : diff::parse_layers(a.layers),
                                     kernels_for(diff_impl(a)), !a.svg.empty(), contract);
  phases::begin("verify (the golden tensors the judge did not read)");
  g.verify_rest();  // before anything is reported: a tampered set is exit 2 whichever tensor it is
  phases::begin("report");
  std::string replay = "indexshare diff --golden " + a.golden + " --candidate " + a.candidate;
  if (!a.layers.empty()) replay += " --layer-list " + a.layers;
  if (!a.precision.empty()) replay += " --precision " + a.precision;
  std::printf("%s", r.text(replay).c_str());
  std::vector<std::pair<std::string, std::string>> files;  // written together, atomically
  if (!a.json.empty()) files.push_back({a.json, r.json().dump(2) + "\n"});
  if (!a.svg.empty())
    files.push_back({a.svg, r.svg("indexshare diff: " + a.candidate + " against " + a.golden + (r.failed() ? " (FAIL)" : " (PASS)"))});
  if (!files.empty()) io::write_text_files(files);
  if (phases::requested()) std::fprintf(stderr, "%s", phases::table().c_str());
  return r.exit_code();
}
}  // namespace

Action register_diff(CLI::App& app) {
  auto a = std::make_shared<DiffArgs>();
  CLI::App* c = app.add_subcommand("diff", "Judge a candidate's outputs (safetensors) against a golden set: exit 0 pass, 1 fail, 2 bad input");
  c->add_option("--golden,-g", a->golden, help("diff", "--golden"))->required();
  c->add_option("--candidate,-c", a->candidate, help("diff", "--candidate"))->required();
  c->add_option(renamed("diff", "--layer-list", "--layers"), a->layers,
                help("diff", "--layer-list"));
  c->add_option("--json", a->json, "Also write the report as JSON");
  c->add_option("--svg", a->svg, "Also draw the report: per judged layer a heatmap of |err| / bound of attn.out per (row, head), "
                                 "the per-row recall of the positions, and the findings");
  c->add_option("--precision", a->precision,
                 help("diff", "--precision"));
  c->add_option("--impl", a->impl, help("diff", "--impl"))->capture_default_str();
  return [c, a]() { return *c ? cmd_diff(*a) : -1; };
}

}  // namespace indexshare::cli
