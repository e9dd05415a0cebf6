// Tests of the indexshare command line: exit codes, summary and replay line, clear errors.
#include <doctest/doctest.h>

#include "tests/cli_util.h"

#include <array>
#include <cstdio>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

namespace {
using Result = indexshare::testing::CliResult;
Result cli(const std::string& args) { return indexshare::testing::run_cli(args); }
}  // namespace

TEST_CASE("cli: run prints a summary and a replay line") {
  Result r = cli("run --problem 'sq8 skv40 hq2 dqk16 dv8 ih2 id16 k4 seed3'");
  CHECK(r.status == 0);
  CHECK(r.out.find("problem   sq8 skv40 hq2 dqk16 dv8 ih2 id16 k4 seed3") != std::string::npos);
  CHECK(r.out.find("__REPRO: indexshare run --impl ref --problem \"sq8 skv40 hq2 dqk16 dv8 ih2 id16 k4 seed3\"") != std::string::npos);
  // The same command prints the same fingerprints.
  Result again = cli("run --problem 'sq8 skv40 hq2 dqk16 dv8 ih2 id16 k4 seed3'");
  CHECK(again.out.substr(again.out.find("layer   0"), 120) == r.out.substr(r.out.find("layer   0"), 120));
  // A stack with index sharing, and the toy module-level model.
  r = cli("run --problem 'sq8 skv40 hq2 dqk16 dv8 ih2 id16 k4 nl3 sched=FSS'");
  CHECK(r.status == 0);
  CHECK(r.out.find("layer   2 shared source   0") != std::string::npos);
  r = cli("run --model tiny-glm --seq 40 --layers 4");
  CHECK(r.status == 0);
  CHECK(r.out.find("schedule  FFFS") != std::string::npos);
  CHECK(r.out.find("layer   3 shared source   2") != std::string::npos);
  CHECK(cli("run --model tiny-glm --schedule SFFF").status == 2);
  CHECK(cli("run --model glm-9").status == 2);
}

TEST_CASE("cli: bad input exits 2 with the bad token named") {
  Result r = cli("run --problem 'sq8 skv4'");
  CHECK(r.status == 2);
  CHECK(r.out.find("skv (4) must be >= sq (8)") != std::string::npos);
  r = cli("run --problem 'sq8 bogus=1'");
  CHECK(r.status == 2);
  CHECK(r.out.find("'bogus=1'") != std::string::npos);
  r = cli("run --impl gpu");
  CHECK(r.status == 2);
  CHECK(r.out.find("'gpu'") != std::string::npos);
  CHECK(cli("").status == 2);
  CHECK(cli("no-such-command").status == 2);
  CHECK(cli("--help").status == 0);
}

TEST_CASE("cli: golden writes a set, verify checks it, bad input exits 2 without output") {
  const std::string dir = "/tmp/indexshare-cli-golden-" + std::to_string(::getpid());
  std::system(("rm -rf " + dir).c_str());
  Result r = cli("golden --problem 'sq4 skv12 hq2 dqk16 dv8 ih2 id16 k4 nl2 sched=FS' --out " + dir + "/g");
  CHECK(r.status == 0);
  CHECK(r.out.find("schedule  FS") != std::string::npos);
  CHECK(r.out.find("__REPRO: indexshare golden --problem \"sq4 skv12 hq2 dqk16 dv8 ih2 id16 k4 seed1 nl2 sched=FS\" --kind stack --out " + dir + "/g") != std::string::npos);
  // The replay command is printed once, as the __REPRO line.
  CHECK(r.out.find("indexshare golden --problem") == r.out.rfind("indexshare golden --problem"));
  r = cli("verify --golden " + dir + "/g");
  CHECK(r.status == 0);
  CHECK(r.out.find("verified") != std::string::npos);
  // Writing again without --force refuses; a bad problem leaves no folder behind.
  r = cli("golden --problem 'sq4 skv12 hq2 dqk16 dv8 ih2 id16 k4' --out " + dir + "/g");
  CHECK(r.status == 2);
  CHECK(r.out.find("--force") != std::string::npos);
  r = cli("golden --problem 'sq4 skv12 nl2 sched=SF' --out " + dir + "/bad");
  CHECK(r.status == 2);
  CHECK(r.out.find("SF") != std::string::npos);
  CHECK(cli("verify --golden " + dir + "/bad").status == 2);
  CHECK(cli("golden --preset nope --out " + dir + "/x").status == 2);
  CHECK(cli("golden --out " + dir + "/x").status == 2);  // neither --preset nor --problem
  r = cli("presets");
  CHECK(r.status == 0);
  CHECK(r.out.find("glm-5.2") != std::string::npos);
  std::system(("rm -rf " + dir).c_str());
}

