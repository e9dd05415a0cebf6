#include "ref/schedule.h"

#include <algorithm>
#include <cstdio>

#include "ref/error.h"

namespace indexshare {

namespace {

// A char for an error message: 'c' when printable, else its code as 0xNN.
std::string quote_char(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u >= 0x20 && u < 0x7f) return std::string("'") + c + "'";
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", unsigned(u));
  return buf;
}

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

void require_layers(int n_layers) {
  require(n_layers >= 1, "schedule: n_layers must be >= 1, got " + std::to_string(n_layers));
}

// Checks that pattern has only 'F' / 'S' chars, naming the first bad position and char.
void check_pattern_chars(const std::string& pattern) {
  for (size_t i = 0; i < pattern.size(); ++i) {
    require(pattern[i] == 'F' || pattern[i] == 'S',
            "schedule pattern '" + pattern + "': character " + quote_char(pattern[i]) +
                " at position " + std::to_string(i) + " is not 'F' (full) or 'S' (shared)");
  }
}

// Splits text at every sep; "a,,b" gives {"a", "", "b"} and "" gives {""}.
std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(sep, start);
    if (end == std::string::npos) {
      out.push_back(text.substr(start));
      return out;
    }
    out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
}

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

// Parses an optional '-' followed by 1 to 9 decimal digits, the whole of digits; else throws
// Error naming item and text.
int parse_int(const std::string& text, const std::string& item, const std::string& digits) {
  size_t i = (!digits.empty() && digits[0] == '-') ? 1 : 0;
  bool ok = digits.size() > i && digits.size() - i <= 9;
  for (size_t j = i; j < digits.size(); ++j) ok = ok && digits[j] >= '0' && digits[j] <= '9';
  require(ok, "schedule '" + text + "': item '" + item + "' needs a decimal integer");
  return std::stoi(digits);
}

// The "freq:N[,offset:M]" form (items in either order, each at most once).
Schedule parse_freq_form(const std::string& text, int n_layers) {
  std::optional<int> freq, offset;
  for (const std::string& item : split(text, ',')) {
    const size_t colon = item.find(':');
    const std::string key = item.substr(0, colon);
    std::optional<int>* slot = key == "freq" ? &freq : key == "offset" ? &offset : nullptr;
    require(slot != nullptr && colon != std::string::npos,
            "schedule '" + text + "': unknown item '" + item + "' (expected freq:N or offset:N)");
    require(!slot->has_value(), "schedule '" + text + "': '" + key + "' given twice");
    *slot = parse_int(text, item, item.substr(colon + 1));
  }
  require(freq.has_value(), "schedule '" + text + "': the frequency form needs freq:N");
  ScheduleSpec spec;
  spec.freq = *freq;
  if (offset) spec.offset = *offset;
  return resolve_schedule(n_layers, spec);
}

}  // namespace

bool Schedule::is_full(int i) const {
  require(i >= 0 && i < n_layers(), "schedule: layer " + std::to_string(i) +
                                        " out of range [0, " + std::to_string(n_layers()) + ")");
  return kinds[size_t(i)] == LayerKind::full;
}

int Schedule::source(int i) const {
  for (int j = i; j >= 0; --j) {
    if (is_full(j)) return j;  // is_full(i) checks the range of i first
  }
  throw Error("schedule '" + pattern() + "': shared layer " + std::to_string(i) +
              " has no preceding full layer");
}

int Schedule::n_full() const {
  return int(std::count(kinds.begin(), kinds.end(), LayerKind::full));
}

std::string Schedule::pattern() const {
  std::string out;
  for (LayerKind k : kinds) out += k == LayerKind::full ? 'F' : 'S';
  return out;
}

std::vector<int> Schedule::full_layers() const {
  std::vector<int> out;
  for (int i = 0; i < n_layers(); ++i) {
    if (kinds[size_t(i)] == LayerKind::full) out.push_back(i);
  }
  return out;
}

void Schedule::validate() const {
  require(!kinds.empty(), "schedule: n_layers must be >= 1, got 0");
  require(kinds[0] == LayerKind::full,
          "schedule '" + pattern() +
              "': layer 0 is shared, but a shared layer needs a preceding full layer");
}

