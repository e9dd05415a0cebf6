// Hostile input through the indexshare CLI (continued from tests/test_hostile.cc): outputs written
// all or none (never over a folder, FIFO or device), options the chosen mode does not read,
// overrides out of range, problems beyond --max-memory and beyond the size limits. Every refusal
// must exit 2 with a message naming the option or field, before anything is allocated or written.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/cli_util.h"
#include "tests/hostile_util.h"
#include "tools/lib/golden.h"
#include "tools/lib/safetensors.h"

using namespace indexshare;
namespace fs = std::filesystem;

using namespace indexshare::hostile;

// ---- resource limits ------------------------------------------------------------------------

TEST_CASE("hostile: outputs are written all or none, never over a folder, FIFO or device, and limits hold") {
  TmpDir tmp;
  const std::string src = "overlap --problem 'sq16 skv64 hq4 dqk64 dv32 ih4 id32 k8 nl4 sched=FFSS'";
  // One unwritable output: none of the others appears (json and csv were left behind before).
  refused(cli(src + " --json " + tmp / "a.json" + " --csv " + tmp / "a.csv" + " --svg " + tmp / "no/such/dir/x.svg"),
          {"x.svg", "cannot write"});
  CHECK(tmp.entries().empty());
  // Two outputs on one path (the CSV silently replaced the JSON).
  refused(cli(src + " --json " + tmp / "b.json" + " --csv " + tmp / "./b.json"), {"b.json: named for two outputs"});
  refused(cli("search --problem 'sq16 skv64 hq4 dqk64 dv32 ih4 id32 k8 nl2 own=yes' -n 1 --json " + tmp / "s" +
              " --svg " + tmp / "s"),
          {"named for two outputs"});
  CHECK(tmp.entries().empty());
  // A FIFO or a folder in an output's place is refused and left as it was (the rename replaced a
  // FIFO, and /dev/full when run as root).
  const std::string fifo = tmp / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  fs::create_directories(tmp / "dir");
  for (const std::string& out : {fifo, tmp / "dir"}) {
    refused(cli(src + " --json " + out), {"exists and is not a regular file"});
    refused(cli("cost --model glm-5.2 --context 4096 --json " + out), {"exists and is not a regular file"});
    refused(cli("bench --impl ref --model none --json " + out), {"exists and is not a regular file"});
  }
  CHECK(fs::is_fifo(fifo));
  CHECK(fs::is_directory(tmp / "dir"));
  CHECK(tmp.entries() == std::vector<std::string>{"dir", "fifo"});
  // Limits: 100000 threads crashed bench (SIGSEGV), 10^8 buckets ran out of memory, a cost factor
  // of 1e300 printed inf and NaN shares.
  refused(cli("bench --threads 100000 --stack-seq 0"), {"--threads must be in [1, 1024]"});
  refused(cli(src + " --buckets 100000000"), {"--buckets must be in [1, 4096]"});
  refused(cli("cost --model glm-5.2 --context 4096 --flops-per-mac 1e300"), {"flops_per_mac", "<= 1e6, got 1e+300"});
}

