#include "gemm.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <string>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "thread_pool.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CANDLE_NN_GEMM_X86 1
#define CANDLE_NN_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,fma")))
#define CANDLE_NN_TARGET_AVX2 __attribute__((target("avx2,fma")))
#endif

namespace candle_nn::gemm {

namespace {

// Blocking (floats): a task's A block is kMc rows x kKc columns (in L2), one B micro-panel
// kKc x 32 (32 KiB, in L1) is reused by the kMc / mr micro-kernel calls of a block.
constexpr int64_t kKc = 256;
constexpr int64_t kMc = 96;

// dst[0, n) = src[0, n) (src == nullptr: zeros); inline, as most runs are a few channels long.
inline void copy_run(float* dst, const float* src, int64_t n) {
  if (n >= 64) {
    src ? std::memcpy(dst, src, sizeof(float) * n) : std::memset(dst, 0, sizeof(float) * n);
    return;
  }
  if (src)
    for (int64_t q = 0; q < n; ++q) dst[q] = src[q];
  else
    for (int64_t q = 0; q < n; ++q) dst[q] = 0.0f;
}

// Copies A rows [m0, m0 + rows), columns [k0, k0 + kc) of the im2col matrix to dst (ld kc).
// Column kk = (i * kw + j) * c + channel: per output pixel and kernel row i the taps j are
// adjacent pixels of x (whatever the stride), so the taps inside the image are one contiguous
// run of x (kw * c floats for a whole kernel row away from the borders).
void im2col_block(const ASource& s, int64_t m0, int64_t rows, int64_t k0, int64_t kc,
                  float* dst) {
  const int64_t hw = static_cast<int64_t>(s.oh) * s.ow;
  const int64_t c = s.c, k1 = k0 + kc, row_len = s.kw * c;
  const int64_t i0 = k0 / row_len, i1 = (k1 + row_len - 1) / row_len;
  for (int64_t r = 0; r < rows; ++r, dst += kc) {
    int64_t m = m0 + r;
    int64_t img = m / hw;
    int oy = static_cast<int>((m / s.ow) % s.oh), ox = static_cast<int>(m % s.ow);
    const float* base = s.data + img * s.h * static_cast<int64_t>(s.w) * c;
    int iy0 = oy * s.sh - s.ph, ix0 = ox * s.sw - s.pw;
    // taps j in [j_lo, j_hi) are inside the image horizontally
    int j_lo = std::max(0, -ix0), j_hi = std::min(s.kw, s.w - ix0);
    for (int64_t i = i0; i < i1; ++i) {
      int64_t lo = std::max(k0, i * row_len), hi = std::min(k1, (i + 1) * row_len);
      float* d = dst + (lo - k0);
      int iy = iy0 + static_cast<int>(i);
      if (iy < 0 || iy >= s.h || j_lo >= j_hi) {
        copy_run(d, nullptr, hi - lo);
        continue;
      }
      // [lo, hi) relative to the kernel row: zeros left of j_lo, x's run, zeros from j_hi
      int64_t a = lo - i * row_len, b = hi - i * row_len;
      int64_t in_lo = j_lo * c, in_hi = j_hi * c;
      const float* src = base + (static_cast<int64_t>(iy) * s.w + ix0) * c;
      if (a < in_lo) {
        int64_t e = std::min(b, in_lo);
        copy_run(d, nullptr, e - a);
        d += e - a;
        a = e;
      }
      if (a < b && a < in_hi) {
        int64_t e = std::min(b, in_hi);
        copy_run(d, src + a, e - a);
        d += e - a;
        a = e;
      }
      if (a < b) copy_run(d, nullptr, b - a);
    }
  }
}

#ifdef CANDLE_NN_GEMM_X86
// The micro-kernels: C tile (R rows x `cols` columns) = or += A (R rows, row stride lda, kc
// columns) · the B micro-panel (kc rows of 16 floats; AVX-512's second 16 columns come from the
// next panel, bs floats on). Columns past `cols` are neither read nor written.
using Kernel = void (*)(const float* a, int64_t lda, const float* b, int64_t bs, float* c,
                        int64_t ldc, int64_t kc, bool accumulate, int cols);

// Each instruction set's vector operations for accumulate_tile. The micro-kernels are `flatten`:
// these and accumulate_tile are inlined into them, so compiled for their target (always_inline
// from the target-less accumulate_tile would be refused as a target mismatch).
#define CANDLE_NN_GEMM_FLATTEN __attribute__((flatten))

struct Avx512Ops {
  using V = __m512;
  CANDLE_NN_TARGET_AVX512 static V zero() { return _mm512_setzero_ps(); }
  // Vector v of row k: AVX-512's second 16 columns are the next panel's, bs floats on.
  CANDLE_NN_TARGET_AVX512 static V load_b(const float* b, int64_t bs, int64_t k, int v) {
    return _mm512_loadu_ps(b + v * bs + k * kPanel);
  }
  CANDLE_NN_TARGET_AVX512 static V broadcast(const float* a) { return _mm512_set1_ps(*a); }
  CANDLE_NN_TARGET_AVX512 static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  // C tile (R rows, row stride ldc) = or += acc; columns past `cols` neither read nor written.
  template <int R, int NV>
  CANDLE_NN_TARGET_AVX512 static void store_tile(const V (&acc)[R][NV], float* c, int64_t ldc,
                                                 bool accumulate, int cols) {
    const __mmask16 last = static_cast<__mmask16>((1u << (cols - (NV - 1) * 16)) - 1u);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        float* p = c + r * ldc + v * 16;
        __mmask16 m = v == NV - 1 ? last : static_cast<__mmask16>(0xffff);
        __m512 x = acc[r][v];
        if (accumulate) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, p));
        _mm512_mask_storeu_ps(p, m, x);
      }
    }
  }
};