Schedule resolve_schedule(int n_layers, const ScheduleSpec& spec) {
  require_layers(n_layers);
  Schedule s;
  if (spec.indexer_types) {
    const std::vector<std::string>& types = *spec.indexer_types;
    require(types.size() == size_t(n_layers),
            "schedule indexer_types: has " + std::to_string(types.size()) +
                " entries, but n_layers is " + std::to_string(n_layers));
    for (size_t i = 0; i < types.size(); ++i) {
      require(types[i] == "full" || types[i] == "shared",
              "schedule indexer_types: entry " + std::to_string(i) + " is '" + types[i] +
                  "', expected 'full' or 'shared'");
      s.kinds.push_back(types[i] == "full" ? LayerKind::full : LayerKind::shared);
    }
    s.validate();
    return s;
  }
  if (spec.pattern) {
    const std::string& p = *spec.pattern;
    check_pattern_chars(p);
    require(p.size() == size_t(n_layers), "schedule pattern '" + p + "': has " +
                                              std::to_string(p.size()) +
                                              " chars, but n_layers is " +
                                              std::to_string(n_layers));
    return schedule_from_pattern(p);
  }
  return schedule_from_freq(n_layers, spec.freq, spec.offset);
}

Schedule schedule_from_pattern(const std::string& pattern) {
  require(!pattern.empty(), "schedule pattern is empty: n_layers must be >= 1");
  check_pattern_chars(pattern);
  Schedule s;
  for (char c : pattern) s.kinds.push_back(c == 'F' ? LayerKind::full : LayerKind::shared);
  s.validate();
  return s;
}

Schedule schedule_from_freq(int n_layers, int freq, int offset) {
  require_layers(n_layers);
  require(freq >= 1, "schedule freq must be >= 1, got " + std::to_string(freq));
  require(offset >= 0, "schedule offset must be >= 0, got " + std::to_string(offset));
  Schedule s;
  for (int i = 0; i < n_layers; ++i) {
    const long long shifted = std::max<long long>((long long)i - offset + 1, 0);
    s.kinds.push_back(shifted % freq == 0 ? LayerKind::full : LayerKind::shared);
  }
  require(s.kinds[0] == LayerKind::full,
          "schedule freq " + std::to_string(freq) + " offset " + std::to_string(offset) +
              ": layer 0 is shared, but a shared layer needs a preceding full layer");
  return s;
}

Schedule schedule_preset(const std::string& name, int n_layers) {
  require_layers(n_layers);
  if (name == "all-full") return schedule_from_freq(n_layers, 1, 2);
  if (name == "glm-5.2") return schedule_from_freq(n_layers, 4, 3);
  if (name == "one-full-three-shared") return schedule_from_freq(n_layers, 4, 1);
  if (name == "hy-v4") return schedule_from_freq(n_layers, 4, 2);
  throw Error("schedule preset '" + name + "' is unknown; known presets: " +
              join(schedule_preset_names(), ", "));
}

std::vector<std::string> schedule_preset_names() {
  return {"all-full", "glm-5.2", "one-full-three-shared", "hy-v4"};
}

namespace {

// parse_schedule without the error prefix naming the whole text.
Schedule parse_schedule_text(const std::string& text, int n_layers) {
  const std::vector<std::string> presets = schedule_preset_names();
  if (std::find(presets.begin(), presets.end(), text) != presets.end()) {
    return schedule_preset(text, n_layers);
  }
  if (starts_with(text, "pattern:")) {
    ScheduleSpec spec;
    spec.pattern = text.substr(8);
    return resolve_schedule(n_layers, spec);
  }
  if (starts_with(text, "freq:") || starts_with(text, "offset:")) {
    return parse_freq_form(text, n_layers);
  }
  if (starts_with(text, "list:")) {
    ScheduleSpec spec;
    spec.indexer_types = split(text.substr(5), ',');
    return resolve_schedule(n_layers, spec);
  }
  const bool all_fs = !text.empty() && text.find_first_not_of("FS") == std::string::npos;
  require(all_fs, "schedule '" + text + "' is not understood; expected a preset (" +
                      join(presets, ", ") +
                      "), an F/S pattern (optionally 'pattern:FFSS...'), "
                      "'freq:N[,offset:M]', or 'list:full,shared,...'");
  ScheduleSpec spec;
  spec.pattern = text;
  return resolve_schedule(n_layers, spec);
}

}  // namespace

Schedule parse_schedule(const std::string& text, int n_layers) {
  require_layers(n_layers);
  const std::string prefix = "schedule '" + text + "'";
  try {
    return parse_schedule_text(text, n_layers);
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.find("'" + text + "'") != std::string::npos) throw;  // already names the text
    // "schedule offset must be ..." -> "schedule 'freq:4,offset:-1': offset must be ...".
    throw Error(prefix + ": " + (starts_with(what, "schedule ") ? what.substr(9) : what));
  }
}

std::string to_string(const Schedule& s) { return s.pattern(); }

}  // namespace indexshare
