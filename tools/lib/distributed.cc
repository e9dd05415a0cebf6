#include "tools/lib/distributed.h"

#include <mpi.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <new>
#include <sstream>

#include "ref/bounds.h"
#include "ref/error.h"
#include "tools/lib/phases.h"
#include "tools/lib/safetensors.h"

namespace indexshare::dist {

namespace {
bool g_active = false;
int g_rank = 0, g_size = 1;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, size_t(len));
}

// Broadcast of a string from rank 0.
std::string bcast(std::string s) {
  uint64_t n = s.size();
  MPI_Bcast(&n, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  s.resize(n);
  if (n) MPI_Bcast(s.data(), int(n), MPI_CHAR, 0, MPI_COMM_WORLD);
  return s;
}

// Bytes in pieces below MPI's int counts.
constexpr uint64_t kChunk = 1ull << 30;
// Every rank's text gathered to rank 0, in rank order (lengths, then the texts); empty elsewhere.
std::vector<std::string> gather_texts(const std::string& mine) {
  const int len = int(mine.size());
  std::vector<int> lens(static_cast<size_t>(g_size)), displs(static_cast<size_t>(g_size));
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  int total = 0;
  for (int r = 0; r < g_size; ++r) {
    displs[size_t(r)] = total;
    total += lens[size_t(r)];
  }
  std::string all(size_t(total), '\0');
  MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
  std::vector<std::string> texts;
  if (g_rank == 0)
    for (int r = 0; r < g_size; ++r) texts.push_back(all.substr(size_t(displs[size_t(r)]), size_t(lens[size_t(r)])));
  return texts;
}

}  // namespace

bool launched() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

void init(int* argc, char*** argv) {
  if (!launched()) return;
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  g_active = true;
}

void finalize() {
  if (g_active) MPI_Finalize();
  g_active = false;
}

bool active() { return g_active; }
int rank() { return g_rank; }
int size() { return g_size; }

void agree(const std::string& error) {
  int bad = !error.empty(), any = 0;
  {
    const phases::Scope wait("wait (collective checks)");  // a rank done early waits here for the others
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  }
  if (!any) return;
  const std::vector<std::string> texts = gather_texts(error);  // the messages, at rank 0
  if (g_rank == 0) {
    std::map<std::string, std::vector<int>> by_message;  // the same error on several ranks: one line
    std::vector<std::string> order;
    for (int r = 0; r < g_size; ++r) {
      const std::string& m = texts[size_t(r)];
      if (m.empty()) continue;
      if (!by_message.count(m)) order.push_back(m);
      by_message[m].push_back(r);
    }
    for (const std::string& m : order) {
      const std::vector<int>& rs = by_message[m];
      std::string who = rs.size() == 1 ? "rank " : "ranks ";
      for (size_t i = 0; i < rs.size(); ++i) who += (i ? ", " : "") + std::to_string(rs[i]);
      std::fprintf(stderr, "indexshare: error: %s of %d: %s\n", who.c_str(), g_size, m.c_str());
    }
    std::fflush(stderr);
  }
  throw Failed();
}

void guarded(const std::function<void()>& f, const std::function<void()>& cleanup) {
  std::string err;
  try {
    f();
  } catch (const Failed&) {
    throw;  // a check inside f already failed on every rank, which all know it
  } catch (const Error& e) {
    err = e.what();
  } catch (const std::bad_alloc&) {
    err = "out of memory (std::bad_alloc); use --max-memory to refuse such problems up front, or more ranks";
  } catch (const std::exception& e) {
    err = std::string("internal error: ") + e.what();
  }
  try {
    agree(err);
  } catch (const Failed&) {
    if (cleanup) cleanup();
    throw;
  }
}

