// libFuzzer target: the layer schedule parser (ref/schedule.h, parse_schedule). The first byte,
// read as a signed char, is n_layers (so 0 and negative counts are exercised too: they must be
// refused); the rest is the schedule text. An accepted schedule must have n_layers layers, layer
// 0 Full, every Shared layer's source the nearest preceding Full layer, and its F/S pattern must
// parse back to the same schedule.
#include <cstdint>
#include <string>

#include "ref/schedule.h"
#include "tests/fuzz/fuzz_common.h"

using namespace indexshare;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 4096) return 0;
  const int n_layers = int(static_cast<int8_t>(data[0]));
  const std::string text = fuzz::as_string(data + 1, size - 1);
  fuzz::guarded("fuzz_schedule", [&] {
    const Schedule s = parse_schedule(text, n_layers);
    if (n_layers < 1) fuzz::finding("n_layers " + std::to_string(n_layers) + " accepted");
    if (s.n_layers() != n_layers)
      fuzz::finding("'" + text + "': " + std::to_string(s.n_layers()) + " layers for n_layers " + std::to_string(n_layers));
    if (!s.is_full(0)) fuzz::finding("'" + text + "': layer 0 is Shared");
    int last_full = 0;
    for (int i = 0; i < n_layers; ++i) {
      if (s.is_full(i)) last_full = i;
      if (s.source(i) != last_full) fuzz::finding("'" + text + "': wrong source of layer " + std::to_string(i));
    }
    const std::string pattern = to_string(s);
    Schedule back;
    try {
      back = parse_schedule(pattern, n_layers);
    } catch (const Error& e) {
      fuzz::finding("the pattern '" + pattern + "' of '" + text + "' does not parse: " + e.what());
    }
    if (back.pattern() != pattern) fuzz::finding("'" + pattern + "' does not round-trip");
  });
  return 0;
}