TEST_CASE("cli: --impl simd reproduces ref's outputs, --target and --max-memory are honoured") {
  const std::string prob = "--problem 'sq8 skv40 hq2 dqk16 dv8 ih4 id16 k4 nl3 sched=FSF seed5'";
  auto layers = [](const std::string& out) {  // the per-layer lines, fingerprints included
    std::string lines;
    size_t pos = 0;
    while ((pos = out.find("layer ", pos)) != std::string::npos) {
      const size_t end = out.find('\n', pos);
      lines += out.substr(pos, end - pos) + "\n";
      pos = end;
    }
    return lines;
  };
  const Result r = cli("run --impl ref " + prob), s = cli("run --impl simd " + prob);
  const Result t = cli("run --impl simd --target SCALAR " + prob);
  CHECK(r.status == 0);
  CHECK(s.status == 0);
  CHECK(t.status == 0);
  CHECK(!layers(r.out).empty());
  CHECK(layers(r.out) == layers(s.out));
  CHECK(layers(r.out) == layers(t.out));
  CHECK(t.out.find("Highway target SCALAR") != std::string::npos);
  Result bad = cli("run --impl simd --target NOPE " + prob);
  CHECK(bad.status == 2);
  bad = cli("run --max-memory 1K " + prob);
  CHECK(bad.status == 2);
  CHECK(bad.out.find("--max-memory") != std::string::npos);
  CHECK(cli("run --max-memory lots " + prob).status == 2);
  // golden --impl simd writes the same tensors as ref.
  const std::string dir = "/tmp/indexshare-cli-simd-" + std::to_string(::getpid());
  std::system(("rm -rf " + dir).c_str());
  CHECK(cli("golden --impl ref --problem 'sq8 skv40 hq2 dqk16 dv8 ih4 id16 k4 nl2 sched=FS' --out " + dir + "/r").status == 0);
  CHECK(cli("golden --impl simd --problem 'sq8 skv40 hq2 dqk16 dv8 ih4 id16 k4 nl2 sched=FS' --out " + dir + "/s").status == 0);
  const std::string cmp = "cmp -s " + dir + "/r/tensors.safetensors " + dir + "/s/tensors.safetensors";
  CHECK(std::system(cmp.c_str()) == 0);
  CHECK(cli("golden --max-memory 1K --problem 'sq8 skv40' --out " + dir + "/m").status == 2);
  // The module-level toy model: run and golden --model on the simd kernels give ref's results.
  const std::string model = "--model tiny-deepseek --layers 4 --seq 24 --variant hf_bf16";
  const Result mr = cli("run --impl ref " + model), ms = cli("run --impl simd --target SCALAR " + model);
  CHECK(mr.status == 0);
  CHECK(ms.status == 0);
  CHECK(!layers(mr.out).empty());
  CHECK(layers(mr.out) == layers(ms.out));
  CHECK(ms.out.find("(impl simd)") != std::string::npos);
  CHECK(cli("golden --impl ref " + model + " --out " + dir + "/mr").status == 0);
  CHECK(cli("golden --impl simd " + model + " --out " + dir + "/ms").status == 0);
  CHECK(std::system(("cmp -s " + dir + "/mr/tensors.safetensors " + dir + "/ms/tensors.safetensors").c_str()) == 0);
  std::system(("rm -rf " + dir).c_str());
}

