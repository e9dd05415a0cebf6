#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ref/error.h"
#include "ref/schedule.h"

using indexshare::Error;
using indexshare::LayerKind;
using indexshare::Schedule;
using indexshare::ScheduleSpec;

namespace {

// The message of the indexshare::Error that f throws, or "<no error>" if it returns normally.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Checks that f throws indexshare::Error whose message contains every string in parts.
#define CHECK_ERROR_NAMES(expr, ...)                                        \
  do {                                                                      \
    const std::string msg_ = error_of([&] { (void)(expr); });               \
    for (const std::string& part_ : std::vector<std::string>{__VA_ARGS__}) { \
      INFO("message: " << msg_);                                            \
      CHECK_MESSAGE(contains(msg_, part_), "missing '" << part_ << "'");    \
    }                                                                       \
  } while (0)

// The GLM-5.2 full layers written out by hand: 0, 1, 2, then every 4th layer from 6 to 74.
const std::vector<int> kGlm52Full = {0,  1,  2,  6,  10, 14, 18, 22, 26, 30, 34,
                                     38, 42, 46, 50, 54, 58, 62, 66, 70, 74};

// A pattern string built from a list of full layers, by hand, for comparison.
std::string pattern_with_full(int n_layers, const std::vector<int>& full) {
  std::string p(size_t(n_layers), 'S');
  for (int i : full) p[size_t(i)] = 'F';
  return p;
}

}  // namespace

TEST_CASE("schedule: default spec is all full") {
  const Schedule s = indexshare::resolve_schedule(5, ScheduleSpec{});
  CHECK(s.n_layers() == 5);
  CHECK(s.pattern() == "FFFFF");
  CHECK(s.n_full() == 5);
  CHECK(s.full_layers() == std::vector<int>{0, 1, 2, 3, 4});
  for (int i = 0; i < 5; ++i) {
    CHECK(s.is_full(i));
    CHECK(s.source(i) == i);
  }
}

TEST_CASE("schedule: original IndexCache rule, freq 4 with default offset 2") {
  ScheduleSpec spec;
  spec.freq = 4;  // offset stays at its default, 2
  const Schedule s = indexshare::resolve_schedule(16, spec);
  CHECK(s.pattern() == "FFSSSFSSSFSSSFSS");
  CHECK(s.full_layers() == std::vector<int>{0, 1, 5, 9, 13});
  CHECK(s == indexshare::schedule_from_freq(16, 4, 2));
}

TEST_CASE("schedule: frequency rule with other freq and offset values") {
  CHECK(indexshare::schedule_from_freq(7, 2, 2).pattern() == "FFSFSFS");  // full 0, 1, 3, 5
  CHECK(indexshare::schedule_from_freq(7, 3, 1).pattern() == "FSSFSSF");  // full 0, 3, 6
  CHECK(indexshare::schedule_from_freq(4, 1, 0).pattern() == "FFFF");     // freq 1: all full
  CHECK(indexshare::schedule_from_freq(6, 4, 5).pattern() == "FFFFFS");   // full 0..4, then 8 ...
  CHECK(indexshare::schedule_from_freq(5, 4, 100).pattern() == "FFFFF");  // offset past the end
  CHECK(indexshare::schedule_from_freq(1, 4, 3).pattern() == "F");
}

TEST_CASE("schedule: GLM-5.2 preset, 78 layers, 21 full") {
  REQUIRE(indexshare::kGlm52Layers == 78);
  const Schedule s = indexshare::schedule_preset("glm-5.2", 78);
  CHECK(s.n_layers() == 78);
  CHECK(s.n_full() == 21);
  CHECK(s.full_layers() == kGlm52Full);
  CHECK(s.pattern() == pattern_with_full(78, kGlm52Full));
  CHECK(s.pattern().substr(0, 14) == "FFFSSSFSSSFSSS");
  CHECK(s.pattern().substr(70) == "FSSSFSSS");  // layers 70..77: full 70, 74; 75..77 shared
  for (int i = 0; i < 78; ++i) {
    const bool expect_full =
        std::find(kGlm52Full.begin(), kGlm52Full.end(), i) != kGlm52Full.end();
    CHECK_MESSAGE(s.is_full(i) == expect_full, "layer " << i);
  }

  // The same schedule from the engine configuration (freq 4, offset 3).
  ScheduleSpec spec;
  spec.freq = 4;
  spec.offset = 3;
  CHECK(indexshare::resolve_schedule(78, spec) == s);
}

TEST_CASE("schedule: GLM-5.2 rule applied to other layer counts") {
  CHECK(indexshare::schedule_preset("glm-5.2", 10).pattern() == "FFFSSSFSSS");
  CHECK(indexshare::schedule_preset("glm-5.2", 3).pattern() == "FFF");
  CHECK(indexshare::schedule_preset("glm-5.2", 11).full_layers() == std::vector<int>{0, 1, 2, 6, 10});
}

