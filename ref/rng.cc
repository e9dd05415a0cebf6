#include "ref/rng.h"

#include <algorithm>

#include "ref/error.h"
#include "ref/numerics.h"

namespace indexshare {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Xoshiro256::Xoshiro256(uint64_t seed) {
  uint64_t st = seed;
  for (auto& s : s_) s = splitmix64(st);
}

Xoshiro256 Xoshiro256::from_state(uint64_t s0, uint64_t s1, uint64_t s2, uint64_t s3) {
  Xoshiro256 g;
  g.s_[0] = s0; g.s_[1] = s1; g.s_[2] = s2; g.s_[3] = s3;
  return g;
}

uint64_t Xoshiro256::next() {
  auto rotl = [](uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  const uint64_t result = rotl(s_[1] * 5, 7) * 9, t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

uint64_t Xoshiro256::below(uint64_t n) {
  // Lemire's nearly divisionless method: exact uniform on [0, n).
  for (;;) {
    const unsigned __int128 m = (unsigned __int128)next() * n;
    const uint64_t lo = uint64_t(m);
    if (lo >= n || lo >= (0 - n) % n) return uint64_t(m >> 64);
  }
}

uint64_t stream_tag(const std::string& name) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

inline float draw_inline(Xoshiro256& g, Dist dist);

std::string dist_name(Dist d) {
  switch (d) {
    case Dist::uniform: return "uniform";
    case Dist::normal: return "normal";
    case Dist::integer: return "int";
    case Dist::dyadic: return "dyadic";
    case Dist::ties: return "ties";
    case Dist::narrow: return "narrow";
  }
  return "?";
}

Dist parse_dist(const std::string& name) {
  for (Dist d : {Dist::uniform, Dist::normal, Dist::integer, Dist::dyadic, Dist::ties, Dist::narrow})
    if (dist_name(d) == name) return d;
  throw Error("unknown distribution '" + name +
              "' (expected uniform, normal, int, dyadic, ties or narrow)");
}

float draw(Xoshiro256& g, Dist dist) { return draw_inline(g, dist); }

namespace {
// fill_range's loop for one distribution: draw_inline specialised and inlined (the switch and the
// generator calls out of the loop). The same values as draw, in the same order.
template <Dist kDist>
void draw_n(Xoshiro256& g, float* out, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) out[i] = draw_inline(g, kDist) * scale;
}
template <Dist kDist>
void skip_n(Xoshiro256& g, int64_t n) {
  for (int64_t i = 0; i < n; ++i) (void)draw_inline(g, kDist);
}
void draw_range(Xoshiro256& g, Dist dist, float* out, int64_t n, float scale) {
  switch (dist) {
    case Dist::uniform: return draw_n<Dist::uniform>(g, out, n, scale);
    case Dist::normal: return draw_n<Dist::normal>(g, out, n, scale);
    case Dist::integer: return draw_n<Dist::integer>(g, out, n, scale);
    case Dist::dyadic: return draw_n<Dist::dyadic>(g, out, n, scale);
    case Dist::ties: return draw_n<Dist::ties>(g, out, n, scale);
    case Dist::narrow: return draw_n<Dist::narrow>(g, out, n, scale);
  }
}
void skip_range(Xoshiro256& g, Dist dist, int64_t n) {
  switch (dist) {
    case Dist::uniform: return skip_n<Dist::uniform>(g, n);
    case Dist::normal: return skip_n<Dist::normal>(g, n);
    case Dist::integer: return skip_n<Dist::integer>(g, n);
    case Dist::dyadic: return skip_n<Dist::dyadic>(g, n);
    case Dist::ties: return skip_n<Dist::ties>(g, n);
    case Dist::narrow: return skip_n<Dist::narrow>(g, n);
  }
}
}  // namespace

// draw's definition, inlined into the fill loops.
inline float draw_inline(Xoshiro256& g, Dist dist) {
  switch (dist) {
    case Dist::uniform:
      return float(int64_t(g.next() >> 40) - (int64_t(1) << 23)) * 0x1p-23f;
    case Dist::normal: {
      // Twelve 16-bit draws from three 64-bit outputs; the sum is an integer in [0, 786420].
      int64_t sum = 0;
      for (int i = 0; i < 3; ++i) {
        const uint64_t r = g.next();
        for (int j = 0; j < 4; ++j) sum += int64_t((r >> (16 * j)) & 0xFFFF);
      }
      // Mean 12 * 32767.5 = 393210; (sum - mean) / 65536 has variance 12 * (2^32 - 1) / 12 / 2^32.
      return float(sum - 393210) * 0x1p-16f;
    }
    case Dist::integer: return float(int64_t(g.below(9)) - 4);
    case Dist::dyadic: return float(int64_t(g.below(33)) - 16) * 0.125f;
    case Dist::ties: {
      static constexpr float kLevels[4] = {-1.0f, -0.5f, 0.5f, 1.0f};
      return kLevels[g.below(4)];
    }
    case Dist::narrow: return 1.0f + float(int64_t(g.below(17)) - 8) * 0x1p-12f;
  }
  return 0.0f;
}

Xoshiro256 chunk_generator(uint64_t seed, uint64_t tag, int64_t c) {
  uint64_t st = seed ^ 0x5DEECE66Dull;
  st = splitmix64(st) ^ tag;
  st = splitmix64(st) ^ uint64_t(c);
  return Xoshiro256(splitmix64(st));
}

void fill(float* out, int64_t n, Dist dist, float scale, uint64_t seed, uint64_t tag) {
  fill_range(out, 0, n, dist, scale, seed, tag);
}

void fill_range(float* out, int64_t start, int64_t n, Dist dist, float scale, uint64_t seed, uint64_t tag) {
  require(start >= 0 && n >= 0, "fill_range: start and n must be >= 0");
  const int64_t end = start + n;
  const int64_t c_begin = start / kChunk, c_end = (end + kChunk - 1) / kChunk;  // chunks touched
  // Every chunk has its own generator and its own slice of out, so chunks are filled in
  // parallel (OpenMP, when there are enough of them): the bytes never depend on the thread count.
#pragma omp parallel for schedule(static) if (c_end - c_begin >= 8)
  for (int64_t c = c_begin; c < c_end; ++c) {
    const int64_t c0 = c * kChunk;
    Xoshiro256 g = chunk_generator(seed, tag, c);
    // Values before `start` in the first chunk are drawn and discarded: a draw may consume a
    // variable number of generator outputs (rejection), so there is no shortcut to element i.
    if (c0 < start) skip_range(g, dist, start - c0);
    const int64_t c1 = c0 + kChunk < end ? c0 + kChunk : end;
    const int64_t i0 = c0 < start ? start : c0;
    draw_range(g, dist, out + (i0 - start), c1 - i0, scale);
  }
}

void fill_range_bf16(bf16_t* out, int64_t start, int64_t n, Dist dist, float scale, uint64_t seed, uint64_t tag) {
  require(start >= 0 && n >= 0, "fill_range: start and n must be >= 0");
  const int64_t end = start + n;
  const int64_t c_begin = start / kChunk, c_end = (end + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (c_end - c_begin >= 8)
  for (int64_t c = c_begin; c < c_end; ++c) {
    const int64_t lo = std::max(start, c * kChunk), hi = std::min(end, (c + 1) * kChunk);
    float buf[kChunk];
    fill_range(buf, lo, hi - lo, dist, scale, seed, tag);
    for (int64_t k = 0; k < hi - lo; ++k) out[lo - start + k] = f32_to_bf16(buf[k]);
  }
}

}  // namespace indexshare
