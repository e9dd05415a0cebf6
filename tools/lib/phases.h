// indexshare: where a process's time goes, phase by phase (wall and process CPU time), for the MPI
// ranks' timing breakdown (INDEXSHARE_TIMING=1, printed by rank 0; tools/lib/distributed.h). The
// library marks its coarse steps (input generation, compute, assembly, write, hash); a phase's
// time is the time from its begin() to the next begin(), summed over every stretch of that name.
// Costs one getrusage and one clock read per mark: a handful per command.
#pragma once

#include <string>
#include <vector>

namespace indexshare::phases {

struct Phase {
  std::string name;
  double wall_s = 0, cpu_s = 0;  // cpu: user + system of the whole process (every thread)
};

// Ends the running phase (adds its time to its name) and starts `name`.
void begin(const std::string& name);
// The running phase's name ("" before the first begin).
std::string current();
// Every phase so far in order of first appearance, the running one included up to now.
std::vector<Phase> recorded();

// INDEXSHARE_TIMING is set (and not "0").
bool requested();
// Every phase so far, one line each (a single process's table; MPI ranks': distributed.h).
std::string table();

// begin(name) now, begin(the phase that was running) when the scope ends: for a step inside
// another (a collective wait inside a write).
class Scope {
 public:
  explicit Scope(const std::string& name) : prev_(current()) { phases::begin(name); }
  ~Scope() { phases::begin(prev_); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  std::string prev_;
};

}  // namespace indexshare::phases
