// indexshare: DeepSeek-V4 layer schedules with IndexCache index sharing, and the kernel-level stack.
//
// Layer types: V4-Flash's checkpoint lists `compress_ratios` per layer (0 SWA, 4 C4A, 128 HCA):
// [0, 0, 4, 128, 4, 128, ..., 4] for its 43 layers (plus one MTP entry), so layers 0-1 are SWA,
// the 21 even layers 2-42 C4A and the 20 odd layers 3-41 HCA. (transformers' default layer_types,
// when a config gives neither, is V4-Pro's: 2 HCA, then HCA / C4A alternating.)
//
// Index sharing (IndexCache on V4): only C4A layers have an indexer, and the Full/Shared schedule
// counts only them: C4A layer number j = 0, 1, ... (its rank among the C4A layers). A Full C4A
// layer runs its indexer; a Shared one reuses the blocks of the most recent Full C4A layer (its
// source) in the same forward pass: only the block numbers are shared. SWA and HCA layers are
// neither (source -1). Rules:
//   pattern  one F/S character per C4A layer; must start with F (the first C4A layer has no source)
//   freq f   "j%f==0"        : Full iff j % f == 0
//            "max(j-1,0)%f"  : Full iff max(j - 1, 0) % f == 0
//   The engines' exact frequency formula for V4 is not pinned by the public sources: the first is
//   the plain modulo rule (ref/schedule.h's freq rule with offset 1, over C4A ranks), the second
//   Megatron's 1-indexed skip rule max(L - offset, 0) % freq with offset 2 and L = j + 1 (ref/
//   schedule.h's default offset 2). On V4-Flash's 21 C4A layers both give 11 indexers at f = 2
//   (j = 0, 2, ..., 20 and j = 0, 1, 3, ..., 19).
#pragma once

#include <string>
#include <vector>

#include "ref/v4/layer.h"

namespace indexshare::ref::v4 {

// V4-Flash's 43 layer types (above).
std::vector<LayerType> flash_layer_types();
// One character per layer: S (SWA), C (C4A), H (HCA); throws Error naming the bad character.
std::vector<LayerType> parse_layer_types(const std::string& text);
std::string format_layer_types(const std::vector<LayerType>& types);

enum class FreqRule { modulo, max_minus_one };
std::string freq_rule_name(FreqRule r);        // "j%f==0" / "max(j-1,0)%f"
FreqRule parse_freq_rule(const std::string& name);  // throws Error naming the bad value

struct Schedule {
  std::vector<LayerType> types;
  std::vector<int> source;  // per layer: C4A its indexer's layer (itself when Full); -1 for SWA / HCA
  bool full(size_t l) const { return source[l] == int(l); }
  int indexers() const;     // the number of Full C4A layers
  std::string pattern() const;  // per layer: F (Full C4A), s (Shared C4A), '.' (no indexer)
};
Schedule all_full(const std::vector<LayerType>& types);
// pattern: one F/S per C4A layer, first F; Error naming the position otherwise.
Schedule from_pattern(const std::vector<LayerType>& types, const std::string& pattern);
Schedule from_freq(const std::vector<LayerType>& types, int freq, FreqRule rule);

struct StackOutputs {
  Schedule schedule;
  std::vector<LayerInputs> inputs;
  std::vector<LayerOutputs> layers;
};
// Every layer of the schedule on generated inputs (make_layer_inputs; Shared C4A layers get no
// indexer inputs), in order, Shared C4A layers taking their source's blocks.
StackOutputs run_stack(const Config& cfg, const Schedule& schedule, const Kernels& kern = {});

}  // namespace indexshare::ref::v4