TEST_CASE("schedule: all-full and one-full-three-shared presets") {
  CHECK(indexshare::schedule_preset("all-full", 6).pattern() == "FFFFFF");
  const Schedule s = indexshare::schedule_preset("one-full-three-shared", 9);
  CHECK(s.pattern() == "FSSSFSSSF");
  CHECK(s.full_layers() == std::vector<int>{0, 4, 8});
  CHECK(indexshare::schedule_preset_names() ==
        std::vector<std::string>{"all-full", "glm-5.2", "one-full-three-shared", "hy-v4"});
}

TEST_CASE("schedule: hy-v4 preset is transformers' hy_v4 default") {
  // HYV4Config: "full" if layer_idx == 0 or (layer_idx - 1) % 4 == 0, else "shared" (34 layers).
  const Schedule s = indexshare::schedule_preset("hy-v4", 34);
  for (int i = 0; i < 34; ++i) CHECK(s.is_full(i) == (i == 0 || (i - 1) % 4 == 0));
  CHECK(s.pattern().substr(0, 10) == "FFSSSFSSSF");
  CHECK(s.n_full() == 10);  // 0, 1, 5, 9, ..., 33
  CHECK(indexshare::parse_schedule("hy-v4", 6).pattern() == "FFSSSF");
}

TEST_CASE("schedule: explicit list and pattern rules") {
  ScheduleSpec list_spec;
  list_spec.indexer_types = std::vector<std::string>{"full", "shared", "full", "shared", "shared"};
  const Schedule a = indexshare::resolve_schedule(5, list_spec);
  CHECK(a.kinds == std::vector<LayerKind>{LayerKind::full, LayerKind::shared, LayerKind::full,
                                          LayerKind::shared, LayerKind::shared});
  CHECK(a.pattern() == "FSFSS");

  ScheduleSpec pattern_spec;
  pattern_spec.pattern = "FFSFS";
  const Schedule b = indexshare::resolve_schedule(5, pattern_spec);
  CHECK(b.kinds == std::vector<LayerKind>{LayerKind::full, LayerKind::full, LayerKind::shared,
                                          LayerKind::full, LayerKind::shared});
  CHECK(indexshare::schedule_from_pattern("FFSFS") == b);
}

TEST_CASE("schedule: precedence is list, then pattern, then frequency") {
  ScheduleSpec spec;
  spec.freq = 2;
  spec.offset = 1;  // alone: FSFS
  CHECK(indexshare::resolve_schedule(4, spec).pattern() == "FSFS");

  spec.pattern = "FFSS";  // the pattern beats the frequency rule
  CHECK(indexshare::resolve_schedule(4, spec).pattern() == "FFSS");

  spec.indexer_types = std::vector<std::string>{"full", "shared", "shared", "full"};
  CHECK(indexshare::resolve_schedule(4, spec).pattern() == "FSSF");  // the list beats both

  // Fields of a rule not used are not looked at: a bad freq or pattern is ignored under a list.
  ScheduleSpec ignored;
  ignored.indexer_types = std::vector<std::string>{"full", "full"};
  ignored.pattern = "XYZ";
  ignored.freq = 0;
  ignored.offset = -5;
  CHECK(indexshare::resolve_schedule(2, ignored).pattern() == "FF");
}

TEST_CASE("schedule: source of shared layers is the most recent full layer") {
  const Schedule s = indexshare::schedule_from_pattern("FSFSSF");
  const std::vector<int> expected = {0, 0, 2, 2, 2, 5};
  for (int i = 0; i < 6; ++i) CHECK_MESSAGE(s.source(i) == expected[size_t(i)], "layer " << i);

  const Schedule glm = indexshare::schedule_preset("glm-5.2", 78);
  CHECK(glm.source(2) == 2);
  CHECK(glm.source(3) == 2);
  CHECK(glm.source(5) == 2);
  CHECK(glm.source(6) == 6);
  CHECK(glm.source(9) == 6);
  CHECK(glm.source(74) == 74);
  CHECK(glm.source(77) == 74);

  CHECK_ERROR_NAMES(s.source(6), "layer 6", "[0, 6)");
  CHECK_ERROR_NAMES(s.source(-1), "layer -1");
  CHECK_ERROR_NAMES(s.is_full(7), "layer 7");

  // A hand-built schedule that skips validate(): the shared layer has no source.
  Schedule bad;
  bad.kinds = {LayerKind::shared, LayerKind::full};
  CHECK_ERROR_NAMES(bad.source(0), "shared layer 0", "no preceding full layer");
  CHECK(bad.source(1) == 1);
}

