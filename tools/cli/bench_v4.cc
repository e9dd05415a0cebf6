// indexshare bench --v4 SPEC: the DeepSeek-V4 stage, alone (SPEC a V4 descriptor,
// tools/lib/golden_v4.h). Three commands, timed as the commands stage times its own:
//   run     every layer's inputs generated, then golden's computation (golden::compute_v4_layer) on
//           simd: what `indexshare run --problem SPEC` computes
//   golden  golden::write_v4 on simd to a new folder: `golden --kind v4 --out NEW` (each layer written
//           and hashed on two threads while the next computes)
//           (the previous round's folder removed untimed)
//   build   golden::emit_v4 on simd, each tensor dropped as it comes (golden without the write)
//   ref     golden::emit_v4 on ref (the readable path), once, timed without hashing its tensors: their
//           SHA-256 must equal simd's (a mismatch fails the bench); --v4-ref no leaves it out (a
//           16K-token stack, where ref would take hours)
// run, golden and build run interleaved round by round under the repeat rules (cmd_bench.cc's header), so
// that a drifting machine slows both alike; wall and process CPU time. Goals: golden within 1.3x of
// run, and simd's build at least 20x faster than ref's (in CPU time too, for a loaded machine).
#include <omp.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "ref/error.h"
#include "simd/simd.h"
#include "tools/cli/bench.h"
#include "tools/lib/golden_v4.h"
#include "tools/lib/svg.h"

