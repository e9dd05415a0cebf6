// libFuzzer target: the candidate loader and judge of `indexshare diff` (tools/lib/diff.h). The input
// is a candidate safetensors file; it is parsed with parse_safetensors and judged with diff::judge
// against two small golden sets checked in under tests/fuzz/golden/ and loaded once: edge (kind
// attention-edge: edge indices, topk_length, random sinks; one layer) and stack (four layers in the
// schedule FSFS). Their shapes are tiny (dqk16, dv8) so that a judgement takes microseconds rather
// than the tens of milliseconds of golden/glm-5.2 under ASan; the code paths are the same. Their
// replay lines regenerate them. Error (exit 2 in the tool) is fine; a result must render as text
// and JSON without throwing.
#include <cstdint>
#include <string>

#include "tests/fuzz/fuzz_common.h"
#include "tools/judge/diff.h"
#include "tools/lib/golden.h"

using namespace indexshare;

namespace {

const golden::Loaded& load(const char* name) {
  try {
    static std::string base = std::string(INDEXSHARE_SOURCE_DIR) + "/tests/fuzz/golden/";
    return *new golden::Loaded(golden::read(base + name));  // kept for the life of the process
  } catch (const std::exception& e) {
    fuzz::finding(std::string("fuzz_diff: cannot load tests/fuzz/golden/") + name + ": " + e.what());
  }
}

void judge(const golden::Loaded& g, const io::SafetensorsFile& c) {
  fuzz::guarded("fuzz_diff", [&] {
    const diff::Result r = diff::judge(g, c, {});
    (void)r.text("replay");
    (void)r.json().dump();
    if (r.checked.empty()) fuzz::finding("judge returned without checking anything");
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const golden::Loaded& edge = load("edge");
  static const golden::Loaded& stack = load("stack");
  io::SafetensorsFile c;
  try {
    c = io::parse_safetensors(data, size, "candidate.safetensors");
  } catch (const Error&) {
    return 0;
  } catch (const std::exception& e) {
    fuzz::finding(std::string("parse_safetensors: exception other than indexshare::Error: ") + e.what());
  }
  judge(edge, c);
  judge(stack, c);
  return 0;
}
