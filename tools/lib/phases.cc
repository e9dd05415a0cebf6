#include "tools/lib/phases.h"

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace indexshare::phases {

namespace {
struct State {
  std::vector<Phase> done;
  std::string name;
  double wall0 = 0, cpu0 = 0;
};
State& state() {
  static State s;
  return s;
}
double wall_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double cpu_now() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}
void add(std::vector<Phase>& v, const std::string& name, double wall, double cpu) {
  for (Phase& p : v)
    if (p.name == name) {
      p.wall_s += wall;
      p.cpu_s += cpu;
      return;
    }
  v.push_back({name, wall, cpu});
}
}  // namespace

void begin(const std::string& name) {
  State& s = state();
  const double w = wall_now(), c = cpu_now();
  if (!s.name.empty()) add(s.done, s.name, w - s.wall0, c - s.cpu0);
  s.name = name;
  s.wall0 = w;
  s.cpu0 = c;
}

std::string current() { return state().name; }

std::vector<Phase> recorded() {
  const State& s = state();
  std::vector<Phase> v = s.done;
  if (!s.name.empty()) add(v, s.name, wall_now() - s.wall0, cpu_now() - s.cpu0);
  return v;
}

bool requested() {
  const char* v = std::getenv("INDEXSHARE_TIMING");
  return v && *v && std::string(v) != "0";
}

std::string table() {
  std::string out = "timing    phase (INDEXSHARE_TIMING; seconds, wall / process CPU)\n";
  char line[160];
  for (const Phase& ph : recorded()) {
    std::snprintf(line, sizeof line, "          %-58s %7.3f / %7.3f\n", ph.name.c_str(), ph.wall_s, ph.cpu_s);
    out += line;
  }
  return out;
}

}  // namespace indexshare::phases