TEST_CASE("cli: overlap and search write their reports, bad sources exit 2") {
  const std::string dir = "/tmp/indexshare-cli-ovl-" + std::to_string(::getpid());
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  Result r = cli("overlap --golden " + std::string(INDEXSHARE_SOURCE_DIR) + "/golden/glm-5.2 --json " + dir + "/o.json --csv " + dir +
                 "/o.csv --svg " + dir + "/o.svg --svg-position " + dir + "/p.svg");
  CHECK(r.status == 0);
  CHECK(r.out.find("adjacent own-top-k overlap") != std::string::npos);
  CHECK(r.out.find("__REPRO: indexshare overlap --golden") != std::string::npos);
  for (const char* f : {"/o.json", "/o.csv", "/o.svg", "/p.svg"}) CHECK(std::system(("test -s " + dir + f).c_str()) == 0);
  // The SVGs are XML.
  CHECK(std::system(("python3 -c 'import xml.dom.minidom,sys; [xml.dom.minidom.parse(f) for f in sys.argv[1:]]' " + dir + "/o.svg " +
                     dir + "/p.svg").c_str()) == 0);
  r = cli("search --problem 'sq8 skv48 hq2 dqk32 dv16 ih4 id32 k8 nl4 sim=0.5' --full-layers 2 --svg " + dir + "/s.svg --json " + dir + "/s.json");
  CHECK(r.status == 0);
  CHECK(r.out.find("n_full") != std::string::npos);
  CHECK(std::system(("test -s " + dir + "/s.svg").c_str()) == 0);
  CHECK(cli("overlap").status == 2);                                     // no source
  CHECK(cli("overlap --golden " + dir + "/none").status == 2);           // not a golden set
  CHECK(cli("search --problem 'sq8 skv48 nl4' --full-layers 9").status == 2);
  CHECK(cli("search --problem 'sq8 skv48 nl4' --loss cosine").status == 2);
  std::system(("rm -rf " + dir).c_str());
}

TEST_CASE("cli: bench --kpool times the pooled indexer's parts against the peak, run and golden of a KPool stack, JSON") {
  const std::string json = "/tmp/indexshare-cli-bench-kpool-" + std::to_string(::getpid()) + ".json";
  const std::string spec = "sq=30 skv=30 h=4 d=16 pool=4 k=16 hq=2 dqk=64 dv=32 nl=8 sched=FS";
  const Result r = cli("bench --kpool '" + spec + "' --repeats 1 --json " + json);
  CHECK(r.status == 0);
  CHECK(r.out.find("goal      score / FMA peak") != std::string::npos);
  CHECK(r.out.find("goal      golden / run") != std::string::npos);
  // score's FLOPs: 2 H D per visible pool of each row (rows 0-2 see none, 3-6 one, ..., 27-29 seven: 105 in all).
  CHECK(std::system(("python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
                     "assert d[\"parts\"][\"score\"][\"flops\"] == 2*4*16*105 and d[\"run\"][\"wall\"] and d[\"peak_gflops\"] > 0' " +
                     json).c_str()) == 0);
  std::remove(json.c_str());
  CHECK(cli("bench --kpool 'sq=30'").status == 2);
  Result both = cli("bench --kpool '" + spec + "' --commands no");
  CHECK(both.status == 2);
  CHECK(both.out.find("--commands excludes --kpool") != std::string::npos);
  both = cli("bench --kpool '" + spec + "' --v4 't=48'");
  CHECK(both.status == 2);
  CHECK(both.out.find("--v4 excludes --kpool") != std::string::npos);
}

