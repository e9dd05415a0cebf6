// indexshare: the layer schedule of cross-layer index sharing (IndexShare / IndexCache).
//
// Every layer is either Full (it runs its own indexer and produces fresh top-k positions) or
// Shared (it runs no indexer and reuses the integer top-k positions of the most recent preceding
// Full layer of the same forward pass). Layer 0 must be Full: a Shared layer without a preceding
// Full layer is an error.
//
// Which layers are full is resolved like the engines (transformers GlmMoeDsaConfig, vLLM, SGLang,
// TRT-LLM), trying in order:
//   1. an explicit per-layer list of "full" / "shared" (exactly n_layers entries);
//   2. else an F/S pattern string, one char per layer ('F' full, 'S' shared). Upstream treats
//      layers past the end of a short pattern as full; here a pattern whose length is not
//      n_layers is an error;
//   3. else the frequency rule: layer i is full iff max(i - offset + 1, 0) % freq == 0, with
//      freq default 1 (all layers full) and offset default 2 (upstream default).
//
// Examples of the frequency rule:
//   freq 4, offset 2 (original IndexCache patch): F F S S S F S S S F ...  full 0, 1, 5, 9, ...
//   freq 4, offset 3 (GLM-5.2, 78 layers):        F F F S S S F S S S ... full 0, 1, 2, 6, 10, ..., 74
//   freq 4, offset 1:                             F S S S F S S S ...     full 0, 4, 8, ...
//
// Every function here throws indexshare::Error with a message naming the bad field or value.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace indexshare {

enum class LayerKind { full, shared };

// Number of layers of GLM-5.2, the model the "glm-5.2" preset describes.
inline constexpr int kGlm52Layers = 78;

struct Schedule {
  std::vector<LayerKind> kinds;  // one entry per layer, layer 0 first

  // Number of layers: kinds.size().
  int n_layers() const { return int(kinds.size()); }

  // True iff layer i is Full. Throws Error if i is not in [0, n_layers()).
  bool is_full(int i) const;

  // The layer whose top-k positions layer i uses: i itself when layer i is Full, else the
  // largest Full layer index j < i. Throws Error if i is not in [0, n_layers()) or if layer i is
  // Shared with no Full layer before it (only possible for a schedule that fails validate()).
  int source(int i) const;

  // Number of Full layers.
  int n_full() const;

  // The F/S string: one char per layer, 'F' for Full, 'S' for Shared.
  std::string pattern() const;

  // Indices of the Full layers, ascending.
  std::vector<int> full_layers() const;

  // Throws Error unless the schedule has at least one layer and layer 0 is Full. Every function
  // below that returns a Schedule has already called it.
  void validate() const;

  friend bool operator==(const Schedule&, const Schedule&) = default;
};

// The engine-style configuration. Unset optionals fall through to the next rule; freq and offset
// are only checked when the frequency rule is the one used.
struct ScheduleSpec {
  std::optional<std::vector<std::string>> indexer_types;  // rule 1: "full" / "shared" per layer
  std::optional<std::string> pattern;                     // rule 2: "FFSS..." one char per layer
  int freq = 1;                                           // rule 3: index_topk_freq
  int offset = 2;                                         // rule 3: index_skip_topk_offset
};

// Resolves the schedule of an n_layers model from spec: indexer_types if set, else pattern if
// set, else the frequency rule with spec.freq and spec.offset. Throws Error if n_layers < 1, if
// indexer_types does not have exactly n_layers entries or has an entry other than "full" /
// "shared", if pattern does not have exactly n_layers chars or has a char other than 'F' / 'S',
// if (frequency rule) freq < 1 or offset < 0, or if the result has a Shared layer 0.
Schedule resolve_schedule(int n_layers, const ScheduleSpec& spec);

// The schedule spelled by an F/S pattern, one char per layer; its length is the layer count.
// Throws Error if pattern is empty, has a char other than 'F' / 'S' (naming position and char),
// or starts with 'S'.
Schedule schedule_from_pattern(const std::string& pattern);

// The frequency rule: layer i in [0, n_layers) is Full iff max(i - offset + 1, 0) % freq == 0.
// Throws Error if n_layers < 1, freq < 1, offset < 0, or layer 0 comes out Shared (offset 0 with
// freq > 1).
Schedule schedule_from_freq(int n_layers, int freq, int offset);

// A named schedule for an n_layers model:
//   "all-full"               every layer Full (frequency rule with freq 1);
//   "glm-5.2"                frequency rule with freq 4, offset 3. GLM-5.2 itself has
//                            kGlm52Layers = 78 layers, giving the 21 Full layers 0, 1, 2, 6, 10,
//                            ..., 74; any other n_layers applies the same rule to n_layers;
//   "one-full-three-shared"  F S S S F S S S ... (frequency rule with freq 4, offset 1);
//   "hy-v4"                  frequency rule with freq 4, offset 2: F F S S S F S S S F ...,
//                            transformers' hy_v4 default (Full iff i == 0 or (i - 1) % 4 == 0;
//                            the released model has 34 layers, Full 0, 1, 5, ..., 33).
// Throws Error if n_layers < 1 or the name is unknown (naming it and listing the known names).
Schedule schedule_preset(const std::string& name, int n_layers);

// The names schedule_preset accepts, in the order listed above.
std::vector<std::string> schedule_preset_names();

// Parses the command-line form of a schedule for an n_layers model. Accepted forms:
//   a preset name                 "all-full", "glm-5.2", "one-full-three-shared", "hy-v4"
//   an F/S pattern                "FFSSFSS" or "pattern:FFSSFSS" (exactly n_layers chars)
//   the frequency rule            "freq:4,offset:3" ("offset:N" optional, default 2; the two
//                                 items may come in either order; each at most once)
//   an explicit list              "list:full,shared,shared,full" (exactly n_layers entries)
// Integers are decimal with an optional leading '-' (at most 9 digits). Throws Error naming the
// bad text; besides the checks of the functions above, a pattern given as text must have exactly
// n_layers chars.
Schedule parse_schedule(const std::string& text, int n_layers);

// The F/S pattern of s (s.pattern()); parse_schedule(to_string(s), s.n_layers()) == s.
std::string to_string(const Schedule& s);

}  // namespace indexshare