TEST_CASE("hostile: an option the chosen mode does not read, or an override out of range, is refused") {
  TmpDir tmp;
  const std::string out = " --out " + tmp / "set";
  // Out of range: never wrapped (4294967297 was int 1 layer) or ignored (negative meant the default).
  for (const std::string& c : std::vector<std::string>{"run --layers -3", "run --layers 0",
                                                      "run --model tiny-glm --layers 4294967297",
                                                      "golden --preset ties --layers 1000001" + out})
    refused(cli(c), {"--layers must be in [1, 10^6]"});
  for (const std::string& c : std::vector<std::string>{"run --model tiny-glm --seq -5", "run --model tiny-glm --seq 2147483648",
                                                      "golden --preset ties --seq 0" + out,
                                                      "golden --model tiny-glm --seq -1" + out})
    refused(cli(c), {"--seq must be in [1, 2^31 - 1]"});
  // Seeds: negative was "not given" (golden used seed 1), 2^64 - 1 saturated to 2^63 - 1.
  refused(cli("golden --problem 'sq4 skv12 hq2 dqk16 dv8 ih2 id16 k4' --seed -7" + out), {"--seed must be >= 0, got -7"});
  refused(cli("run --model tiny-glm --seq 16 --seed -1"), {"--seed must be >= 0, got -1"});
  for (const char* v : {"18446744073709551615", "99999999999999999999"})
    refused(cli(std::string("run --model tiny-glm --seq 16 --seed ") + v), {std::string("--seed: '") + v + "' is out of range"});
  refused(cli("run --layers 99999999999999999999"), {"--layers: '99999999999999999999' is out of range"});
  // Descriptor fields the generator would not read (the run was the same bytes without them).
  refused(cli("run --problem 'sq16 skv64 hq4 dqk64 dv32 ih4 id1 k8 recency=5'"), {"recency and sinks need id >= 2"});
  refused(cli("run --problem 'sq16 skv64 hq4 dqk64 dv32 ih4 id1 k8 sinks=8'"), {"recency and sinks need id >= 2"});
  refused(cli("run --problem 'sq16 skv64 hq4 dqk64 dv32 ih4 id32 k8 indexer=bf16 scale=fp32_amax'"),
          {"scale applies to indexer=fp8 only"});
  // Options of a part the command skips, or of another source (each ran and ignored the option).
  const struct {
    const char* cmd;
    const char* says;
  } skipped[] = {
      {"bench --impl ref --threads 3", "--threads applies to --impl simd only"},
      {"bench --impl ref --target AVX2", "--target applies to --impl simd only"},
      {"bench --stack-seq 0 --stack-sq 7", "--stack-sq applies to the stack only"},
      {"bench --stack-seq 0 --stack-topk 9", "--stack-topk applies to the stack only"},
      {"bench --stack-seq 0 --model none --module-rows 5", "--module-rows applies to the module stage only"},
      {"cost --model glm-5.2 --print-config --json x.json", "--json excludes --print-config"},
      {"cost --model glm-5.2 --print-config --context 4096", "--context excludes --print-config"},
      {"cost --model glm-5.2 --mode decode --prefill-tile 32", "--prefill-tile applies to --mode prefill or both only"},
      {"overlap --golden GOLDEN --from-problem k8", "--from-problem requires --from"},
      {"overlap --golden GOLDEN --max-memory 1K", "--max-memory requires --problem"},
      {"search --golden GOLDEN --max-memory 1K -n 1", "--max-memory requires --problem"},
      {"search --problem 'sq8 skv24 hq2 dqk16 dv8 ih4 id16 k4 nl2 sched=FS' -n 1", "sched=FS is not read"},
      {"search --problem 'sq8 skv24 hq2 dqk16 dv8 ih4 id16 k4 nl2 own=no' -n 1", "own=no is not read"},
      {"golden --preset ties --kind attention-edge OUT", "--preset excludes --kind"},
      {"golden --problem 'sq4 skv12 hq2 dqk16 dv8 ih2 id16 k4' --impl ref --target AVX2 OUT", "--target applies to the simd path"},
      {"run --problem 'sq4 skv12 hq2 dqk16 dv8 ih2 id16 k4' --impl ref --target AVX2", "--target applies to the simd path"},
      {"run --model tiny-glm --seq 16 --impl ref --target AVX2", "--target applies to the simd path"},
      // Empty values meant "not given" (--json "" wrote nothing, --problem "" ran the default).
      {"run --problem ''", "--problem: an empty value"},
      {"overlap --golden GOLDEN --json ''", "--json: an empty value"},
      {"cost --model glm-5.2 --json ''", "--json: an empty value"},
  };
  for (const auto& s : skipped) {
    std::string c = s.cmd;
    for (const auto& [from, to] : {std::pair<std::string, std::string>{"GOLDEN", kEdge.substr(0, kEdge.rfind('/')) + "/ties"},
                                   {"OUT", out.substr(1)}})
      if (const size_t at = c.find(from); at != std::string::npos) c.replace(at, from.size(), to);
    CAPTURE(c);
    refused(cli(c), {s.says});
  }
  // A model config with a duplicated key (the last one won) or that is a folder ("invalid JSON").
  {
    const std::string cfg = tmp / "cfg.json";
    write_bytes(tmp / "cfg0.json", cli("cost --model tiny-glm --print-config").out);
    std::string text = read_bytes(tmp / "cfg0.json");
    REQUIRE(text.find("\"n_layers\"") != std::string::npos);
    text.replace(text.find("\"n_layers\""), 0, "\"n_layers\": 78, ");
    write_bytes(cfg, text);
    refused(cli("cost --config " + cfg), {cfg + ": duplicate key 'n_layers'"});
    CHECK(cli("cost --config " + tmp / "cfg0.json").status == 0);
    refused(cli("cost --config " + tmp.path.string()), {"not a regular file (a folder)"});
    fs::remove(cfg);
    fs::remove(tmp / "cfg0.json");
  }
  // Usage errors carry the same prefix and name the token.
  refused(cli("run --bogus"), {"--bogus"});
  refused(cli("bogus"), {"unknown command 'bogus'", "run, golden"});
  refused(cli("run --model tiny-glm --seed 1e3"), {"--seed", "1e3"});
  refused(cli("verify"), {"--golden is required"});
  // Options of another mode: before, each of these ran the default and ignored the option.
  for (const char* o : {"--seq 100", "--seed 5", "--sim 0.5", "--variant hf_bf16"}) {
    refused(cli(std::string("run ") + o), {std::string(o).substr(0, std::string(o).find(' ')) + " requires --model"});
    refused(cli(std::string("run --problem 'sq4 skv12 hq2 dqk16 dv8 ih2 id16 k4' ") + o), {"requires --model"});
  }
  for (const char* o : {"--schedule FS", "--sim 0.5", "--variant hf_bf16"})
    refused(cli(std::string("golden --preset ties ") + o + out), {"applies to --model only", "sched="});
  for (const char* o : {"--kind stack", "--no-logits"})
    refused(cli(std::string("golden --model tiny-glm ") + o + out), {"applies to kernel-level sets"});
  for (const char* o : {"--seq 5", "--layers 2", "--seed 3", "--kind stack"})
    refused(cli(std::string("golden --from ") + tmp / "dump.safetensors " + o + out),
            {"applies to generated sets", "--from takes shapes"});
  // The module-level toy model is estimated against --max-memory too (its traces keep every
  // layer's [seq, seq] logits): a large --seq was std::bad_alloc, a real preset's 78 layers an
  // allocation of tens of GB.
  refused(cli("golden --model tiny-glm --seq 100000000" + out, 20), {"tiny-glm toy model needs about", "golden set",
                                                                     "use a smaller --seq or --layers"});
  refused(cli("run --model glm-5.2", 20), {"glm-5.2 toy model needs about", "above --max-memory"});
  refused(cli("run --model tiny-glm --seq 64 --max-memory 1K"), {"above --max-memory"});
  CHECK(cli("run --model tiny-glm --seq 64").status == 0);
  CHECK(tmp.entries().empty());
}