struct Avx2Ops {
  using V = __m256;
  CANDLE_NN_TARGET_AVX2 static V zero() { return _mm256_setzero_ps(); }
  // Vector v of row k: the panel's 16 columns are two vectors of 8.
  CANDLE_NN_TARGET_AVX2 static V load_b(const float* b, int64_t, int64_t k, int v) {
    return _mm256_loadu_ps(b + k * kPanel + v * 8);
  }
  CANDLE_NN_TARGET_AVX2 static V broadcast(const float* a) { return _mm256_broadcast_ss(a); }
  CANDLE_NN_TARGET_AVX2 static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  // C tile (R rows, row stride ldc) = or += acc; columns past `cols` neither read nor written.
  template <int R, int NV>
  CANDLE_NN_TARGET_AVX2 static void store_tile(const V (&acc)[R][NV], float* c, int64_t ldc,
                                               bool accumulate, int cols) {
    alignas(32) static const int32_t lanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                                  0,  0,  0,  0,  0,  0,  0,  0};
    const int tail = cols - (NV - 1) * 8;  // 1..8 columns in the last vector
    const __m256i last = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lanes + 8 - tail));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) {
        float* p = c + r * ldc + v * 8;
        __m256 x = acc[r][v];
        if (v < NV - 1 || tail == 8) {
          if (accumulate) x = _mm256_add_ps(x, _mm256_loadu_ps(p));
          _mm256_storeu_ps(p, x);
        } else {
          if (accumulate) x = _mm256_add_ps(x, _mm256_maskload_ps(p, last));
          _mm256_maskstore_ps(p, last, x);
        }
      }
    }
  }
};

// acc (R rows x NV vectors) = A (R rows, row stride lda, kc columns) · the B micro-panel.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // vector values; only ever inlined into a kernel
template <class Ops, int R, int NV>
inline void accumulate_tile(typename Ops::V (&acc)[R][NV], const float* a, int64_t lda,
                            const float* b, int64_t bs, int64_t kc) {
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = Ops::zero();
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; ++k) {
    typename Ops::V bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = Ops::load_b(b, bs, k, v);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      typename Ops::V av = Ops::broadcast(a + r * lda + k);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = Ops::fma(av, bv[v], acc[r][v]);
    }
  }
}

