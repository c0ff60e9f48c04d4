// A single-threaded float32 GEMM on 6x16 register tiles with arbitrary A strides, for kernels
// that run many small products side by side, one per pool task (point_attention.cpp,
// mask_upscale.cpp): C = init + A · B. Everything here is always_inline, so it is compiled into
// the callers' CANDLE_NN_MULTIVERSION clones (AVX2 + FMA and the baseline).
#pragma once
#pragma GCC diagnostic ignored "-Wpsabi"  // vector values, only ever inlined

#include <algorithm>
#include <cstdint>

#include "cpu_eval.h"

namespace candle_nn::small_gemm {

typedef float V8 __attribute__((vector_size(32), aligned(4), may_alias));
constexpr int kLanes = 8;
constexpr int kRows = 6;  // register tile: 6 rows x 2 vectors = 12 of AVX2's 16 registers
// an 8-column panel (per-head products of 7 or 4 tokens, a last panel) in 12-row tiles: 12
// accumulators, enough independent multiply-adds to cover their latency (6 are not)
constexpr int kRowsNarrow = 12;

CANDLE_NN_INLINE V8 load8(const float* p) { return *reinterpret_cast<const V8*>(p); }
CANDLE_NN_INLINE void store8(float* p, V8 v) { *reinterpret_cast<V8*>(p) = v; }

// C (R x 8 NV, row stride ldc) = init + A (R x k; element (i, kk) at a[i * ars + kk * aks]) ·
// B (k x 8 NV, row stride ldb); init: the matrix at `src` (row stride lds; may be c), or zeros
// where src is null.
template <int R, int NV>
CANDLE_NN_INLINE void tile(const float* a, int64_t ars, int64_t aks, const float* b, int64_t ldb,
                           float* c, int64_t ldc, int64_t k, const float* src, int64_t lds) {
  V8 acc[R][NV];
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = src ? load8(src + i * lds + v * kLanes) : V8{};
#pragma GCC unroll 4
  for (int64_t kk = 0; kk < k; ++kk) {
    V8 bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = load8(b + kk * ldb + v * kLanes);
    for (int i = 0; i < R; ++i) {
      const float ai = a[i * ars + kk * aks];
      V8 av = {ai, ai, ai, ai, ai, ai, ai, ai};  // a broadcast load (V8{} + ai is an add)
      for (int v = 0; v < NV; ++v) acc[i][v] += av * bv[v];
    }
  }
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < NV; ++v) store8(c + i * ldc + v * kLanes, acc[i][v]);
}

template <int NV>
CANDLE_NN_INLINE void tile_rows(int rows, const float* a, int64_t ars, int64_t aks,
                                const float* b, int64_t ldb, float* c, int64_t ldc, int64_t k,
                                const float* src, int64_t lds) {
  switch (rows) {
    case 6: return tile<6, NV>(a, ars, aks, b, ldb, c, ldc, k, src, lds);
    case 5: return tile<5, NV>(a, ars, aks, b, ldb, c, ldc, k, src, lds);
    case 4: return tile<4, NV>(a, ars, aks, b, ldb, c, ldc, k, src, lds);
    case 3: return tile<3, NV>(a, ars, aks, b, ldb, c, ldc, k, src, lds);
    case 2: return tile<2, NV>(a, ars, aks, b, ldb, c, ldc, k, src, lds);
    default: return tile<1, NV>(a, ars, aks, b, ldb, c, ldc, k, src, lds);
  }
}

// C (m x cols) = init + A (m x k, strides ars / aks) · B (k x cols, row stride ldb), cols a
// multiple of 8, on the calling thread (init as in tile: src, or zeros): rows in blocks of
// `block` (their A stays in cache while every 16-column panel of B passes), each block in
// 6-row register tiles (12-row ones on an 8-column panel).
CANDLE_NN_INLINE void gemm_strided(const float* a, int64_t ars, int64_t aks, const float* b,
                                   int64_t ldb, float* c, int64_t ldc, int64_t m, int64_t cols,
                                   int64_t k, const float* src, int64_t lds, int64_t block = 48) {
  for (int64_t i0 = 0; i0 < m; i0 += block) {
    const int64_t i1 = std::min(m, i0 + block);
    for (int64_t j = 0; j < cols; j += 2 * kLanes) {
      const bool two = j + 2 * kLanes <= cols;
      for (int64_t i = i0; i < i1; i += kRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kRows, i1 - i));
        const float* ai = a + i * ars;
        const float* si = src ? src + i * lds + j : nullptr;
        float* ci = c + i * ldc + j;
        if (two) {
          tile_rows<2>(rows, ai, ars, aks, b + j, ldb, ci, ldc, k, si, lds);
        } else if (i + kRowsNarrow <= i1) {
          tile<kRowsNarrow, 1>(ai, ars, aks, b + j, ldb, ci, ldc, k, si, lds);
          i += kRowsNarrow - kRows;
        } else {
          tile_rows<1>(rows, ai, ars, aks, b + j, ldb, ci, ldc, k, si, lds);
        }
      }
    }
  }
}

// a[l] <- lane l of every a[i] (an 8 x 8 transpose: unpack, 64-bit shuffle, 128-bit halves).
CANDLE_NN_INLINE void transpose8(V8 (&a)[kLanes]) {
  V8 t[kLanes];
  for (int i = 0; i < kLanes; i += 2) {
    t[i] = __builtin_shufflevector(a[i], a[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[i + 1] = __builtin_shufflevector(a[i], a[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int i = 0; i < kLanes; i += 4)
    for (int j = 0; j < 2; ++j) {
      a[i + 2 * j] = __builtin_shufflevector(t[i + j], t[i + j + 2], 0, 1, 8, 9, 4, 5, 12, 13);
      a[i + 2 * j + 1] = __builtin_shufflevector(t[i + j], t[i + j + 2], 2, 3, 10, 11, 6, 7, 14,
                                                 15);
    }
  // a[0..3]: rows 0-3 of columns 0, 1, 2, 3 (lanes 0-3) and 4, 5, 6, 7 (lanes 4-7); a[4..7]
  // the same of rows 4-7
  for (int j = 0; j < 4; ++j) {
    t[j] = __builtin_shufflevector(a[j], a[j + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    t[j + 4] = __builtin_shufflevector(a[j], a[j + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
  for (int j = 0; j < kLanes; ++j) a[j] = t[j];
}

// (x - mean) / sqrt(var + eps) * weight + bias of a row of c floats (c a multiple of 8), in place.
CANDLE_NN_INLINE void layer_norm_row(float* row, int64_t c, const float* weight,
                                     const float* bias, float eps) {
  V8 acc{};
  for (int64_t ch = 0; ch < c; ch += kLanes) acc += load8(row + ch);
  float total = 0.0f;
  for (int l = 0; l < kLanes; ++l) total += acc[l];
  const float mean = total / static_cast<float>(c);
  V8 sq{};
  for (int64_t ch = 0; ch < c; ch += kLanes) {
    V8 v = load8(row + ch) - mean;
    sq += v * v;
  }
  float var = 0.0f;
  for (int l = 0; l < kLanes; ++l) var += sq[l];
  const float inv = 1.0f / std::sqrt(var / static_cast<float>(c) + eps);
  for (int64_t ch = 0; ch < c; ch += kLanes)
    store8(row + ch, (load8(row + ch) - mean) * inv * load8(weight + ch) + load8(bias + ch));
}

}  // namespace candle_nn::small_gemm