TEST_CASE("cli: bench --v4 times run, golden and ref's build of a V4 stack, ref = simd, JSON") {
  const std::string json = "/tmp/indexshare-cli-bench-v4-" + std::to_string(::getpid()) + ".json";
  const std::string spec = "t=48 h=2 d=64 w=8 csa=4 hca=8 ih=4 id=32 k=4 rope=16 ctx=32 types=SCHCC sched=FSF";
  const Result r = cli("bench --v4 '" + spec + "' --repeats 1 --json " + json);
  CHECK(r.status == 0);
  CHECK(r.out.find("ref = simd: every tensor byte-identical") != std::string::npos);
  CHECK(r.out.find("goal      golden / run") != std::string::npos);
  CHECK(std::system(("python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
                     "assert d[\"ref_equals_simd\"] and d[\"run\"][\"wall\"] and d[\"golden_over_run\"] > 0' " + json).c_str()) == 0);
  std::remove(json.c_str());
  // A bad descriptor, and the kernel-level stages' options beside --v4: exit 2, named.
  CHECK(cli("bench --v4 't=48'").status == 2);
  const Result both = cli("bench --v4 '" + spec + "' --commands no");
  CHECK(both.status == 2);
  CHECK(both.out.find("--commands excludes --v4") != std::string::npos);
}

TEST_CASE("cli: bench runs a small problem, checks simd against ref and writes JSON") {
  const std::string json = "/tmp/indexshare-cli-bench-" + std::to_string(::getpid()) + ".json";
  const Result r = cli("bench --problem 'sq8 skv64 hq2 dqk64 dv32 ih4 id32 k8' --repeats 1 --stack-seq 256 "
                       "--model tiny-deepseek --module-rows 8 --json " + json);
  CHECK(r.status == 0);
  CHECK(r.out.find("__REPRO: indexshare bench") != std::string::npos);
  CHECK(r.out.find("module projections    simd") != std::string::npos);
  CHECK(r.out.find("agreement simd vs ref: module projections, logits") != std::string::npos);
  CHECK(std::system(("python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
                     "assert all(k in d for k in (\"stages\", \"stack\", \"targets\", \"peak_gflops\", \"agreement\"))' " + json).c_str()) == 0);
  // The attention phases of the profiled call: the named parts are a share of its thread-seconds
  // (non-negative, at most the total) and the matrix part's rate is reported and targeted.
  CHECK(r.out.find("attention phases (simd, the median of 1 profiled call(s)") != std::string::npos);
  CHECK(r.out.find("goal      simd sparse attention, matrix part: share of peak") != std::string::npos);
  CHECK(r.out.find("(the whole attention call, gathers, decode and softmax included:") != std::string::npos);
  // The stack's ratio per alternating pair (its noise), one value per pair in the JSON.
  CHECK(r.out.find("          per alternating pair: ") != std::string::npos);
  CHECK(std::system(("python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))[\"stack\"]; "
                     "p=s[\"pair_measured_over_predicted\"]; n=[r[\"runs\"] for r in s[\"runs\"]]; "
                     "assert len(p) == min(n) >= 1 and all(x > 0 for x in p)' " + json).c_str()) == 0);
  CHECK(std::system(("python3 -c 'import json,sys; a=json.load(open(sys.argv[1]))[\"attention_phases\"]; "
                     "t=a[\"thread_seconds\"]; parts=[t[k] for k in (\"qk_tiles\",\"pv_tiles\",\"kv_gather_decode\","
                     "\"v_gather_decode\",\"q_decode\",\"softmax\")]; "
                     "assert t[\"total\"] > 0 and all(x >= 0 for x in parts) and sum(parts) <= t[\"total\"] * (1 + 1e-9); "
                     "assert a[\"matrix_part_peak_share\"] > 0 and a[\"whole_call_peak_share\"] > 0' " + json).c_str()) == 0);
  // The commands stage: run, its input generation, golden (written) and diff of an exact copy, end
  // to end; the copy passes; the three ratios are target lines.
  CHECK(r.out.find("diff of an exact copy of its outputs: PASS)") != std::string::npos);
  CHECK(r.out.find("goal      command golden (simd, written) over run (simd)") != std::string::npos);
  CHECK(r.out.find("goal      command diff of an exact copy over golden") != std::string::npos);
  CHECK(r.out.find("goal      run's input generation over run (simd)") != std::string::npos);
  // Defined at sq4096 skv4096 hq64 ... k512 only: on this small problem neither met nor missed.
  CHECK(r.out.find("(goal <= 0.1x, defined at sq4096 skv4096 hq64 dqk576 dv512 ih64 id128 k512)") != std::string::npos);
  CHECK(std::system(("python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))[\"commands\"]; "
                     "assert [r[\"command\"] for r in c[\"runs\"]] == [\"run\", \"run: inputs only\", \"golden\", \"diff\", "
                     "\"diff: correct kernel\", \"diff: failing kernel\"]; "
                     "assert c[\"diff_correct_over_golden\"] > 0 and c[\"diff_failing_over_golden\"] > 0; "
                     "assert c[\"diff_verdict\"] == \"PASS\" and c[\"golden_over_run\"] > 0 and 0 < c[\"inputs_over_run\"] < 1' " + json).c_str()) == 0);
  CHECK(std::system(("python3 -c 'import json,sys; t=[x for x in json.load(open(sys.argv[1]))[\"targets\"] "
                     "if \"input generation\" in x[\"target\"]]; "
                     "assert len(t) == 1 and t[0][\"met\"] is None and t[0][\"defined_at\"].startswith(\"sq4096\")' " + json).c_str()) == 0);
  std::remove(json.c_str());
  CHECK(cli("bench --problem 'sq8 skv4'").status == 2);
  CHECK(cli("bench --commands maybe --stack-seq 0").status == 2);
  // Bad module-stage options are refused before any timing.
  Result bad = cli("bench --model nope --stack-seq 0");
  CHECK(bad.status == 2);
  CHECK(bad.out.find("nope") != std::string::npos);
  bad = cli("bench --module-rows 0 --stack-seq 0");
  CHECK(bad.status == 2);
  CHECK(bad.out.find("--module-rows") != std::string::npos);
  // --impl is checked on overlap and search as on run.
  const std::string prob = "--problem 'sq8 skv24 hq2 dqk16 dv8 ih4 id16 k4 nl2 own=yes'";
  CHECK(cli("overlap --impl simd " + prob).status == 0);
  bad = cli("overlap --impl fast " + prob);
  CHECK(bad.status == 2);
  CHECK(bad.out.find("--impl") != std::string::npos);
  CHECK(cli("search --impl fast " + prob).status == 2);
}