// One micro-kernel call (see Kernel): the tile accumulated in registers, then stored.
template <class Ops, int R, int NV>
inline void micro_kernel(const float* a, int64_t lda, const float* b, int64_t bs, float* c,
                         int64_t ldc, int64_t kc, bool accumulate, int cols) {
  typename Ops::V acc[R][NV];
  accumulate_tile<Ops, R, NV>(acc, a, lda, b, bs, kc);
  Ops::template store_tile<R, NV>(acc, c, ldc, accumulate, cols);
}
#pragma GCC diagnostic pop

constexpr int kMaxMr = 12;

// One instruction set's kernels: table[nv - 1][rows - 1] for tiles of `mr` rows and up to
// `vectors` vectors of `width` columns.
struct Isa {
  const char* name;
  int mr, width, vectors;
  std::array<std::array<Kernel, kMaxMr>, 2> table;
};

// Tiles of more than `mr` rows (only ever called with `mr` rows) share the `mr`-row kernel.
template <template <int, int> class K, int NV, int Mr, int... R>
constexpr std::array<Kernel, kMaxMr> rows_table(std::integer_sequence<int, R...>) {
  return {&K<(R + 1 < Mr ? R + 1 : Mr), NV>::run...};
}

// The micro-kernel table entry of one instruction set: micro_kernel compiled for `target` (a
// function attribute, so not a template argument: one macro states the wrapper once).
#define CANDLE_NN_GEMM_KERNELS(name, ops, target)                                                \
  template <int R, int NV>                                                                        \
  struct name {                                                                                   \
    target CANDLE_NN_GEMM_FLATTEN static void run(const float* a, int64_t lda, const float* b,    \
                                                  int64_t bs, float* c, int64_t ldc, int64_t kc,  \
                                                  bool acc, int cols) {                           \
      micro_kernel<ops, R, NV>(a, lda, b, bs, c, ldc, kc, acc, cols);                             \
    }                                                                                             \
  };
// AVX-512: 12 rows x 2 vectors of 16 = 24 accumulators of the 32 zmm registers.
CANDLE_NN_GEMM_KERNELS(Avx512K, Avx512Ops, CANDLE_NN_TARGET_AVX512)
// AVX2 + FMA: 6 rows x 2 vectors of 8 (one 16-column panel) = 12 of the 16 ymm registers.
CANDLE_NN_GEMM_KERNELS(Avx2K, Avx2Ops, CANDLE_NN_TARGET_AVX2)

const Isa kAvx512{"avx512", 12, 16, 2,
                  {rows_table<Avx512K, 1, 12>(std::make_integer_sequence<int, kMaxMr>{}),
                   rows_table<Avx512K, 2, 12>(std::make_integer_sequence<int, kMaxMr>{})}};
const Isa kAvx2{"avx2", 6, 8, 2,
                {rows_table<Avx2K, 1, 6>(std::make_integer_sequence<int, kMaxMr>{}),
                 rows_table<Avx2K, 2, 6>(std::make_integer_sequence<int, kMaxMr>{})}};

bool cpu_has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq");
}
bool cpu_has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

const Isa* best_isa() {
  if (cpu_has_avx512()) return &kAvx512;
  if (cpu_has_avx2()) return &kAvx2;
  return nullptr;
}

std::atomic<const Isa*> g_isa{best_isa()};

// Row tiles of a block of `rows` rows: ceil(rows / mr) register tiles of near-equal heights,
// tile t starting at row start(t). A remainder tile of a row or two runs at the multiply-add
// latency, not its throughput (about the time of a 4-row tile): 49 rows as 4 x 6 + 5 x 5 rows,
// not 8 x 6 + 1.
struct RowTiles {
  int64_t rows, count;
  RowTiles(int64_t rows, int mr) : rows(rows), count((rows + mr - 1) / mr) {}
  int64_t start(int64_t t) const { return t * rows / count; }
  int height(int64_t t) const { return static_cast<int>(start(t + 1) - start(t)); }
};

