// indexshare: golden sets, runs and overlap statistics computed by several processes (MPI ranks), with the
// same bytes as one process. Built only when CMake finds MPI (compile definition INDEXSHARE_MPI);
// the command-line tool takes this path when an MPI launcher (mpirun, srun) started it.
//
// Work split: the set's query rows (every row of the problem, or the --rows list) are cut into
// one contiguous block per rank, of about equal WORK (row_work): row t of a causal prefill sees
// t + 1 keys, so equal row counts would be unequal work. Every rank builds the key side itself
// (the generator is deterministic) or reads it from the --from dump, and computes only its rows
// (the --rows machinery: each row equals the whole problem's row bit for bit).
//
// Golden sets (write_golden): the safetensors header and every tensor's offset follow from the
// names, dtypes and whole-set shapes, known on every rank before anything is written. Rank 0
// stages the temporary folder (golden::stage), writes the header and the key-side tensors; every
// rank writes its rows of each per-row tensor with MPI-IO at their offsets in the one file. The
// SHA-256 of a tensor needs its bytes in order, so once the file is closed the tensors are hashed
// from it, spread over the ranks (largest first, to the least loaded rank), and the hashes
// gathered. Rank 0 writes manifest.json (the budgets combined by max, ref/bounds.h BudgetParts)
// and renames the folder into place. Every step ends in a collective check (agree): a rank that
// fails (bad input, out of memory, --max-memory, an I/O error) makes every rank stop, rank 0
// removes the temporary folder and prints each failing rank's error, and the tool exits 2. A
// process killed outright makes the launcher end the job: the final folder never appears, only
// `<out>.tmp.mpi.<pid>` may remain, never read as a set. Its owner record (golden::stage) lets the
// next run into the same folder remove it once rank 0's process is gone (the same for the
// `<out>.tmp.<pid>` a killed single process leaves).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <exception>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ref/problem.h"
#include "tools/lib/golden.h"

namespace indexshare::dist {

// True when an MPI launcher started this process (Open MPI's mpirun, Slurm's srun with PMI/PMIx):
// only then does init start MPI, so that the tool run on its own never touches MPI.
bool launched();
// MPI_Init_thread (funneled: OpenMP threads never call MPI) when launched(); finalize ends it.
void init(int* argc, char*** argv);
void finalize();
bool active();  // init started MPI (any number of ranks, 1 included)
int rank();
int size();

// Thrown on every rank once a collective check has found a failure; rank 0 has printed it.
struct Failed : std::exception {
  const char* what() const noexcept override { return "a rank failed"; }
};

// Collective: every rank passes its error ("" when it succeeded). All succeeded: returns. Else
// rank 0 prints "indexshare: error: rank R of N: MESSAGE" (ranks with the same message on one
// line: "ranks 0, 1, 2 of 3"), and every rank throws Failed.
void agree(const std::string& error);
// Runs f, turning any exception (Error, bad_alloc, ...) into its message, then agree. `cleanup`
// runs on every rank (before agree throws) when some rank failed.
void guarded(const std::function<void()>& f, const std::function<void()>& cleanup = {});

// Ends the whole job from this rank (MPI_Abort, exit status 2), after printing "indexshare: error:
// rank R of N: MESSAGE": for a failure inside steps that end in no collective check (the search's
// cost steps), where the other ranks would otherwise wait for this one forever.
[[noreturn]] void abort_job(const std::string& error);

// Test hook: INDEXSHARE_MPI_FAULT="RANK:STEP" makes rank RANK fail at STEP (an Error naming the
// hook), or die by SIGKILL with STEP "kill-STEP". Steps: compute, budget (golden: the gather of
// the budget's row maxima, inside the compute step), write, hash, cost (search).
void fault_point(const char* step);

// The causal window of each of the set's rows: row t of a sequence with Lq queries and Lk keys
// sees Lk - Lq + t + 1 keys (ref/stack.h); `rows` are problem row numbers.
std::vector<int64_t> causal_windows(const Problem& p, std::span<const int64_t> rows);
// The causal window of each row of loaded inputs: ke - ks (a dump's or a golden set's own rows).
std::vector<int64_t> input_windows(const ref::LayerInputs& in);
// The cost of each row, in units of one indexer multiply-add (simd, FP8), so that equal sums
// are about equal times: the indexer over the row's causal window, and the costs every row carries
// whatever its window (its query generation, the top-k's per-row work, the attention over
// min(topk, window) keys, the output copies; golden_budget: the golden set's budget emulates the
// attention again, which it does on every row of sets of at most cmp::kBudgetAllRows rows; larger
// sets emulate at most 128 rows, left out of the split). The constants: distributed.cc.
std::vector<double> row_work(const Problem& p, std::span<const int64_t> windows, int indexer_layers,
                             bool golden_budget = false);
// Boundaries b_0 = 0 < b_1 < ... < b_parts = work.size(): part r is rows [b_r, b_{r+1}), each of
// about total / parts work and at least one row. Error when there are fewer rows than parts.
std::vector<int64_t> partition(const std::vector<double>& work, int parts);

// This rank's block of rows (partition over every rank), the whole list's boundaries in `bounds`.
golden::RowPart my_rows(const std::vector<double>& work, std::vector<int64_t>* bounds = nullptr);

struct WriteStats {
  double write_s = 0, hash_s = 0;   // this rank's MPI-IO writes, and its share of the hashing
};
// Collective: writes the whole golden set from every rank's part (built with golden::build and
// this rank's RowPart) to `dir`, as described above. Returns the manifest as written (rank 0; the
// other ranks get an empty object).
nlohmann::json write_golden(const std::string& dir, golden::GoldenSet part, bool force, WriteStats* stats = nullptr);

// Rank 0 receives every rank's `local` bytes in rank order and calls f on each block (its own
// first): an ordered fold over the whole row range, so sums and hashes come out as in one process.
// Blocks are received one at a time. The other ranks send theirs and never call f.
void fold_in_order(std::span<const uint8_t> local, const std::function<void(std::span<const uint8_t>)>& f);

// The sum over the ranks (every rank gets it).
int64_t sum(int64_t local);
// Rank 0's value, on every rank.
double from_rank0(double value);

// Per-rank timing and memory, gathered to rank 0: one line per rank (its rows, compute wall time,
// the process's CPU time so far, user + system, and its peak resident set).
std::string rank_report(const std::vector<int64_t>& bounds, double compute_s);

// The timing breakdown (tools/lib/phases.h), when phases::requested() (INDEXSHARE_TIMING set, not
// "0"). Collective: every rank's phases gathered to rank 0, which gets one line per phase with each
// rank's wall and process CPU seconds (the others get ""). The phase "wait (collective checks)" is
// the time a rank spent waiting for the others at the collective checks: a rank done early waits
// there, so it measures the imbalance.
std::string timing_report();

}  // namespace indexshare::dist