TEST_CASE("schedule: validate of hand-built schedules") {
  Schedule ok;
  ok.kinds = {LayerKind::full, LayerKind::shared};
  CHECK_NOTHROW(ok.validate());
  CHECK_ERROR_NAMES(Schedule{}.validate(), "n_layers", "got 0");
  Schedule bad;
  bad.kinds = {LayerKind::shared, LayerKind::full};
  CHECK_ERROR_NAMES(bad.validate(), "'SF'", "layer 0 is shared");
}

TEST_CASE("schedule: error, first layer shared") {
  CHECK_ERROR_NAMES(indexshare::schedule_from_pattern("SFF"), "'SFF'", "layer 0 is shared");
  ScheduleSpec pattern_spec;
  pattern_spec.pattern = "SF";
  CHECK_ERROR_NAMES(indexshare::resolve_schedule(2, pattern_spec), "'SF'", "layer 0 is shared");
  ScheduleSpec list_spec;
  list_spec.indexer_types = std::vector<std::string>{"shared", "full"};
  CHECK_ERROR_NAMES(indexshare::resolve_schedule(2, list_spec), "'SF'", "layer 0 is shared");
  // offset 0 with freq > 1: max(0 - 0 + 1, 0) % 2 == 1, so layer 0 is shared.
  CHECK_ERROR_NAMES(indexshare::schedule_from_freq(4, 2, 0), "freq 2", "offset 0",
                    "layer 0 is shared");
}

TEST_CASE("schedule: error, pattern of the wrong length or with a bad character") {
  ScheduleSpec spec;
  spec.pattern = "FFS";
  CHECK_ERROR_NAMES(indexshare::resolve_schedule(4, spec), "'FFS'", "3 chars", "n_layers is 4");
  spec.pattern = "FFSSF";
  CHECK_ERROR_NAMES(indexshare::resolve_schedule(4, spec), "'FFSSF'", "5 chars", "n_layers is 4");
  spec.pattern = "FFxS";
  CHECK_ERROR_NAMES(indexshare::resolve_schedule(4, spec), "'x'", "position 2");
  CHECK_ERROR_NAMES(indexshare::schedule_from_pattern("FSf"), "'f'", "position 2");
  CHECK_ERROR_NAMES(indexshare::schedule_from_pattern("F S"), "' '", "position 1");
  CHECK_ERROR_NAMES(indexshare::schedule_from_pattern(std::string("F\nS")), "0x0a", "position 1");
  CHECK_ERROR_NAMES(indexshare::schedule_from_pattern(""), "empty");
}

TEST_CASE("schedule: error, bad freq, offset or n_layers") {
  CHECK_ERROR_NAMES(indexshare::schedule_from_freq(4, 0, 2), "freq", "got 0");
  CHECK_ERROR_NAMES(indexshare::schedule_from_freq(4, -3, 2), "freq", "got -3");
  CHECK_ERROR_NAMES(indexshare::schedule_from_freq(4, 4, -1), "offset", "got -1");
  CHECK_ERROR_NAMES(indexshare::schedule_from_freq(0, 1, 2), "n_layers", "got 0");
  CHECK_ERROR_NAMES(indexshare::schedule_from_freq(-2, 1, 2), "n_layers", "got -2");

  ScheduleSpec spec;
  spec.freq = 0;
  CHECK_ERROR_NAMES(indexshare::resolve_schedule(4, spec), "freq", "got 0");
  CHECK_ERROR_NAMES(indexshare::resolve_schedule(0, ScheduleSpec{}), "n_layers", "got 0");
  CHECK_ERROR_NAMES(indexshare::schedule_preset("all-full", 0), "n_layers", "got 0");
  CHECK_ERROR_NAMES(indexshare::parse_schedule("all-full", -1), "n_layers", "got -1");
}

TEST_CASE("schedule: error, bad explicit list") {
  ScheduleSpec spec;
  spec.indexer_types = std::vector<std::string>{"full", "Full", "shared"};
  CHECK_ERROR_NAMES(indexshare::resolve_schedule(3, spec), "entry 1", "'Full'");
  spec.indexer_types = std::vector<std::string>{"full", "shared", "partial"};
  CHECK_ERROR_NAMES(indexshare::resolve_schedule(3, spec), "entry 2", "'partial'");
  spec.indexer_types = std::vector<std::string>{"full", "shared"};
  CHECK_ERROR_NAMES(indexshare::resolve_schedule(3, spec), "2 entries", "n_layers is 3");
}

TEST_CASE("schedule: error, unknown preset") {
  CHECK_ERROR_NAMES(indexshare::schedule_preset("glm-5", 78), "'glm-5'", "all-full", "glm-5.2",
                    "one-full-three-shared");
  CHECK_ERROR_NAMES(indexshare::schedule_preset("", 4), "preset ''");
}

