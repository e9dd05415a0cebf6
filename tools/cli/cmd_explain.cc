// indexshare explain: one query row's path through one layer of a golden set (tools/lib/explain.h).
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "tools/cli/cli.h"
#include "tools/lib/explain.h"

namespace indexshare::cli {

namespace {
struct ExplainArgs {
  std::string golden, candidate;
  explain::Options o;
};

int cmd_explain(const ExplainArgs& a) {
  const golden::Loaded g = golden::read(a.golden);
  require(g.manifest.value("kind", "") != "kpool", "explain: " + a.golden + " is a kpool set (GLM-5.3's pooled indexer): explain "
                                                   "walks a token indexer's row; judge a kpool set with diff");
  std::optional<io::SafetensorsFile> c;
  if (!a.candidate.empty()) c = io::read_safetensors(a.candidate);
  std::printf("%s", explain::explain(g, a.o, c ? &*c : nullptr).c_str());
  std::string replay = "indexshare explain --golden " + a.golden + " --layer " + std::to_string(a.o.layer) + " --row " +
                       std::to_string(a.o.row);
  if (a.o.head >= 0) replay += " --head " + std::to_string(a.o.head);
  if (a.o.top != 10) replay += " --top " + std::to_string(a.o.top);
  if (c) replay += " --candidate " + a.candidate;
  std::printf("__REPRO: %s\n", replay.c_str());
  return 0;
}
}  // namespace

Action register_explain(CLI::App& app) {
  auto a = std::make_shared<ExplainArgs>();
  CLI::App* c = app.add_subcommand("explain", "Show one query row's path through a layer of a golden set (window, logits, "
                                              "ties at the k-th score, positions, attention weights; a candidate's departures)");
  c->add_option("--golden,-g", a->golden, "Golden set folder")->required();
  c->add_option("--layer", a->o.layer, "Layer")->required();
  c->add_option("--row", a->o.row, "Query row of the set (0..s_q-1)")->required();
  c->add_option("--head", a->o.head, "Head whose attention weights are listed (default 0)");
  c->add_option("--top", a->o.top, "How many of the largest logits and heaviest weights to list")->capture_default_str();
  c->add_option("--candidate,-c", a->candidate, "Candidate safetensors file (as for diff): where it departs on this row");
  return [c, a]() { return *c ? cmd_explain(*a) : -1; };
}

}  // namespace indexshare::cli