// The B micro-panel a task reads next, fetched into L2 while the current one is in use: rows
// [pc, pc + rows) of the packed panels from column `j` on (`cols` columns; 0 rows: none). Each
// micro-panel is a fresh run of B (the next 16 columns are 16 * k floats on), and where B comes
// from memory (the weights of a 7x7 or 14x14 stage at batch 1, reused by a few row tiles only)
// the hardware prefetchers only catch up after its first lines have missed.
struct NextPanel {
  const float* b = nullptr;  // rows [pc, ...) of the first panel
  int64_t rows = 0, panels = 0;
};

NextPanel next_panel(const float* bp, int64_t k, int64_t j, int64_t cols, int64_t pc,
                     int64_t rows) {
  if (rows <= 0 || cols <= 0) return {};
  return {bp + (j / kPanel) * kPanel * k + pc * kPanel, rows, (cols + kPanel - 1) / kPanel};
}

// Part `t` of `parts` of a NextPanel's lines (one 16-float row of a panel is one 64-byte line).
inline void prefetch_part(const NextPanel& p, int64_t k, int64_t t, int64_t parts) {
  const int64_t r0 = t * p.rows / parts, r1 = (t + 1) * p.rows / parts;
  for (int64_t v = 0; v < p.panels; ++v)
    for (int64_t r = r0; r < r1; ++r) __builtin_prefetch(p.b + v * kPanel * k + r * kPanel, 0, 2);
}

// The C rows [r0, r1), columns [j, j + cols) a micro-kernel call is about to store for the first
// time, fetched while the call before it runs: a conv's output is a fresh buffer, and each first
// store to one of its lines otherwise waits for that line to come from L3 or memory.
inline void prefetch_c(const float* c, int64_t ldc, int64_t r0, int64_t r1, int64_t j,
                       int64_t cols) {
  for (int64_t r = r0; r < r1; ++r) {
    __builtin_prefetch(c + r * ldc + j, 1, 3);
    __builtin_prefetch(c + r * ldc + j + cols - 1, 1, 3);
  }
}

// One task: C rows [m0, m0 + mc), columns [n0, n1) (n0 a multiple of 16).
void block(const Isa& isa, const ASource& a, const float* bp, float* c, int64_t ldc, int64_t m0,
           int64_t mc, int64_t n0, int64_t n1, int64_t k, std::vector<float>& buf) {
  const int64_t tile_cols = static_cast<int64_t>(isa.width) * isa.vectors;
  // K in equal blocks of at most ~kKc (one block up to 2 * kKc: no partial sums to reload).
  int64_t kb = k <= 2 * kKc ? 1 : (k + kKc - 1) / kKc;
  int64_t kcb = (k + kb - 1) / kb;
  const RowTiles tiles(mc, isa.mr);
  for (int64_t pc = 0; pc < k; pc += kcb) {
    int64_t kc = std::min(kcb, k - pc);
    const float* ablk;
    int64_t lda;
    if (a.im2col) {
      if (buf.size() < static_cast<size_t>(mc * kc)) buf.resize(mc * kc);
      im2col_block(a, m0, mc, pc, kc, buf.data());
      ablk = buf.data();
      lda = kc;
    } else {
      ablk = a.data + m0 * a.lda + pc;
      lda = a.lda;
    }
    for (int64_t j = n0; j < n1; j += tile_cols) {
      int cols = static_cast<int>(std::min(tile_cols, n1 - j));
      int nv = (cols + isa.width - 1) / isa.width;
      const float* bj = bp + (j / kPanel) * kPanel * k + pc * kPanel;
      const auto& table = isa.table[nv - 1];
      const NextPanel next =
          j + tile_cols < n1
              ? next_panel(bp, k, j + tile_cols, std::min(tile_cols, n1 - j - tile_cols), pc, kc)
              : next_panel(bp, k, n0, std::min(tile_cols, n1 - n0), pc + kc,
                           std::min(kcb, k - pc - kc));
      for (int64_t t = 0; t < tiles.count; ++t) {
        prefetch_part(next, k, t, tiles.count);
        if (pc == 0 && t + 1 < tiles.count)
          prefetch_c(c, ldc, m0 + tiles.start(t + 1), m0 + tiles.start(t + 2), j, cols);
        const int64_t i = tiles.start(t);
        table[tiles.height(t) - 1](ablk + i * lda, lda, bj, kPanel * k, c + (m0 + i) * ldc + j,
                                   ldc, kc, pc > 0, cols);
      }
    }
  }
}