TEST_CASE("schedule: parse_schedule forms") {
  CHECK(indexshare::parse_schedule("all-full", 3).pattern() == "FFF");
  CHECK(indexshare::parse_schedule("glm-5.2", 78).full_layers() == kGlm52Full);
  CHECK(indexshare::parse_schedule("glm-5.2", 8).pattern() == "FFFSSSFS");
  CHECK(indexshare::parse_schedule("one-full-three-shared", 6).pattern() == "FSSSFS");
  CHECK(indexshare::parse_schedule("FFSFS", 5).pattern() == "FFSFS");
  CHECK(indexshare::parse_schedule("pattern:FSSF", 4).pattern() == "FSSF");
  CHECK(indexshare::parse_schedule("freq:4,offset:3", 10).pattern() == "FFFSSSFSSS");
  CHECK(indexshare::parse_schedule("offset:3,freq:4", 10).pattern() == "FFFSSSFSSS");
  CHECK(indexshare::parse_schedule("freq:4", 10).pattern() == "FFSSSFSSSF");  // offset 2
  CHECK(indexshare::parse_schedule("freq:1", 3).pattern() == "FFF");
  CHECK(indexshare::parse_schedule("list:full,shared,full", 3).pattern() == "FSF");
}

TEST_CASE("schedule: parse_schedule round trips through to_string") {
  const std::vector<Schedule> cases = {
      indexshare::schedule_preset("glm-5.2", 78),
      indexshare::schedule_preset("one-full-three-shared", 13),
      indexshare::schedule_preset("all-full", 1),
      indexshare::schedule_from_pattern("FSFFSSSF"),
      indexshare::schedule_from_freq(20, 3, 2),
  };
  for (const Schedule& s : cases) {
    const std::string text = indexshare::to_string(s);
    CHECK(text == s.pattern());
    CHECK(indexshare::parse_schedule(text, s.n_layers()) == s);
    CHECK(indexshare::parse_schedule("pattern:" + text, s.n_layers()) == s);
  }
  CHECK(indexshare::to_string(indexshare::parse_schedule("freq:4,offset:1", 6)) == "FSSSFS");
}

TEST_CASE("schedule: parse_schedule errors name the bad text") {
  CHECK_ERROR_NAMES(indexshare::parse_schedule("glm5", 4), "'glm5'", "preset", "freq:N");
  CHECK_ERROR_NAMES(indexshare::parse_schedule("", 4), "''");
  CHECK_ERROR_NAMES(indexshare::parse_schedule("FFS", 4), "'FFS'", "3 chars", "n_layers is 4");
  CHECK_ERROR_NAMES(indexshare::parse_schedule("pattern:FFSX", 4), "'pattern:FFSX'", "'X'",
                    "position 3");
  CHECK_ERROR_NAMES(indexshare::parse_schedule("pattern:SFFF", 4), "'pattern:SFFF'",
                    "layer 0 is shared");
  CHECK_ERROR_NAMES(indexshare::parse_schedule("freq:four", 4), "'freq:four'", "integer");
  CHECK_ERROR_NAMES(indexshare::parse_schedule("freq:", 4), "'freq:'", "integer");
  CHECK_ERROR_NAMES(indexshare::parse_schedule("freq:4,offset:3x", 4), "'offset:3x'");
  CHECK_ERROR_NAMES(indexshare::parse_schedule("freq:4,offset:9999999999", 4), "'offset:9999999999'");
  CHECK_ERROR_NAMES(indexshare::parse_schedule("freq:4,step:3", 4), "'step:3'");
  CHECK_ERROR_NAMES(indexshare::parse_schedule("freq:4,freq:2", 4), "'freq' given twice");
  CHECK_ERROR_NAMES(indexshare::parse_schedule("offset:3", 4), "'offset:3'", "freq:N");
  CHECK_ERROR_NAMES(indexshare::parse_schedule("freq:0", 4), "'freq:0'", "freq", "got 0");
  CHECK_ERROR_NAMES(indexshare::parse_schedule("freq:4,offset:-1", 4), "'freq:4,offset:-1'",
                    "offset", "got -1");
  CHECK_ERROR_NAMES(indexshare::parse_schedule("freq:2,offset:0", 4), "'freq:2,offset:0'",
                    "layer 0 is shared");
  CHECK_ERROR_NAMES(indexshare::parse_schedule("list:full,sharde,full", 3),
                    "'list:full,sharde,full'", "'sharde'", "entry 1");
  CHECK_ERROR_NAMES(indexshare::parse_schedule("list:full,,full", 3), "entry 1", "''");
  CHECK_ERROR_NAMES(indexshare::parse_schedule("list:full,shared", 3), "'list:full,shared'",
                    "2 entries", "n_layers is 3");
}
