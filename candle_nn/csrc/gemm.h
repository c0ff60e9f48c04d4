// A float32 GEMM with pre-packed B (the weights) and AVX-512 / AVX2 micro-kernels, for convs and
// Linear layers on the CPU: C (M, N) = A (M, K) · Bᵀ, B given as (N, K) row-major (a conv's
// (O, kH, kW, C) weight, a Linear's (out, in) weight), packed once by pack_b. A is either a
// plain row-major matrix or the im2col of an NHWC image, gathered block by block into a small
// per-thread buffer (no whole im2col matrix). An optional epilogue runs on each finished C tile
// while it is still in cache. MLX-independent (plain pointers), so other kernels (e.g. a
// Winograd transform's batched GEMMs) can call it.
#pragma once

#include <cstdint>

namespace candle_nn::gemm {

// Columns of B per packed panel (one 16-float vector).
constexpr int64_t kPanel = 16;

// Whether this CPU runs a micro-kernel (AVX-512F, else AVX2 + FMA); callers use another GEMM
// where it does not.
bool available();

// The micro-kernel in use: "avx512", "avx2" or "none".
const char* isa();

// Use "avx512", "avx2" or the "best" this CPU has (for tests and A/B); false if it cannot.
bool set_isa(const char* name);

// Floats of the packed B for n columns and k rows: ceil(n / 16) * 16 * k.
int64_t packed_size(int64_t n, int64_t k);

// Packs w (n, k), row stride ldw, into panels of 16 columns: panel p holds k rows of 16 floats,
// out[p * 16 * k + kk * 16 + j] = w[p * 16 + j, kk]; columns past n are zero. ldk: the stride of
// kk (1 for a row-major w; ldw = 1, ldk = n for w given transposed, as a row-major (k, n)).
void pack_b(const float* w, int64_t ldw, int64_t n, int64_t k, float* out, int64_t ldk = 1);

// The rows of A: a matrix, or the im2col of an NHWC image (zero padding). For im2col, row m is
// output pixel m of (batch, oh, ow) and column kk = (i * kw + j) * c + channel.
struct ASource {
  const float* data = nullptr;
  int64_t lda = 0;  // matrix: row stride; im2col: unused
  bool im2col = false;
  int n = 0, h = 0, w = 0, c = 0, kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, oh = 0, ow = 0;
};

// Called on C rows [m0, m1), columns [n0, n1) once their sums are complete (row stride ldc).
struct Epilogue {
  void (*fn)(const void* ctx, float* c, int64_t ldc, int64_t m0, int64_t m1, int64_t n0,
             int64_t n1) = nullptr;
  const void* ctx = nullptr;
};

// C (m, n), row stride ldc, = A (m, k) · Bᵀ with B packed by pack_b(…, n, k, …), then the
// epilogue. Runs on ThreadPool::instance()'s threads (tasks: blocks of rows × column chunks).
// Requires available().
void gemm(const ASource& a, const float* b_packed, float* c, int64_t ldc, int64_t m, int64_t n,
          int64_t k, const Epilogue& epilogue = {});

}  // namespace candle_nn::gemm
