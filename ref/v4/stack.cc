#include "ref/v4/stack.h"

#include <algorithm>

#include "ref/error.h"

namespace indexshare::ref::v4 {

std::vector<LayerType> flash_layer_types() {
  std::vector<LayerType> t = {LayerType::sliding, LayerType::sliding};
  for (int l = 2; l < 43; ++l) t.push_back(l % 2 == 0 ? LayerType::csa : LayerType::hca);
  return t;
}

std::vector<LayerType> parse_layer_types(const std::string& text) {
  std::vector<LayerType> t;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    require(c == 'S' || c == 'C' || c == 'H', "v4 layer types: character '" + std::string(1, c) + "' at " +
                                                  std::to_string(i) + " is not S, C or H");
    t.push_back(c == 'S' ? LayerType::sliding : c == 'C' ? LayerType::csa : LayerType::hca);
  }
  return t;
}

std::string format_layer_types(const std::vector<LayerType>& types) {
  std::string s;
  for (LayerType t : types) s += layer_type_char(t);
  return s;
}

std::string freq_rule_name(FreqRule r) { return r == FreqRule::modulo ? "j%f==0" : "max(j-1,0)%f"; }

FreqRule parse_freq_rule(const std::string& name) {
  if (name == "j%f==0") return FreqRule::modulo;
  if (name == "max(j-1,0)%f") return FreqRule::max_minus_one;
  throw Error("v4 freq rule: unknown value '" + name + "' (expected j%f==0 or max(j-1,0)%f)");
}

int Schedule::indexers() const {
  int n = 0;
  for (size_t l = 0; l < source.size(); ++l) n += full(l) ? 1 : 0;
  return n;
}

std::string Schedule::pattern() const {
  std::string s;
  for (size_t l = 0; l < source.size(); ++l) s += source[l] < 0 ? '.' : full(l) ? 'F' : 's';
  return s;
}

namespace {
// The schedule whose C4A layer of rank j is Full iff is_full(j).
template <class IsFull>
Schedule build(const std::vector<LayerType>& types, IsFull&& is_full) {
  Schedule s;
  s.types = types;
  s.source.assign(types.size(), -1);
  int j = 0, current = -1;
  for (size_t l = 0; l < types.size(); ++l) {
    if (types[l] != LayerType::csa) continue;
    if (is_full(j)) current = int(l);
    require(current >= 0, "v4 schedule: the first C4A layer (layer " + std::to_string(l) + ") must be Full");
    s.source[l] = current;
    ++j;
  }
  return s;
}

int count_csa(const std::vector<LayerType>& types) {
  return int(std::count(types.begin(), types.end(), LayerType::csa));
}
}  // namespace

Schedule all_full(const std::vector<LayerType>& types) {
  return build(types, [](int) { return true; });
}

Schedule from_pattern(const std::vector<LayerType>& types, const std::string& pattern) {
  require(int(pattern.size()) == count_csa(types), "v4 schedule pattern: " + std::to_string(pattern.size()) +
                                                       " characters for " + std::to_string(count_csa(types)) +
                                                       " C4A layers");
  for (size_t i = 0; i < pattern.size(); ++i)
    require(pattern[i] == 'F' || pattern[i] == 'S', "v4 schedule pattern: character '" + std::string(1, pattern[i]) +
                                                        "' at " + std::to_string(i) + " is not F or S");
  require(pattern.empty() || pattern[0] == 'F', "v4 schedule pattern: must start with F, got '" + pattern + "'");
  return build(types, [&](int j) { return pattern[size_t(j)] == 'F'; });
}

Schedule from_freq(const std::vector<LayerType>& types, int freq, FreqRule rule) {
  require(freq >= 1, "v4 schedule freq: must be >= 1, got " + std::to_string(freq));
  return build(types, [&](int j) { return (rule == FreqRule::modulo ? j : std::max(j - 1, 0)) % freq == 0; });
}

StackOutputs run_stack(const Config& cfg, const Schedule& schedule, const Kernels& kern) {
  require(schedule.source.size() == schedule.types.size(), "v4 run_stack: schedule source and types differ in length");
  StackOutputs st;
  st.schedule = schedule;
  for (size_t l = 0; l < schedule.types.size(); ++l) {
    const LayerType t = schedule.types[l];
    const bool own_indexer = t == LayerType::csa && schedule.full(l);
    st.inputs.push_back(make_layer_inputs(cfg, int(l), t, own_indexer, kern));
    const Tensor<int32_t>* shared =
        t == LayerType::csa && !own_indexer ? &st.layers[size_t(schedule.source[l])].blocks : nullptr;
    st.layers.push_back(run_layer(cfg, st.inputs.back(), shared, kern));
  }
  return st;
}

}  // namespace indexshare::ref::v4