// One task of a conv (im2col source) without the im2col copy where it can: K blocks follow the
// kernel rows, and a register tile whose rows are adjacent pixels of one output row, with every
// tap inside the image, reads x in place (row r of the tile starts sw * c floats after row r - 1;
// a kernel row's kw taps are kw * c contiguous floats). A tile off the image vertically adds
// nothing for that kernel row and is skipped; other tiles (image borders, output-row ends) are
// gathered as before. Same contract as block.
void block_conv(const Isa& isa, const ASource& a, const float* bp, float* c, int64_t ldc,
                int64_t m0, int64_t mc, int64_t n0, int64_t n1, int64_t k,
                std::vector<float>& buf) {
  const int64_t tile_cols = static_cast<int64_t>(isa.width) * isa.vectors;
  const int64_t row_len = static_cast<int64_t>(a.kw) * a.c;
  const int64_t chunks = (row_len + 2 * kKc - 1) / (2 * kKc);
  const int64_t chunk = (row_len + chunks - 1) / chunks;
  const int64_t hw = static_cast<int64_t>(a.oh) * a.ow;
  const RowTiles row_tiles(mc, isa.mr);
  const int64_t ntiles = row_tiles.count;
  struct TileA {
    const float* p;
    int64_t lda;
    bool skip, written;
  };
  thread_local std::vector<TileA> tiles;
  tiles.assign(ntiles, TileA{nullptr, 0, false, false});
  if (buf.size() < static_cast<size_t>(mc * chunk)) buf.resize(mc * chunk);
  for (int64_t i = 0; i < a.kh; ++i) {
    for (int64_t c0 = 0; c0 < row_len; c0 += chunk) {
      const int64_t kc = std::min(chunk, row_len - c0), pc = i * row_len + c0;
      for (int64_t t = 0; t < ntiles; ++t) {
        const int64_t r0 = row_tiles.start(t), rows = row_tiles.height(t);
        const int64_t m = m0 + r0, img = m / hw;
        const int oy = static_cast<int>((m / a.ow) % a.oh), ox = static_cast<int>(m % a.ow);
        const int iy = oy * a.sh - a.ph + static_cast<int>(i);
        const int ix_first = ox * a.sw - a.pw;
        const int ix_last = static_cast<int>(ox + rows - 1) * a.sw - a.pw;
        auto& tile = tiles[t];
        const bool one_row = ox + rows <= a.ow;
        tile.skip = one_row && (iy < 0 || iy >= a.h);
        if (tile.skip) continue;
        if (one_row && ix_first >= 0 && ix_last + a.kw <= a.w) {
          tile.p = a.data + ((img * a.h + iy) * static_cast<int64_t>(a.w) + ix_first) * a.c + c0;
          tile.lda = static_cast<int64_t>(a.sw) * a.c;
        } else {
          im2col_block(a, m, rows, pc, kc, buf.data() + r0 * kc);
          tile.p = buf.data() + r0 * kc;
          tile.lda = kc;
        }
      }
      for (int64_t j = n0; j < n1; j += tile_cols) {
        int cols = static_cast<int>(std::min(tile_cols, n1 - j));
        int nv = (cols + isa.width - 1) / isa.width;
        const float* bj = bp + (j / kPanel) * kPanel * k + pc * kPanel;
        const auto& table = isa.table[nv - 1];
        const NextPanel next =
            j + tile_cols < n1
                ? next_panel(bp, k, j + tile_cols, std::min(tile_cols, n1 - j - tile_cols), pc, kc)
                : next_panel(bp, k, n0, std::min(tile_cols, n1 - n0), pc + kc,
                             std::min(chunk, k - pc - kc));
        for (int64_t t = 0; t < ntiles; ++t) {
          prefetch_part(next, k, t, ntiles);
          if (t + 1 < ntiles && !tiles[t + 1].written)
            prefetch_c(c, ldc, m0 + row_tiles.start(t + 1), m0 + row_tiles.start(t + 2), j, cols);
          if (tiles[t].skip) continue;
          table[row_tiles.height(t) - 1](tiles[t].p, tiles[t].lda, bj, kPanel * k,
                                         c + (m0 + row_tiles.start(t)) * ldc + j, ldc, kc,
                                         tiles[t].written, cols);
        }
      }
      for (auto& tile : tiles) tile.written |= !tile.skip;
    }
  }
  for (int64_t t = 0; t < ntiles; ++t) {  // tiles off the image for every kernel row: zeros
    if (tiles[t].written) continue;
    for (int64_t j = n0; j < n1; j += tile_cols) {
      int cols = static_cast<int>(std::min(tile_cols, n1 - j));
      isa.table[(cols + isa.width - 1) / isa.width - 1][row_tiles.height(t) - 1](
          nullptr, 0, bp, kPanel * k, c + (m0 + row_tiles.start(t)) * ldc + j, ldc, 0, false,
          cols);
    }
  }
}
#endif

}  // namespace