TEST_CASE("hostile: problems beyond --max-memory are refused before anything is allocated or written") {
  TmpDir tmp;
  // Shapes whose tensors could never be allocated, or only just: refused at once by the estimate,
  // never std::bad_alloc (exit 3), a signal, a sanitizer report or a hang.
  for (const char* p : {"sq1000000000 skv1000000000", "sq1 skv2147483647 k2147483647",
                        "sq100000 skv100000 hq1 dqk16 dv8 ih1 id16 k4", "sq1 skv1 hq1000000 dqk1000000 dv1"}) {
    CAPTURE(p);
    // The third problem fits in memory where the indexer streams (simd in FP8 mode, --impl auto
    // takes simd there): it is only slow, so it runs only where the estimate must refuse it: with
    // --impl ref, whose indexer materialises one layer's [s_q, s_kv] logits (40 GB).
    const bool streams_fit = std::string(p).rfind("sq100000 ", 0) == 0;
    // Each command suggests the remedies it offers, and no option it lacks.
    struct Cmd {
      std::string cmd;
      std::vector<std::string> offers, lacks;
    };
    const std::vector<std::string> none = {"--rows", "--no-logits", "--stack-seq", "--impl simd"};
    std::vector<Cmd> cmds;
    if (streams_fit) {
      const std::vector<std::string> via = {"use --impl simd (streams the indexer), "};
      cmds = {{"run --impl ref", {via[0] + "--rows", "a smaller --problem"}, {"--no-logits", "--stack-seq"}},
              {"overlap --impl ref", {via[0] + "a smaller --problem"}, {"--rows", "--no-logits", "--stack-seq"}},
              {"search --impl ref", {via[0] + "a smaller --problem"}, {"--rows", "--no-logits", "--stack-seq"}},
              {"golden --no-logits --out " + tmp / "set", {via[0] + "--rows"}, {"--no-logits", "--stack-seq"}},
              {"golden --out " + tmp / "set", {"use --no-logits with --impl simd (the indexer then streams), --rows"}, {}}};
    } else {
      cmds = {{"run", {"use --rows", "a smaller --problem"}, {"--no-logits", "--stack-seq", "--impl simd"}},
              {"overlap", {"use a smaller --problem"}, none},
              {"search", {"use a smaller --problem"}, none},
              {"bench --stack-seq 0", {"use a smaller --problem"}, none},
              {"golden --out " + tmp / "set", {"use --no-logits, --rows", "a smaller --problem"}, {"--impl simd"}},
              {"golden --impl simd --no-logits --out " + tmp / "set", {"use --rows"}, {"--no-logits", "--impl simd"}}};
    }
    for (const Cmd& c : cmds) {
      CAPTURE(c.cmd);
      const Result r = cli(c.cmd + " --problem '" + p + "'", 20);
      std::vector<std::string> needles = c.offers;
      needles.push_back("above --max-memory");
      needles.push_back(", or raise --max-memory");
      refused(r, needles);
      for (const std::string& l : c.lacks) CHECK_MESSAGE(!has(r.out, l), "suggests '" << l << "'");
    }
  }
  // The limit can be lowered; a bad limit is a usage error.
  const std::string small = "golden --problem 'sq4 skv12 hq2 dqk16 dv8 ih2 id16 k4' --out " + tmp / "set";
  refused(cli(small + " --max-memory 1K"), {"above --max-memory"});
  refused(cli(small + " --max-memory lots"), {"--max-memory", "'lots'"});
  refused(cli(small + " --max-memory 8Q"), {"--max-memory", "'8Q'"});
  CHECK(tmp.entries().empty());
  // bench's stack comparison is estimated too (here at 2^31 - 1 keys).
  refused(cli("bench --impl simd --model none --stack-seq 2147483647", 20),
          {"above --max-memory", "for the stack: use a smaller --stack-seq or --stack-sq"});
  // Element counts that overflow int64 are refused as such.
  refused(cli("run --problem 'sq1 skv1 hq1000000000000 dqk1000000000000 dv1' --max-memory 999999999999999"),
          {"problem field hq must be <= 2^31 - 1"});
}