// One vocabulary: --model names a model preset (golden, run, cost, bench). cost's --preset and
// bench's --module-preset, its old names there, work for this release after a one-line notice.
TEST_CASE("cli: cost --preset and bench --module-preset still work, with a one-line notice on stderr") {
  const Result now = cli("cost --model tiny-glm --context 4096"), old = cli("cost --preset tiny-glm --context 4096");
  CHECK(now.status == 0);
  CHECK(old.status == 0);
  CHECK(now.out.find("is now") == std::string::npos);
  CHECK(old.out == "indexshare: --preset is now --model; the old name works for this release\n" + now.out);
  CHECK(cli("cost --preset=tiny-glm --context 4096").out == old.out);
  // Both spellings at once: one option given twice, refused as usage.
  CHECK(cli("cost --model tiny-glm --preset tiny-glm").status == 2);
  const Result bench_now = cli("bench --model nope --stack-seq 0"), bench_old = cli("bench --module-preset nope --stack-seq 0");
  CHECK(bench_now.status == 2);
  CHECK(bench_old.status == 2);
  CHECK(bench_old.out == "indexshare: --module-preset is now --model; the old name works for this release\n" + bench_now.out);
  // golden's --layers is a layer count, not the old name of anything: no notice.
  CHECK(cli("golden --model tiny-glm --layers 0 --out /nonexistent/x").out.find("is now") == std::string::npos);
}