bool available() {
#ifdef CANDLE_NN_GEMM_X86
  return g_isa.load() != nullptr;
#else
  return false;
#endif
}

const char* isa() {
#ifdef CANDLE_NN_GEMM_X86
  const Isa* i = g_isa.load();
  return i ? i->name : "none";
#else
  return "none";
#endif
}

bool set_isa(const char* name) {
#ifdef CANDLE_NN_GEMM_X86
  std::string n = name;
  if (n == "best") return g_isa.store(best_isa()), true;
  if (n == "avx512" && cpu_has_avx512()) return g_isa.store(&kAvx512), true;
  if (n == "avx2" && cpu_has_avx2()) return g_isa.store(&kAvx2), true;
#else
  (void)name;
#endif
  return false;
}

int64_t packed_size(int64_t n, int64_t k) { return (n + kPanel - 1) / kPanel * kPanel * k; }

void pack_b(const float* w, int64_t ldw, int64_t n, int64_t k, float* out, int64_t ldk) {
  int64_t panels = (n + kPanel - 1) / kPanel;
  parallel_for(panels, 1, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      float* dst = out + p * kPanel * k;
      if (ldw == 1 && (p + 1) * kPanel <= n) {  // a full panel's columns are adjacent
        for (int64_t kk = 0; kk < k; ++kk)
          std::memcpy(dst + kk * kPanel, w + p * kPanel + kk * ldk, kPanel * sizeof(float));
        continue;
      }
      for (int64_t kk = 0; kk < k; ++kk)
        for (int64_t j = 0; j < kPanel; ++j) {
          int64_t col = p * kPanel + j;
          dst[kk * kPanel + j] = col < n ? w[col * ldw + kk * ldk] : 0.0f;
        }
    }
  });
}