// Regressions found by tests/fuzz/fuzz_problem and by hand (both fixed): nl was bounded only from
// below and truncated to int when the schedule was built (nl3000000000 reported as a negative
// count, nl2147483647 took a minute and 8 GB before any refusal); and the memory estimate could
// exceed 2^64 and wrap, bypassing --max-memory into std::bad_alloc. Problem::validate now bounds
// every field (int32 indices, nl <= 10^6) and the estimate saturates.
// Each must be refused at once with exit 2 naming the field or the limit.
TEST_CASE("hostile: problems beyond the size limits are refused at once naming the field") {
  const std::pair<const char*, const char*> cases[] = {
      {"sq4 skv8 hq1 dqk16 dv8 ih1 id16 k2 nl2147483647", "problem field nl"},
      {"sq4 skv8 hq1 dqk16 dv8 ih1 id16 k2 nl3000000000", "problem field nl"},
      {"sq4 skv8 hq1 dqk16 dv8 ih1 id16 k2 nl4294967297", "problem field nl"},
      {"sq1 skv1 hq1 dqk4000000000000000 dv1 nl2000", "problem field dqk"},
  };
  for (const auto& [p, needle] : cases) {
    CAPTURE(p);
    refused(cli(std::string("run --problem '") + p + "'", 10), {needle});
  }
}