void abort_job(const std::string& error) {
  std::fprintf(stderr, "indexshare: error: rank %d of %d: %s\n", g_rank, g_size, error.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::_Exit(2);  // MPI_Abort does not return; should it, this rank still ends
}

void fault_point(const char* step) {
  const char* v = std::getenv("INDEXSHARE_MPI_FAULT");
  if (!v) return;
  const std::string s = v;
  const size_t colon = s.find(':');
  if (colon == std::string::npos || std::atoi(s.substr(0, colon).c_str()) != g_rank) return;
  const std::string what = s.substr(colon + 1);
  if (what == std::string("kill-") + step) std::raise(SIGKILL);
  if (what == step) throw Error(std::string("injected fault at step '") + step + "' (INDEXSHARE_MPI_FAULT=" + s + ")");
}

std::vector<int64_t> causal_windows(const Problem& p, std::span<const int64_t> rows) {
  std::vector<int64_t> w(rows.size());
  const int64_t lq = p.seq_q(), lk = p.seq_kv();
  for (size_t i = 0; i < rows.size(); ++i) w[i] = lk - lq + rows[i] % lq + 1;
  return w;
}

std::vector<int64_t> input_windows(const ref::LayerInputs& in) {
  std::vector<int64_t> w(size_t(in.ks.numel()));
  for (size_t t = 0; t < w.size(); ++t) w[t] = in.ke[int64_t(t)] - in.ks[int64_t(t)];
  return w;
}

// Row costs in indexer multiply-adds (the unit: about 4e-11 s each), fitted with INDEXSHARE_TIMING
// on the 2-core AMD EPYC (Highway AVX3, simd, 1 thread): golden --no-logits on 2 ranks, each
// rank's phases (inputs, compute, assemble) against its rows, for sq16384 skv16384 hq2 dqk576
// dv512 ih16 id64 k128 and sq16384 skv16384 hq16 dqk576 dv512 ih32 id128 k512:
//   - the indexer: H * D per key of the window, plus per row its query generation and
//     quantization (~300 per H * D element, kIxRowFixed) and the top-k's per-row work (~700K at
//     k128: kTopkPerK per slot of k);
//   - the attention: per selected key (min(topk, window) of them) and kv element (d_qk + d_v),
//     kKvKeyRun + kKvHeadRun * h_q (MLA's kv row is shared by every head: loading and converting
//     it is the per-key part); a golden set's budget emulates it again, at about kKvKeyGolden per
//     key and element whatever h_q (the compute phase's per-row cost: 1.55M at hq2 k128, 16.8M
//     at hq16 k512; the assemble phase's: 3.6M and 19.4M);
//   - per row, its attention q generation and output copies: kAttnRowFixed per h_q * (d_qk + d_v).
// A row's causal work alone (window, the attention at one multiply-add per key and head) left the
// two ranks of the hq2 golden 30% apart (6.2 vs 4.3 s CPU); with these, within the load noise (a
// few percent). They are ratios of one implementation on one machine; INDEXSHARE_TIMING's wait
// phase (the time a rank done early waits for the others) shows what is left on another.
constexpr double kIxRowFixed = 300, kTopkPerK = 5500, kAttnRowFixed = 640;
constexpr double kKvKeyRun = 3.4, kKvHeadRun = 1.36, kKvKeyGolden = 3.4 + 15.8, kKvHeadGolden = 1.36;

std::vector<double> row_work(const Problem& p, std::span<const int64_t> windows, int indexer_layers, bool golden_budget) {
  std::vector<double> work(windows.size());
  const double hd = double(p.index_n_heads) * double(p.index_head_dim), nix = double(indexer_layers);
  const double nl = double(p.n_layers), kv = double(p.d_qk + p.d_v), hq = double(p.h_q);
  const double per_key = kv * (golden_budget ? kKvKeyGolden + kKvHeadGolden * hq : kKvKeyRun + kKvHeadRun * hq);
  for (size_t i = 0; i < windows.size(); ++i) {
    const double w = double(windows[i]), kw = double(std::min<int64_t>(p.index_topk, windows[i]));
    work[i] = nix * (hd * (w + kIxRowFixed) + kTopkPerK * double(p.index_topk)) + nl * (per_key * kw + kAttnRowFixed * hq * kv);
  }
  return work;
}

std::vector<int64_t> partition(const std::vector<double>& work, int parts) {
  const int64_t n = int64_t(work.size());
  require(n >= parts, "the set has " + std::to_string(n) + " query rows, fewer than the " + std::to_string(parts) +
                          " MPI ranks (each rank computes at least one row): use fewer ranks");
  double total = 0;
  for (double w : work) total += w;
  std::vector<int64_t> b(size_t(parts) + 1, 0);
  b[size_t(parts)] = n;
  double acc = 0;
  int64_t i = 0;
  for (int r = 1; r < parts; ++r) {
    const double goal = total * double(r) / double(parts);
    while (i < n && acc + work[size_t(i)] / 2 <= goal) acc += work[size_t(i++)];  // the row's middle decides
    // At least one row per part, and enough rows left for the parts after this one.
    b[size_t(r)] = std::clamp(i, b[size_t(r) - 1] + 1, n - (parts - r));
    while (i < b[size_t(r)]) acc += work[size_t(i++)];
    while (i > b[size_t(r)]) acc -= work[size_t(--i)];
  }
  return b;
}

golden::RowPart my_rows(const std::vector<double>& work, std::vector<int64_t>* bounds) {
  const std::vector<int64_t> b = partition(work, g_size);
  if (bounds) *bounds = b;
  golden::RowPart part{b[size_t(g_rank)], b[size_t(g_rank) + 1], {}};
  // The budget's row maxima of every rank, in row order. A collective inside a guarded step: the
  // check first, so that a rank which failed earlier in the step (and reports from its guarded
  // check) meets the others here instead of leaving them waiting in the gather.
  part.gather_rows = [b](const std::vector<double>& mine) {
    fault_point("budget");
    agree("");
    const size_t n_ranks = static_cast<size_t>(g_size);
    std::vector<int> counts(n_ranks), displs(n_ranks);
    for (int r = 0; r < g_size; ++r) {
      counts[size_t(r)] = int(b[size_t(r) + 1] - b[size_t(r)]);
      displs[size_t(r)] = int(b[size_t(r)]);
    }
    require(int64_t(mine.size()) == int64_t(counts[size_t(g_rank)]),
            "golden: the budget's row maxima hold " + std::to_string(mine.size()) + " rows, not this rank's " +
                std::to_string(counts[size_t(g_rank)]));
    std::vector<double> all(size_t(b.back()));
    MPI_Allgatherv(mine.data(), int(mine.size()), MPI_DOUBLE, all.data(), counts.data(), displs.data(), MPI_DOUBLE,
                   MPI_COMM_WORLD);
    return all;
  };
  return part;
}

namespace {

// Each layer's budget over every rank's rows: the parts' maxima combined (max over the ranks, a
// collective) into the manifest's budget_max_abs and emulation_max_abs.
void combine_budgets(golden::GoldenSet& part) {
  std::vector<double> local, global;
  for (const auto& [name, b] : part.shard.budgets) local.insert(local.end(), {b.emul, b.ref_round, b.emu_err});
  global.resize(local.size());
  MPI_Allreduce(local.data(), global.data(), int(local.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  size_t i = 0;
  for (const auto& [name, b] : part.shard.budgets) {
    (void)b;
    cmp::BudgetParts parts{global[i], global[i + 1]};
    part.manifest["budgets"][name]["budget_max_abs"] = cmp::attention_budget(parts);
    part.manifest["budgets"][name]["emulation_max_abs"] = global[i + 2];
    i += 3;
  }
}

// Writes this rank's share of the tensor file through the open MPI-IO handle fh (rank 0 the header
// and the key-side tensors, every rank its rows of the per-row ones), then syncs and closes it
// (collectives: every rank calls them, failed or not). Returns the first error, "" if none.
std::string write_tensor_file(MPI_File& fh, const std::string& path, const golden::GoldenSet& part, const std::string& header,
                              const std::vector<uint64_t>& offsets, uint64_t data0) {
  auto write_at = [&](uint64_t offset, const uint8_t* data, uint64_t n) {
    for (uint64_t done = 0; done < n;) {
      const uint64_t piece = std::min(kChunk, n - done);
      MPI_Status st;
      const int rc = MPI_File_write_at(fh, MPI_Offset(offset + done), data + done, int(piece), MPI_BYTE, &st);
      int count = 0;
      if (rc == MPI_SUCCESS) MPI_Get_count(&st, MPI_BYTE, &count);
      if (rc != MPI_SUCCESS || uint64_t(count) != piece)
        throw Error(path + ": cannot write " + std::to_string(piece) + " bytes at offset " + std::to_string(offset + done) +
                    " (MPI-IO): " + (rc != MPI_SUCCESS ? mpi_error(rc) : "short write"));
      done += piece;
    }
  };
  std::string write_error;
  try {
    const int64_t rows = part.shard.end - part.shard.begin;
    if (g_rank == 0) write_at(0, reinterpret_cast<const uint8_t*>(header.data()), header.size());
    for (size_t i = 0; i < part.tensors.size(); ++i) {
      const io::TensorView& v = part.tensors[i];
      if (part.shard.per_row.count(v.name)) {
        const uint64_t row_bytes = v.bytes.size() / uint64_t(rows);
        write_at(data0 + offsets[i] + uint64_t(part.shard.begin) * row_bytes, v.bytes.data(), v.bytes.size());
      } else if (g_rank == 0) {
        write_at(data0 + offsets[i], v.bytes.data(), v.bytes.size());
      }
    }
    fault_point("write");
  } catch (const std::exception& e) {
    write_error = e.what();
  }
  // Sync and close are collective: every rank calls them, failed or not.
  const int sync_rc = MPI_File_sync(fh);
  const int close_rc = MPI_File_close(&fh);
  if (write_error.empty() && sync_rc != MPI_SUCCESS) write_error = path + ": cannot sync (MPI-IO): " + mpi_error(sync_rc);
  if (write_error.empty() && close_rc != MPI_SUCCESS) write_error = path + ": cannot close (MPI-IO): " + mpi_error(close_rc);
  return write_error;
}

// The SHA-256 (hex, 64 bytes each) of every tensor, spread over the ranks by size (largest first to
// the least loaded rank): per-row tensors read back from the closed file at path, key-side ones
// from memory (every rank holds them). Rank 0 receives them all (the others' result is unused).
std::vector<unsigned char> hash_tensors(const golden::GoldenSet& part, const std::string& path, const std::vector<uint64_t>& offsets,
                                        const std::vector<uint64_t>& sizes, uint64_t data0,
                                        const std::function<void()>& remove_tmp) {
  const size_t n = sizes.size();
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  std::vector<int> owner(n);
  std::vector<uint64_t> load(static_cast<size_t>(g_size), 0);
  for (size_t i : order) {
    const int r = int(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = r;
    load[size_t(r)] += sizes[i];
  }
  std::vector<unsigned char> mine(n * 64, 0), hashes(n * 64, 0);
  guarded(
      [&] {
        for (size_t i = 0; i < n; ++i) {
          if (owner[i] != g_rank) continue;
          const io::TensorView& v = part.tensors[i];
          const std::string h = part.shard.per_row.count(v.name) ? io::sha256_file_range(path, data0 + offsets[i], sizes[i])
                                                                 : io::sha256_hex(v.bytes.data(), v.bytes.size());
          std::copy(h.begin(), h.end(), mine.begin() + ptrdiff_t(i * 64));
        }
        fault_point("hash");
      },
      remove_tmp);
  MPI_Reduce(mine.data(), hashes.data(), int(mine.size()), MPI_UNSIGNED_CHAR, MPI_MAX, 0, MPI_COMM_WORLD);
  return hashes;
}

}  // namespace

nlohmann::json write_golden(const std::string& dir, golden::GoldenSet part, bool force, WriteStats* stats) {
  namespace fs = std::filesystem;
  require(part.shard.active, "write_golden: the set is not a part (build it with a RowPart)");
  const std::string file_for_errors = dir + "/" + golden::kTensorFile;
  // 1. The whole set's header and offsets, the same on every rank.
  std::vector<io::TensorSpec> specs;
  for (const io::TensorView& v : part.tensors) {
    const auto it = part.shard.per_row.find(v.name);
    specs.push_back({v.name, v.dtype, it == part.shard.per_row.end() ? v.shape : it->second});
  }
  std::string header;
  std::vector<uint64_t> offsets;
  guarded([&] { header = io::encode_header(file_for_errors, specs, {{"format", "indexshare-golden"}}, &offsets); });
  const uint64_t data0 = header.size();

  // 2. The budgets: each layer's maxima over every rank's rows.
  phases::begin("write: budgets, staging");
  combine_budgets(part);

  // 3. Rank 0 stages the temporary folder; every rank learns its name.
  golden::Staging staged;
  guarded([&] {
    if (g_rank == 0) staged = golden::stage(dir, force, "mpi." + std::to_string(::getpid()));
  });
  staged.tmp = bcast(staged.tmp);
  const std::string path = (fs::path(staged.tmp) / golden::kTensorFile).string();
  auto remove_tmp = [&] {
    if (g_rank == 0) golden::discard(staged);
  };

  // 4. The tensor file: rank 0 the header and the key-side tensors, every rank its rows.
  phases::begin("write (MPI-IO)");
  const double t_write = now_s();
  MPI_File fh;
  const int open_rc = MPI_File_open(MPI_COMM_WORLD, path.c_str(), MPI_MODE_CREATE | MPI_MODE_WRONLY, MPI_INFO_NULL, &fh);
  guarded([&] { require(open_rc == MPI_SUCCESS, path + ": cannot create the file (MPI-IO): " + mpi_error(open_rc)); },
          remove_tmp);
  const std::string write_error = write_tensor_file(fh, path, part, header, offsets, data0);
  guarded([&] { require(write_error.empty(), write_error); }, remove_tmp);
  if (stats) stats->write_s = now_s() - t_write;

  // 5. SHA-256 of every tensor, spread over the ranks: per-row tensors read back from the closed
  // file, key-side ones from memory (every rank holds them).
  phases::begin("hash (SHA-256 read-back)");
  const double t_hash = now_s();
  const size_t n = specs.size();
  std::vector<uint64_t> sizes(n);
  for (size_t i = 0; i < n; ++i) sizes[i] = uint64_t(shape_numel(specs[i].shape)) * io::dtype_size(specs[i].dtype);
  const std::vector<unsigned char> hashes = hash_tensors(part, path, offsets, sizes, data0, remove_tmp);
  if (stats) stats->hash_s = now_s() - t_hash;

  // 6. Rank 0: the manifest, then one rename publishes the set.
  phases::begin("publish (manifest, rename)");
  nlohmann::json written = nlohmann::json::object();
  guarded(
      [&] {
        if (g_rank != 0) return;
        std::vector<std::string> hex(n);
        for (size_t i = 0; i < n; ++i) hex[i].assign(reinterpret_cast<const char*>(hashes.data()) + i * 64, 64);
        part.manifest["tensors"] = golden::tensor_list(specs, hex, part.roles);
        written = golden::publish(staged, std::move(part.manifest));  // removes the folder itself on failure
      });
  return written;
}

void fold_in_order(std::span<const uint8_t> local, const std::function<void(std::span<const uint8_t>)>& f) {
  if (g_rank != 0) {
    uint64_t n = local.size();
    MPI_Send(&n, 1, MPI_UINT64_T, 0, 7, MPI_COMM_WORLD);
    for (uint64_t done = 0; done < n;) {
      const uint64_t piece = std::min(kChunk, n - done);
      MPI_Send(local.data() + done, int(piece), MPI_BYTE, 0, 8, MPI_COMM_WORLD);
      done += piece;
    }
    return;
  }
  f(local);
  std::vector<uint8_t> buf;
  for (int r = 1; r < g_size; ++r) {
    uint64_t n = 0;
    MPI_Recv(&n, 1, MPI_UINT64_T, r, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    buf.resize(n);
    for (uint64_t done = 0; done < n;) {
      const uint64_t piece = std::min(kChunk, n - done);
      MPI_Recv(buf.data() + done, int(piece), MPI_BYTE, r, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      done += piece;
    }
    f(buf);
  }
}

int64_t sum(int64_t local) {
  int64_t total = 0;
  MPI_Allreduce(&local, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

double from_rank0(double value) {
  MPI_Bcast(&value, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return value;
}

std::string rank_report(const std::vector<int64_t>& bounds, double compute_s) {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  const double cpu = double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  double mine[3] = {compute_s, double(ru.ru_maxrss) / 1024.0, cpu};  // MiB
  std::vector<double> all(static_cast<size_t>(3 * g_size));
  MPI_Gather(mine, 3, MPI_DOUBLE, all.data(), 3, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (g_rank != 0) return "";
  std::string out;
  char line[160];
  for (int r = 0; r < g_size; ++r) {
    std::snprintf(line, sizeof line, "rank %-4d rows [%lld, %lld)  compute %.2f s  process CPU %.2f s  peak RSS %.0f MiB\n", r,
                  (long long)bounds[size_t(r)], (long long)bounds[size_t(r) + 1], all[size_t(3 * r)], all[size_t(3 * r + 2)],
                  all[size_t(3 * r + 1)]);
    out += line;
  }
  return out;
}

std::string timing_report() {
  // Every rank's phases as "name\twall\tcpu\n" lines, gathered to rank 0 as text.
  std::string mine;
  char num[64];
  for (const phases::Phase& ph : phases::recorded()) {
    std::snprintf(num, sizeof num, "\t%.6f\t%.6f\n", ph.wall_s, ph.cpu_s);
    mine += ph.name + num;
  }
const std::vector<std::string> texts = gather_texts(mine);
  if (g_rank != 0) return "";
  // Rows: the phases in order of first appearance over the ranks; columns: wall / CPU per rank.
  std::vector<std::string> names;
  std::vector<std::map<std::string, std::pair<double, double>>> per(static_cast<size_t>(g_size));
  for (int r = 0; r < g_size; ++r) {
    std::istringstream in(texts[size_t(r)]);
    std::string line;
    while (std::getline(in, line)) {
      const size_t a = line.find('\t'), b = line.find('\t', a + 1);
      const std::string name = line.substr(0, a);
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
      per[size_t(r)][name] = {std::atof(line.substr(a + 1, b - a - 1).c_str()), std::atof(line.substr(b + 1).c_str())};
    }
  }
  std::string out = "timing    phase (INDEXSHARE_TIMING; seconds, wall / process CPU)";
  for (int r = 0; r < g_size; ++r) {
    std::snprintf(num, sizeof num, "  %15s", ("rank " + std::to_string(r)).c_str());
    out += num;
  }
  out += "\n";
  std::vector<double> sum_w(static_cast<size_t>(g_size), 0), sum_c(static_cast<size_t>(g_size), 0);
  for (const std::string& name : names) {
    char head[80];
    std::snprintf(head, sizeof head, "          %-55s", name.c_str());
    out += head;
    for (int r = 0; r < g_size; ++r) {
      const auto it = per[size_t(r)].find(name);
      const auto [w, c] = it == per[size_t(r)].end() ? std::pair<double, double>{0, 0} : it->second;
      sum_w[size_t(r)] += w;
      sum_c[size_t(r)] += c;
      std::snprintf(num, sizeof num, "  %7.3f /%6.3f", w, c);
      out += num;
    }
    out += "\n";
  }
  char head[80];
  std::snprintf(head, sizeof head, "          %-55s", "total (MPI_Init to this report)");
  out += head;
  for (int r = 0; r < g_size; ++r) {
    std::snprintf(num, sizeof num, "  %7.3f /%6.3f", sum_w[size_t(r)], sum_c[size_t(r)]);
    out += num;
  }
  return out + "\n";
}

}  // namespace indexshare::dist