namespace indexshare::cli::bench {

// The commands of a descriptor kind (v4, kpool), timed interleaved round by round under the
// repeat rules: wall and process CPU time per run. `dir` is removed (untimed) before every run.
std::vector<CommandRun> interleave_commands(const BenchArgs& a, const std::vector<std::pair<std::string, std::function<void()>>>& cmds,
                                            const std::string& dir) {
  std::vector<CommandRun> out;
  std::vector<Repeats> wall;
  for (const auto& c : cmds) {
    out.push_back({c.first, {}, {}});
    wall.emplace_back(a.repeats, a.budget);
  }
  for (bool more = true; more;) {
    more = false;
    for (size_t c = 0; c < cmds.size(); ++c) {
      if (!wall[c].more()) continue;
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
      const double c0 = cpu_s(), t0 = now_s();
      cmds[c].second();
      const double t = now_s() - t0, cpu = cpu_s() - c0;
      if (wall[c].add(t)) out[c].cpu.push_back(cpu);
      more = more || wall[c].more();
    }
  }
  for (size_t c = 0; c < cmds.size(); ++c) out[c].samples = wall[c].samples;
  return out;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

std::string bench_temp_dir(const std::string& kind) {
  return (std::filesystem::temp_directory_path() / ("indexshare-bench-" + kind + "-" + std::to_string(getpid()))).string();
}

int bench_v4(const BenchArgs& a) {
  const golden::V4Spec spec = golden::parse_v4_spec(a.v4);
  spec.cfg.validate();
  const ref::v4::Schedule sch = spec.schedule();
  if (a.threads > 0) omp_set_num_threads(a.threads);
  if (a.target != "best") simd::set_target(a.target);
  std::printf("v4        %s\nschedule  %s (%d indexers over %zu layers)\nmachine   %d OpenMP thread(s) for simd; simd target %s\n",
              golden::to_string(spec).c_str(), sch.pattern().c_str(), sch.indexers(), sch.types.size(), omp_get_max_threads(),
              simd::current_target().c_str());
  const TempDir tmp{bench_temp_dir("v4")};
  const std::string& dir = tmp.dir;
  const ref::Kernels kern = simd::kernels();
  const auto run = [&] {
    std::vector<Tensor<int32_t>> blocks(sch.types.size());
    for (size_t l = 0; l < sch.types.size(); ++l) {
      const ref::v4::LayerType t = sch.types[l];
      const ref::v4::LayerInputs in =
          ref::v4::make_layer_inputs(spec.cfg, int(l), t, t == ref::v4::LayerType::csa && sch.full(l), kern);
      (void)golden::compute_v4_layer(spec.cfg, sch, l, in, blocks, kern, false);
    }
  };
  const std::string replay = golden::v4_replay(spec, Impl::simd);
  // build: the set computed and each tensor dropped as it comes (golden without the write, in no
  // more memory than run). hashed: the same with each tensor's SHA-256 kept, its time apart.
  const auto drop = [](golden::Handed h) {  // a made tensor is made, a piece at a time, as a writer would
    golden::for_each_piece(h.view, h.fill, [](const uint8_t*, size_t) {});
  };
  struct Hashed {
    std::vector<std::pair<std::string, std::string>> sha;
    double hash_s = 0;
  };
  const auto hashed = [&](Impl impl) {
    Hashed h;
    (void)golden::emit_v4(spec, golden::v4_replay(spec, impl), impl, nullptr, [&h](golden::Handed v) {
      io::Sha256 sha;
      golden::for_each_piece(v.view, v.fill, [&](const uint8_t* p, size_t n) {
        const double t = now_s();
        sha.update(p, n);
        h.hash_s += now_s() - t;
      });
      h.sha.emplace_back(v.view.name, sha.hex());
    });
    return h;
  };
  progress("v4: run, golden and golden's build, interleaved (simd)");
  const std::vector<CommandRun> cmds =
      interleave_commands(a, {{"run", run},
                              {"golden", [&] { golden::write_v4(dir, false, spec, replay, Impl::simd); }},
                              {"build", [&] { (void)golden::emit_v4(spec, replay, Impl::simd, nullptr, drop); }}},
                          dir);
  const bool with_ref = a.v4_ref == "yes";
  // ref's build once, timed without its hashing; simd's once more, untimed, to compare the hashes.
  double ref_wall = 0, ref_cpu = 0;
  std::vector<std::string> differ;
  if (with_ref) {
    progress("v4: the set on ref (once)");
    const double c0 = cpu_s(), t0 = now_s();
    const Hashed ref_set = hashed(Impl::ref);
    ref_wall = now_s() - t0 - ref_set.hash_s;
    ref_cpu = cpu_s() - c0 - ref_set.hash_s;
    const Hashed simd_set = hashed(Impl::simd);
    for (size_t i = 0; i < ref_set.sha.size(); ++i)
      if (i >= simd_set.sha.size() || ref_set.sha[i] != simd_set.sha[i]) differ.push_back(ref_set.sha[i].first);
  }
  const double build_wall = median(cmds[2].samples), build_cpu = median(cmds[2].cpu);
  const double run_s = median(cmds[0].samples), golden_s = median(cmds[1].samples);
  const double run_cpu = median(cmds[0].cpu), golden_cpu = median(cmds[1].cpu);
  std::printf("\n%-8s %10s %10s %8s\n", "command", "wall s", "CPU s", "samples");
  for (const CommandRun& c : cmds)
    std::printf("%-8s %10.3f %10.3f %8zu\n", c.name.c_str(), median(c.samples), median(c.cpu), c.samples.size());
  if (with_ref) {
    std::printf("%-8s %10.3f %10.3f %8d   (golden's build on ref, without the write)\n", "ref", ref_wall, ref_cpu, 1);
    std::printf("ref = simd: %s\n", differ.empty() ? "every tensor byte-identical (SHA-256)" : ("DIFFER: " + differ.front() + " ...").c_str());
  }
  const double g_run = golden_s / run_s, g_run_cpu = golden_cpu / run_cpu, speedup = ref_wall / build_wall,
               speedup_cpu = ref_cpu / build_cpu;
  std::printf("goal      golden / run                 %6.2fx wall, %6.2fx CPU (goal <= 1.3)\n", g_run, g_run_cpu);
  if (with_ref)
    std::printf("goal      ref / simd (the set's build) %6.1fx wall, %6.1fx CPU (goal >= 20)\n", speedup, speedup_cpu);
  if (!a.json_path.empty()) {
    json j = {{"machine", machine_json()}, {"v4", golden::to_string(spec)},
              {"threads", omp_get_max_threads()},
              {"target", simd::current_target()},
              {"run", {{"wall", cmds[0].samples}, {"cpu", cmds[0].cpu}}},
              {"golden", {{"wall", cmds[1].samples}, {"cpu", cmds[1].cpu}}},
              {"simd_build", {{"wall", build_wall}, {"cpu", build_cpu}}},
              {"golden_over_run", g_run}};
    if (with_ref) {
      j["ref_build"] = {{"wall", ref_wall}, {"cpu", ref_cpu}};
      j["ref_over_simd"] = speedup;
      j["ref_equals_simd"] = differ.empty();
    }
    io::write_text_file(a.json_path, j.dump(2) + "\n");
  }
  std::printf("__REPRO: indexshare bench --v4 \"%s\" --repeats %d%s\n", golden::to_string(spec).c_str(), a.repeats,
              with_ref ? "" : " --v4-ref no");
  return differ.empty() ? 0 : 1;
}

}  // namespace indexshare::cli::bench