void gemm(const ASource& a, const float* b_packed, float* c, int64_t ldc, int64_t m, int64_t n,
          int64_t k, const Epilogue& epilogue) {
#ifdef CANDLE_NN_GEMM_X86
  const Isa* isa = g_isa.load();
  if (isa == nullptr) throw std::runtime_error("candle_nn::gemm: no AVX-512F or AVX2 + FMA");
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    if (epilogue.fn) epilogue.fn(epilogue.ctx, c, ldc, 0, m, 0, n);
    return;
  }
  auto& pool = ThreadPool::instance();
  // Below ~2 MFLOP (~10 us on one core) waking another thread costs about as much as it saves.
  const int64_t threads = 2 * m * n * k < (int64_t{1} << 21) ? 1 : pool.threads();
  const int64_t mr = isa->mr;
  // Rows per task: about kMc (up to 1.5 kMc) in blocks of near-equal heights, fewer when that
  // leaves threads idle (rounded to the register tile). Each row block streams all of B: a last
  // block of a few rows (98 = 96 + 2, 196 = 2 x 96 + 4) would read B again, from memory or L3,
  // for almost no work.
  int64_t mb = std::max<int64_t>(1, (m + kMc / 2) / kMc);
  int64_t mc = ((m + mb - 1) / mb + mr - 1) / mr * mr;
  mb = (m + mc - 1) / mc;
  // Few row blocks (small M, e.g. a 7x7 feature map): split the columns too, in multiples of
  // 32, so every thread gets work; several tasks per thread absorb a thread slowed by others.
  const int64_t target = threads > 1 ? 4 * threads : 1;
  int64_t nb = 1;
  if (mb < target) nb = std::max<int64_t>(1, std::min((target + mb - 1) / mb, n / 64));
  int64_t nc = ((n + nb - 1) / nb + 2 * kPanel - 1) / (2 * kPanel) * (2 * kPanel);
  nb = (n + nc - 1) / nc;
  if (mb * nb < threads && m > mr) {  // still too few tasks: smaller row blocks
    int64_t per = (m + threads - 1) / threads;
    mc = std::max<int64_t>(mr, (per + mr - 1) / mr * mr);
    mb = (m + mc - 1) / mc;
  }
  // Split columns would each gather the same im2col rows: gather them once, in parallel.
  ASource src = a;
  thread_local std::vector<float> col;
  if (a.im2col && nb > 1) {
    if (col.size() < static_cast<size_t>(m * k)) col.resize(m * k);
    float* dst = col.data();
    parallel_for(m, std::max<int64_t>(1, (1 << 15) / k), 1, [&](int64_t r0, int64_t r1) {
      im2col_block(a, r0, r1 - r0, 0, k, dst + r0 * k);
    });
    src = ASource{};
    src.data = dst;
    src.lda = k;
  }
  // Convs read x in place where they can (block_conv), unless a kernel row is too short for
  // the register tile's loads and stores to pay off (e.g. a 3-channel stem).
  const bool direct_conv = src.im2col && static_cast<int64_t>(src.kw) * src.c >= 32;
  auto task = [&](int t) {
    thread_local std::vector<float> buf;
    int64_t ib = t / nb, jb = t % nb;
    int64_t m0 = ib * mc, rows = std::min(mc, m - m0);
    int64_t n0 = jb * nc, n1 = std::min(n, n0 + nc);
    if (direct_conv)
      block_conv(*isa, src, b_packed, c, ldc, m0, rows, n0, n1, k, buf);
    else
      block(*isa, src, b_packed, c, ldc, m0, rows, n0, n1, k, buf);
    if (epilogue.fn) epilogue.fn(epilogue.ctx, c, ldc, m0, m0 + rows, n0, n1);
  };
  if (threads == 1) {
    for (int t = 0; t < mb * nb; ++t) task(t);
  } else {
    pool.run(static_cast<int>(mb * nb), task);
  }
#else
  (void)a, (void)b_packed, (void)c, (void)ldc, (void)m, (void)n, (void)k, (void)epilogue;
  throw std::runtime_error("candle_nn::gemm: x86-64 only");
#endif
}

}  // namespace candle_nn::gemm
