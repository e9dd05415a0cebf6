// libFuzzer target: the problem descriptor parser (ref/problem.h, parse_problem) on arbitrary
// text. An accepted descriptor must validate, and its canonical form must parse back to the same
// Problem with the same canonical form (the README's round-trip promise).
#include <cstdint>
#include <string>

#include "ref/problem.h"
#include "tests/fuzz/fuzz_common.h"

using namespace indexshare;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;  // descriptors are one line; longer inputs only slow the search
  const std::string text = fuzz::as_string(data, size);
  fuzz::guarded("fuzz_problem", [&] {
    const Problem p = parse_problem(text);
    p.validate();
    const std::string canon = to_string(p);
    Problem q;
    try {
      q = parse_problem(canon);
    } catch (const Error& e) {
      fuzz::finding("the canonical form '" + canon + "' of '" + text + "' does not parse: " + e.what());
    }
    if (!(q == p)) fuzz::finding("'" + text + "' -> '" + canon + "' parses to a different problem");
    if (to_string(q) != canon) fuzz::finding("canonical form is not a fixed point: '" + canon + "'");
    const Schedule s = p.schedule();
    if (s.n_layers() != p.n_layers)
      fuzz::finding("'" + text + "': schedule has " + std::to_string(s.n_layers()) + " layers, nl is " +
                    std::to_string(p.n_layers));
  });
  return 0;
}
