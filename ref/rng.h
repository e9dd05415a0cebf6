// indexshare: the project's own random numbers, identical on every machine.
//
// Why not <random>: the standard library fixes the engines' output but not the distributions'
// algorithms, so std::normal_distribution gives different numbers on libstdc++, libc++ and MSVC,
// and golden tensors would silently change. Here both the engine and every int -> float mapping
// are ours, use only integer arithmetic and exactly rounded IEEE operations (no libm), and so
// give the same bits everywhere.
//
// Engine: SplitMix64 (Steele, Lea, Flood 2014) seeds a xoshiro256** generator (Blackman, Vigna).
// Streams: a tensor is filled in chunks of kChunk elements; chunk c of stream `tag` under seed
// `seed` gets its own generator seeded from mix(seed, tag, c). Any thread can fill any chunk, so
// the result never depends on the thread count or on the order in which chunks are filled
// (fill_range fills the chunks of a long range in parallel with OpenMP).
#pragma once

#include <cstdint>
#include <string>

namespace indexshare {

struct bf16_t;

class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t seed);
  // A generator with an explicit state (not all zero), for the published test vectors.
  static Xoshiro256 from_state(uint64_t s0, uint64_t s1, uint64_t s2, uint64_t s3);
  uint64_t next();
  // Uniform integer in [0, n), n >= 1, by the multiply-high method with rejection (exact).
  uint64_t below(uint64_t n);
  // The four state words s0..s3 (for a generator that runs several streams in vector lanes).
  void state(uint64_t out[4]) const { for (int i = 0; i < 4; ++i) out[i] = s_[i]; }

 private:
  Xoshiro256() = default;
  uint64_t s_[4];
};

uint64_t splitmix64(uint64_t& state);
// A 64-bit stream tag from a name such as "layers.0.indexer.q" (FNV-1a), so streams are stable
// when tensors are added or reordered.
uint64_t stream_tag(const std::string& name);

// Distributions of generated values. All are exact in f32 (and, where noted, in bf16).
enum class Dist {
  uniform,  // u in [-1, 1): k * 2^-23 for an integer k in [-2^23, 2^23)
  normal,   // approximately N(0, 1): Irwin-Hall sum of 12 uniform 16-bit integers, centred and
            // scaled by 2^-16 (support [-6, 6], variance 1 - 1/2^32); exact in f32
  integer,  // small integers uniform in [-4, 4]: exact in bf16 and e4m3
  dyadic,   // k / 8 for k uniform in [-16, 16]: exact in bf16 and e4m3 (3 mantissa bits)
  ties,     // one of 4 levels {-1, -0.5, 0.5, 1}: produces many exactly tied scores
  narrow,   // 1 + k * 2^-12 for k uniform in [-8, 8]: a narrow band of close values
};
std::string dist_name(Dist d);
Dist parse_dist(const std::string& name);  // throws Error naming the bad value

// One value of `dist` from the generator.
float draw(Xoshiro256& g, Dist dist);

constexpr int64_t kChunk = 4096;
// The generator of chunk c of stream (seed, tag), positioned at the chunk's first element:
// seeded by splitmix64 from seed ^ 0x5DEECE66D, then tag, then c (see rng.cc).
Xoshiro256 chunk_generator(uint64_t seed, uint64_t tag, int64_t c);
// Fills out[0, n) with values of `dist`, times `scale` (one f32 multiply each), from the stream
// (seed, tag). Chunked as described above.
void fill(float* out, int64_t n, Dist dist, float scale, uint64_t seed, uint64_t tag);
// Elements [start, start + n) of the same stream into out[0, n), bit-identical to the slice
// out_full[start, start + n) of fill(out_full, N, ...) for any N >= start + n. Chunks before the
// one holding `start` are never generated (their generators are seeded directly), so a range of a
// huge tensor costs O(n + kChunk) draws: e.g. one query row of q [s_q, H, D] is the range
// [t H D, (t + 1) H D).
void fill_range(float* out, int64_t start, int64_t n, Dist dist, float scale, uint64_t seed, uint64_t tag);
// f32_to_bf16 of fill_range's values (the same bytes), a chunk of the stream at a time, the chunks
// in parallel: the f32 values are never held whole.
void fill_range_bf16(bf16_t* out, int64_t start, int64_t n, Dist dist, float scale, uint64_t seed, uint64_t tag);

}  // namespace indexshare
