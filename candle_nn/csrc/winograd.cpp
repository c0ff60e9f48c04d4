// Winograd F(4x4, 3x3) convolution for 3x3 stride-1 convs (Lavin & Gray 2016, "Fast Algorithms
// for Convolutional Neural Networks"), points 0, +-1, +-2, infinity:
//   Y = A^T [ (G g G^T) . (B^T d B) ] A   for each 6x6 input tile d -> 4x4 output tile Y.
// NHWC: every transform runs over 8 channels at a time. The tiles are split into blocks of B
// (V and M of a block stay in L2), each block one task of the thread pool (or, on small maps with
// fewer blocks than threads, one task per block and range of output channels, so the threads
// share U instead of each reading all of it):
//   V[36][B][Cp] = input transform,
//   M[36][B][Op] = V[p] . U[p] for p < 36 (a 6x16 AVX2 or 6x32 AVX-512 register-tile GEMM: 36
//                  small products a block; one sgemm call of a multithreaded BLAS each would
//                  hand its threads over 36 times a conv, which stalls badly when other
//                  processes share the cores),
//   out          = output transform of M, fused with the bias/act/residual epilogue.
// U[36][Cp][Op] = G g G^T is computed once per weight (winograd_weights, in float64), each
// position's matrix stored in column panels (u_cols): a GEMM's column strip is one contiguous
// run, streamed from memory in order, not a line of every row.
// Cp, Op: channels rounded up to 8 (zero rows/columns in U), so every transform is whole vectors.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "cpu_eval.h"
#include "kernels.h"
#include "math_f32.h"
#include "mlx/backend/cpu/encoder.h"
#include "thread_pool.h"


namespace candle_nn {

namespace {

constexpr int kOut = 4;           // output tile side
constexpr int kIn = 6;            // input tile side
constexpr int kPos = kIn * kIn;   // 36 transformed positions, one GEMM each
constexpr int kLanes = 8;         // channels per vector
constexpr int64_t kSplitU = 1 << 20;  // floats of U (4 MiB) from which small maps split it

typedef float v8 __attribute__((vector_size(32)));

CANDLE_NN_INLINE v8 load8(const float* p) {
  v8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
CANDLE_NN_INLINE void store8(float* p, v8 v) { std::memcpy(p, &v, sizeof v); }

int64_t round8(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// Each position's U (Cp x Op) is stored in panels of kUPanel output channels (the last one
// narrower where Op is not a multiple of it): panel q, channels [q0, q0 + width) with q0 =
// q * kUPanel, holds its Cp rows of `width` floats one after the other. Row-major, a 16- or
// 32-column strip of a GEMM would read 64 or 128 bytes of every 1 KiB row (Op = 256): strided
// reads the prefetchers serve badly, and U (4x the conv's weight) comes from memory in a forward.
// Task shares of output channels (Geometry::chunk) start at multiples of kUPanel, so no register
// tile of the GEMMs straddles two panels.
constexpr int64_t kUPanel = 32;

// Offset of U[ic][oc] in one position's (Cp x Op) panels.
int64_t u_offset(int64_t ic, int64_t oc, int64_t cp, int64_t op) {
  const int64_t q0 = oc / kUPanel * kUPanel;
  return q0 * cp + ic * std::min(kUPanel, op - q0) + (oc - q0);
}

// Where columns [j, j + 8 * k) of one position's U start (row 0) and its row stride.
struct UCols {
  const float* b;
  int64_t ldb;
};
CANDLE_NN_INLINE UCols u_cols(const float* u, int64_t j, int64_t cp, int64_t op) {
  const int64_t q0 = j / kUPanel * kUPanel;
  return {u + u_offset(0, j, cp, op), std::min(kUPanel, op - q0)};
}

// B^T applied to 6 values (one row or column of a tile).
CANDLE_NN_INLINE void bt6(v8 d0, v8 d1, v8 d2, v8 d3, v8 d4, v8 d5, v8* r) {
  r[0] = 4.0f * d0 - 5.0f * d2 + d4;
  r[1] = (d3 + d4) - 4.0f * (d1 + d2);
  r[2] = (d4 - d3) + 4.0f * (d1 - d2);
  r[3] = (d4 - d2) + 2.0f * (d3 - d1);
  r[4] = (d4 - d2) - 2.0f * (d3 - d1);
  r[5] = 4.0f * d1 - 5.0f * d3 + d5;
}

// A^T applied to 6 values.
CANDLE_NN_INLINE void at6(v8 m0, v8 m1, v8 m2, v8 m3, v8 m4, v8 m5, v8* o) {
  v8 s12 = m1 + m2, d12 = m1 - m2, s34 = m3 + m4, d34 = m3 - m4;
  o[0] = m0 + s12 + s34;
  o[1] = d12 + 2.0f * d34;
  o[2] = s12 + 4.0f * s34;
  o[3] = d12 + 8.0f * d34 + m5;
}

// The 36 transformed values of 8 channels of one tile whose pixel (i, j) is at
// src + i * row_stride + j * col_stride, stored at v + p * pos_stride.
CANDLE_NN_INLINE void input_tile(const float* src, int64_t row_stride, int64_t col_stride,
                                 float* v, int64_t pos_stride) {
  v8 t[kIn][kIn];
  for (int j = 0; j < kIn; ++j) {
    const float* c = src + j * col_stride;
    v8 r[kIn];
    bt6(load8(c), load8(c + row_stride), load8(c + 2 * row_stride), load8(c + 3 * row_stride),
        load8(c + 4 * row_stride), load8(c + 5 * row_stride), r);
    for (int i = 0; i < kIn; ++i) t[i][j] = r[i];
  }
  for (int i = 0; i < kIn; ++i) {
    v8 r[kIn];
    bt6(t[i][0], t[i][1], t[i][2], t[i][3], t[i][4], t[i][5], r);
    for (int j = 0; j < kIn; ++j) store8(v + (i * kIn + j) * pos_stride, r[j]);
  }
}

struct Geometry {
  int64_t n, h, w, c, cp, o, op, oh, ow, ph, pw, th, tw, tiles;
  int64_t block;               // tiles per task
  int64_t chunk;               // output channels (of Op) per task: a multiple of 32, or Op
  int64_t v_stride, m_stride;  // floats between the 36 matrices of a block's V and M
};

// A stride for 36 matrices of `size` floats whose starts do not share their 4 KiB offset: the
// transforms touch all 36 at once, and 36 streams at equal offsets would fight over one L1 set.
int64_t position_stride(int64_t size) {
  int64_t stride = (size + 15) / 16 * 16;  // whole cache lines
  return stride % 1024 == 0 ? stride + 16 : stride;
}

// Input transform of tiles [t0, t1): V[p][t - t0][cp]. Tiles that overlap the padding (or channels
// that are not a multiple of 8) go through a zero-padded 6x6xCp copy.
CANDLE_NN_MULTIVERSION
void input_transform(const float* x, float* v, int64_t t0, int64_t t1, const Geometry& g) {
  thread_local std::vector<float> patch;
  if (patch.size() < static_cast<size_t>(kPos * g.cp)) patch.resize(kPos * g.cp);
  const int64_t pos_stride = g.v_stride;
  for (int64_t t = t0; t < t1; ++t) {
    int64_t n = t / (g.th * g.tw), ty = (t / g.tw) % g.th, tx = t % g.tw;
    int64_t iy0 = ty * kOut - g.ph, ix0 = tx * kOut - g.pw;
    const float* img = x + n * g.h * g.w * g.c;
    float* vt = v + (t - t0) * g.cp;
    bool interior = g.c == g.cp && iy0 >= 0 && ix0 >= 0 && iy0 + kIn <= g.h && ix0 + kIn <= g.w;
    if (interior) {
      const float* src = img + (iy0 * g.w + ix0) * g.c;
      for (int64_t cb = 0; cb < g.cp; cb += kLanes)
        input_tile(src + cb, g.w * g.c, g.c, vt + cb, pos_stride);
      continue;
    }
    float* pt = patch.data();
    std::memset(pt, 0, sizeof(float) * kPos * g.cp);
    for (int i = 0; i < kIn; ++i) {
      int64_t iy = iy0 + i;
      if (iy < 0 || iy >= g.h) continue;
      for (int j = 0; j < kIn; ++j) {
        int64_t ix = ix0 + j;
        if (ix < 0 || ix >= g.w) continue;
        std::memcpy(pt + (i * kIn + j) * g.cp, img + (iy * g.w + ix) * g.c, sizeof(float) * g.c);
      }
    }
    for (int64_t cb = 0; cb < g.cp; cb += kLanes)
      input_tile(pt + cb, kIn * g.cp, g.cp, vt + cb, pos_stride);
  }
}

typedef float v16 __attribute__((vector_size(64)));

// c[R x LW] = a[R x k] . b[k x LW] (row strides lda, ldb, ldc; L = Vec's lanes): R x W
// accumulators in registers.
template <typename Vec, int R, int W>
CANDLE_NN_INLINE void gemm_tile(const float* a, int64_t lda, const float* b, int64_t ldb,
                                float* c, int64_t ldc, int64_t k) {
  constexpr int L = sizeof(Vec) / sizeof(float);
  Vec acc[R][W];
  for (int r = 0; r < R; ++r)
    for (int w = 0; w < W; ++w) acc[r][w] = Vec{};
  for (int64_t kk = 0; kk < k; ++kk) {
    Vec bv[W];
    for (int w = 0; w < W; ++w) std::memcpy(&bv[w], b + kk * ldb + w * L, sizeof(Vec));
    for (int r = 0; r < R; ++r) {
      float av = a[r * lda + kk];
      for (int w = 0; w < W; ++w) acc[r][w] += av * bv[w];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int w = 0; w < W; ++w) std::memcpy(c + r * ldc + w * L, &acc[r][w], sizeof(Vec));
}

template <typename Vec, int W>
CANDLE_NN_INLINE void gemm_rows(const float* a, int64_t lda, const float* b, int64_t ldb,
                                float* c, int64_t ldc, int64_t m, int64_t k) {
  constexpr int R = 6;
  int64_t i = 0;
  for (; i + R <= m; i += R)
    gemm_tile<Vec, R, W>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, k);
  switch (m - i) {
    case 5: return gemm_tile<Vec, 5, W>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, k);
    case 4: return gemm_tile<Vec, 4, W>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, k);
    case 3: return gemm_tile<Vec, 3, W>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, k);
    case 2: return gemm_tile<Vec, 2, W>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, k);
    case 1: return gemm_tile<Vec, 1, W>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, k);
    default: return;
  }
}

// M[p][:, o0:o1] = V[p] . U[p][:, o0:o1] for the 36 positions of a block of `nt` tiles:
// (nt x Cp) . (Cp x (o1 - o0)), 16 output channels (a 6 x 16 register tile of 8-lane vectors)
// at a time; o0, o1 multiples of 8.
CANDLE_NN_MULTIVERSION
void batched_gemm(const float* v, const float* u, float* m, int64_t nt, int64_t o0, int64_t o1,
                  const Geometry& g) {
  for (int p = 0; p < kPos; ++p) {
    const float* a = v + p * g.v_stride;
    const float* b = u + p * g.cp * g.op;
    float* c = m + p * g.m_stride;
    int64_t j = o0;
    for (; j + 2 * kLanes <= o1; j += 2 * kLanes) {
      const UCols bj = u_cols(b, j, g.cp, g.op);
      gemm_rows<v8, 2>(a, g.cp, bj.b, bj.ldb, c + j, g.op, nt, g.cp);
    }
    if (j < o1) {
      const UCols bj = u_cols(b, j, g.cp, g.op);
      gemm_rows<v8, 1>(a, g.cp, bj.b, bj.ldb, c + j, g.op, nt, g.cp);
    }
  }
}

// Whether the AVX-512 GEMM may run (set_winograd_avx512; Python sets it from its config).
std::atomic<bool> g_winograd_avx512{true};

#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
// The same with AVX-512 (16-lane vectors, a 6 x 32 register tile): twice the multiply-adds per
// instruction where the CPU has it (Zen 4/5, Xeons); backends/cpu/cpu_model.py picks per CPU.
__attribute__((target("arch=x86-64-v4"))) void batched_gemm_avx512(const float* v,
                                                                    const float* u, float* m,
                                                                    int64_t nt, int64_t o0,
                                                                    int64_t o1,
                                                                    const Geometry& g) {
  for (int p = 0; p < kPos; ++p) {
    const float* a = v + p * g.v_stride;
    const float* b = u + p * g.cp * g.op;
    float* c = m + p * g.m_stride;
    int64_t j = o0;
    for (; j + 32 <= o1; j += 32) {
      const UCols bj = u_cols(b, j, g.cp, g.op);
      gemm_rows<v16, 2>(a, g.cp, bj.b, bj.ldb, c + j, g.op, nt, g.cp);
    }
    if (j + 16 <= o1) {
      const UCols bj = u_cols(b, j, g.cp, g.op);
      gemm_rows<v16, 1>(a, g.cp, bj.b, bj.ldb, c + j, g.op, nt, g.cp);
      j += 16;
    }
    if (j < o1) {
      const UCols bj = u_cols(b, j, g.cp, g.op);
      gemm_rows<v8, 1>(a, g.cp, bj.b, bj.ldb, c + j, g.op, nt, g.cp);
    }
  }
}

bool use_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
  return has && g_winograd_avx512.load(std::memory_order_relaxed);
}
#endif

template <Act A>
CANDLE_NN_INLINE float activate(float v) {
  if constexpr (A == Act::Relu) return v < 0.0f ? 0.0f : v;  // NaN stays NaN
  if constexpr (A == Act::Silu) return silu_f32(v);
  if constexpr (A == Act::Gelu) return gelu_f32(v);
  if constexpr (A == Act::Sigmoid) return sigmoid_f32(v);
  return v;
}

// Output transform of tiles [t0, t1), output channels [o0, o1) (M[p][t - t0][op]) with the
// epilogue act(y + bias [+ residual]) (BeforeAct) or act(y + bias) + residual (AfterAct); bias
// has Op entries (zeros past O).
template <Act A, Residual R>
CANDLE_NN_INLINE void output_transform_t(const float* m, const float* bias, const float* res,
                                         float* out, int64_t t0, int64_t t1, int64_t o0,
                                         int64_t o1, const Geometry& g) {
  const int64_t pos_stride = g.m_stride;
  alignas(32) float y[kOut * kOut * kLanes];
  for (int64_t t = t0; t < t1; ++t) {
    int64_t n = t / (g.th * g.tw), ty = (t / g.tw) % g.th, tx = t % g.tw;
    int rows = static_cast<int>(std::min<int64_t>(kOut, g.oh - ty * kOut));
    int cols = static_cast<int>(std::min<int64_t>(kOut, g.ow - tx * kOut));
    const float* mt = m + (t - t0) * g.op;
    for (int64_t ob = o0; ob < o1; ob += kLanes) {
      v8 tmp[kOut][kIn];
      for (int j = 0; j < kIn; ++j) {
        const float* c = mt + ob + j * pos_stride;
        v8 r[kOut];
        at6(load8(c), load8(c + kIn * pos_stride), load8(c + 2 * kIn * pos_stride),
            load8(c + 3 * kIn * pos_stride), load8(c + 4 * kIn * pos_stride),
            load8(c + 5 * kIn * pos_stride), r);
        for (int i = 0; i < kOut; ++i) tmp[i][j] = r[i];
      }
      v8 b = load8(bias + ob);
      for (int i = 0; i < kOut; ++i) {
        v8 r[kOut];
        at6(tmp[i][0], tmp[i][1], tmp[i][2], tmp[i][3], tmp[i][4], tmp[i][5], r);
        for (int j = 0; j < kOut; ++j) store8(y + (i * kOut + j) * kLanes, r[j] + b);
      }
      int width = static_cast<int>(std::min<int64_t>(kLanes, g.o - ob));
      for (int i = 0; i < rows; ++i) {
        int64_t pix = (n * g.oh + ty * kOut + i) * g.ow + tx * kOut;
        for (int j = 0; j < cols; ++j) {
          float* yp = y + (i * kOut + j) * kLanes;
          float* dst = out + (pix + j) * g.o + ob;
          const float* rp = R == Residual::None ? nullptr : res + (pix + j) * g.o + ob;
          if (width == kLanes) {
            for (int l = 0; l < kLanes; ++l) {
              float v = yp[l];
              if constexpr (R == Residual::BeforeAct) v += rp[l];
              v = activate<A>(v);
              if constexpr (R == Residual::AfterAct) v += rp[l];
              dst[l] = v;
            }
          } else {
            for (int l = 0; l < width; ++l) {
              float v = yp[l];
              if constexpr (R == Residual::BeforeAct) v += rp[l];
              v = activate<A>(v);
              if constexpr (R == Residual::AfterAct) v += rp[l];
              dst[l] = v;
            }
          }
        }
      }
    }
  }
}

CANDLE_NN_MULTIVERSION
void output_transform(const float* m, const float* bias, const float* res, float* out,
                      int64_t t0, int64_t t1, int64_t o0, int64_t o1, const Geometry& g, Act act,
                      Residual mode) {
  with_act(act, [&]<Act A>() CANDLE_NN_LAMBDA_INLINE {
    with_residual(mode, [&]<Residual M>() CANDLE_NN_LAMBDA_INLINE {
      output_transform_t<A, M>(m, bias, res, out, t0, t1, o0, o1, g);
    });
  });
}

float activate_any(Act act, float v) {
  switch (act) {
    case Act::Relu:
      return activate<Act::Relu>(v);
    case Act::Silu:
      return activate<Act::Silu>(v);
    case Act::Gelu:
      return activate<Act::Gelu>(v);
    case Act::Sigmoid:
      return activate<Act::Sigmoid>(v);
    default:
      return v;
  }
}

// Non-finite values. The transforms mix all 36 inputs of a tile into each of its 16 outputs
// with coefficients that cancel only in exact arithmetic, so one NaN or Inf in a tile's input
// would turn all 16 outputs NaN (NaN * 0, Inf - Inf), where a direct conv keeps it to the
// outputs whose 3x3 window holds it; an Inf or NaN weight likewise. Those outputs are recomputed
// directly (rare: the check costs one pass over V).

// Whether tile t (its index in the block) has a NaN or +-Inf among its transformed values V,
// i.e. in its input (or overflows).
CANDLE_NN_MULTIVERSION
bool tile_nonfinite(const float* v, int64_t t, const Geometry& g) {
  v8 acc[4] = {};  // four independent chains of adds, not one at the add's latency
  for (int p = 0; p < kPos; ++p) {
    const float* vp = v + p * g.v_stride + t * g.cp;
    for (int64_t c = 0; c < g.cp; c += kLanes) acc[p % 4] += load8(vp + c) * 0.0f;
  }
  const v8 all = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  for (int l = 0; l < kLanes; ++l)
    if (all[l] != all[l]) return true;
  return false;
}

// Output channels in [o0, o1) (o0 a multiple of kUPanel) whose 3x3xC weights hold a NaN or
// +-Inf, found in each task from its share of U, which its GEMMs read next (a scan of all of w
// before the tasks start is 9 C O floats on one thread while the others wait): position 7 =
// (1, 1) of G g G^T is sum_ab g[a][b] / 36 (G's row 1 is -1/6 throughout), non-finite exactly
// when a tap of that (o, c) is (all 9 coefficients are non-zero; a finite sum is at most
// FLT_MAX / 4).
CANDLE_NN_MULTIVERSION
std::vector<int64_t> nonfinite_channels(const float* u, int64_t o0, int64_t o1,
                                        const Geometry& g) {
  std::vector<int64_t> bad;
  const float* u7 = u + 7 * g.cp * g.op;
  for (int64_t q0 = o0; q0 < std::min(o1, g.o); q0 += kUPanel) {
    const int64_t width = std::min(kUPanel, g.op - q0);  // a multiple of 8
    const float* panel = u7 + u_offset(0, q0, g.cp, g.op);
    v8 acc[kUPanel / kLanes] = {};
    for (int64_t ic = 0; ic < g.cp; ++ic)
      for (int64_t v = 0; v < width / kLanes; ++v)
        acc[v] += load8(panel + ic * width + v * kLanes) * 0.0f;
    for (int64_t j = 0; j < width && q0 + j < std::min(o1, g.o); ++j)
      if (acc[j / kLanes][j % kLanes] != acc[j / kLanes][j % kLanes]) bad.push_back(q0 + j);
  }
  return bad;
}

// Outputs of tile t (global index), channels `chans`, by the direct 3x3 conv and the epilogue;
// taps on the padding count as 0 * w, as in MLX's conv (a NaN weight makes its whole channel NaN).
void direct_tile(const float* x, const float* w, const float* bias, const float* res, float* out,
                 int64_t t, const std::vector<int64_t>& chans, const Geometry& g, Act act,
                 Residual mode) {
  int64_t n = t / (g.th * g.tw), ty = (t / g.tw) % g.th, tx = t % g.tw;
  const float* img = x + n * g.h * g.w * g.c;
  for (int64_t oy = ty * kOut; oy < std::min<int64_t>(g.oh, ty * kOut + kOut); ++oy)
    for (int64_t ox = tx * kOut; ox < std::min<int64_t>(g.ow, tx * kOut + kOut); ++ox) {
      int64_t pix = (n * g.oh + oy) * g.ow + ox;
      for (int64_t o : chans) {
        float acc = 0.0f;
        for (int ky = 0; ky < 3; ++ky)
          for (int kx = 0; kx < 3; ++kx) {
            int64_t iy = oy + ky - g.ph, ix = ox + kx - g.pw;
            const float* wp = w + ((o * 3 + ky) * 3 + kx) * g.c;
            if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) {
              for (int64_t c = 0; c < g.c; ++c) acc += 0.0f * wp[c];
            } else {
              const float* xp = img + (iy * g.w + ix) * g.c;
              for (int64_t c = 0; c < g.c; ++c) acc += xp[c] * wp[c];
            }
          }
        float v = acc + bias[o];
        if (mode == Residual::BeforeAct) v += res[pix * g.o + o];
        v = activate_any(act, v);
        if (mode == Residual::AfterAct) v += res[pix * g.o + o];
        out[pix * g.o + o] = v;
      }
    }
}

void check_f32(const mx::array& a, const char* what) {
  if (a.dtype() != mx::float32)
    throw std::invalid_argument(std::string("candle_nn.winograd_conv3x3: ") + what +
                                " must be float32");
}

}  // namespace

std::optional<mx::array> winograd_weights(const mx::array& w) {
  if (w.is_tracer()) return std::nullopt;  // a traced weight has no values to transform
  if (w.dtype() != mx::float32 || w.ndim() != 4 || w.shape(1) != 3 || w.shape(2) != 3)
    throw std::invalid_argument("candle_nn.winograd_weights: w must be float32 (O, 3, 3, C)");
  mx::array wc = mx::contiguous(w);
  wc.eval();
  const float* wp = wc.data<float>();
  const int64_t o = w.shape(0), c = w.shape(3), cp = round8(c), op = round8(o);
  static const double G[kIn][3] = {{1.0 / 4, 0, 0},
                                   {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                   {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                   {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                   {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                   {0, 0, 1}};
  std::vector<float> u(static_cast<size_t>(kPos * cp * op), 0.0f);
  for (int64_t oc = 0; oc < o; ++oc)
    for (int64_t ic = 0; ic < c; ++ic) {
      double g[3][3], gt[kIn][3];  // g = w[oc, :, :, ic]; gt = G g
      for (int a = 0; a < 3; ++a)
        for (int b = 0; b < 3; ++b) g[a][b] = wp[((oc * 3 + a) * 3 + b) * c + ic];
      for (int i = 0; i < kIn; ++i)
        for (int b = 0; b < 3; ++b)
          gt[i][b] = G[i][0] * g[0][b] + G[i][1] * g[1][b] + G[i][2] * g[2][b];
      for (int i = 0; i < kIn; ++i)
        for (int j = 0; j < kIn; ++j)
          u[(i * kIn + j) * cp * op + u_offset(ic, oc, cp, op)] = static_cast<float>(
              gt[i][0] * G[j][0] + gt[i][1] * G[j][1] + gt[i][2] * G[j][2]);
    }
  return mx::array(u.begin(), mx::Shape{kPos, static_cast<int>(cp), static_cast<int>(op)},
                   mx::float32);
}

mx::array winograd_conv3x3(const mx::array& x, const mx::array& w, const mx::array& u,
                           const std::optional<mx::array>& bias,
                           const std::optional<mx::array>& residual,
                           std::pair<int, int> padding, Act act, Residual mode,
                           mx::StreamOrDevice s) {
  check_f32(x, "x");
  check_f32(u, "u");
  if (x.ndim() != 4 || w.ndim() != 4 || w.shape(1) != 3 || w.shape(2) != 3 ||
      w.shape(3) != x.shape(3) || u.ndim() != 3 || u.shape(0) != kPos ||
      u.shape(1) != round8(x.shape(3)) || u.shape(2) != round8(w.shape(0)))
    throw std::invalid_argument(
        "candle_nn.winograd_conv3x3: x (N, H, W, C), w (O, 3, 3, C), u = winograd_weights(w)");
  const int out_channels = w.shape(0);
  if (padding.first < 0 || padding.second < 0)
    throw std::invalid_argument("candle_nn.winograd_conv3x3: negative padding");
  int oh = x.shape(1) + 2 * padding.first - 2, ow = x.shape(2) + 2 * padding.second - 2;
  if (oh <= 0 || ow <= 0) throw std::invalid_argument("candle_nn.winograd_conv3x3: empty output");
  mx::Shape out_shape{x.shape(0), oh, ow, out_channels};
  auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs{mx::contiguous(x, false, stream), mx::contiguous(u, false, stream)};
  push_epilogue_inputs(inputs, "winograd_conv3x3", bias, residual, mode, out_channels, "(O,)",
                       out_shape, stream);
  inputs.push_back(mx::contiguous(w, false, stream));  // last: for non-finite tiles (direct_tile)
  // Under mx.grad / vmap / compile the primitive has no vjp/jvp/vmap: conv2d_fused builds the
  // same math from MLX's own ops there.
  if (traced({&x, &w, &u, bias ? &*bias : nullptr, residual ? &*residual : nullptr}))
    return conv2d_fused(x, w, bias, residual, {1, 1}, padding, act, mode, stream);
  return primitive_output<WinogradConv3x3>(out_shape, std::move(inputs), stream,
                                           padding, act, mode, bias.has_value());
}

void WinogradConv3x3::eval_cpu(const std::vector<mx::array>& inputs,
                               std::vector<mx::array>& outputs) {
  const auto& x = inputs[0];
  const auto& u = inputs[1];
  auto& out = outputs[0];
  auto [encoder, bias, res] = begin_epilogue_eval(stream(), inputs, out, has_bias_, mode_);
  Geometry g;
  g.n = x.shape(0), g.h = x.shape(1), g.w = x.shape(2), g.c = x.shape(3), g.cp = u.shape(1);
  g.o = out.shape(3), g.op = u.shape(2), g.oh = out.shape(1), g.ow = out.shape(2);
  g.ph = padding_.first, g.pw = padding_.second;
  g.th = (g.oh + kOut - 1) / kOut, g.tw = (g.ow + kOut - 1) / kOut;
  g.tiles = g.n * g.th * g.tw;
  // Tiles per block: V and M in ~512 KiB (half an L2), or more where U (read once a block) is
  // larger than V and M together, a multiple of the GEMM's 6 rows; but at least one block per
  // thread. Where that leaves fewer blocks than threads (small maps, e.g. 14x14 at batch 1) and
  // U is large (36 Cp x Op floats: 9.4 MiB at 256 channels, 4x the conv's weights), smaller
  // blocks would each stream all of U from memory and run few-row GEMMs: split the output
  // channels instead, each task reading its share of U (the input transform is repeated per
  // share, which costs more than it saves where U stays in cache).
  int64_t threads = ThreadPool::instance().threads();
  int64_t block = std::max((1 << 17) / (kPos * (g.cp + g.op)), g.cp * g.op / (2 * (g.cp + g.op)));
  block = std::min<int64_t>((block + 5) / 6 * 6, 120);
  const int64_t full_blocks = (g.tiles + block - 1) / block;
  g.chunk = g.op;
  if (threads > 1 && full_blocks < threads && kPos * g.cp * g.op >= kSplitU) {
    g.block = (g.tiles + full_blocks - 1) / full_blocks;
    const int64_t chunks = std::min((threads + full_blocks - 1) / full_blocks, g.op / 32);
    const int64_t per = (g.op + chunks - 1) / chunks;
    g.chunk = std::min(g.op, (per + 31) / 32 * 32);
  } else {
    g.block = std::max<int64_t>(1, std::min(block, (g.tiles + threads - 1) / threads));
  }
  g.v_stride = position_stride(g.block * g.cp), g.m_stride = position_stride(g.block * g.op);
  encoder.dispatch([xp = x.data<float>(), up = u.data<float>(), wp = inputs.back().data<float>(),
                    bias, res, op = out.data<float>(), g, act = act_, mode = mode_]() {
    if (g.tiles == 0) return;
    std::vector<float> b(g.op, 0.0f);
    if (bias) std::copy(bias, bias + g.o, b.begin());
    const float* bp = b.data();
    int64_t blocks = (g.tiles + g.block - 1) / g.block;
    int64_t chunks = (g.op + g.chunk - 1) / g.chunk;
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
    const bool avx512 = use_avx512();
#endif
    parallel_for(blocks * chunks, 1, 1, [&](int64_t b0, int64_t b1) {
      // Scratch per thread, kept and reused (no page faults per call).
      thread_local std::vector<float> v, m;
      if (v.size() < static_cast<size_t>(kPos * g.v_stride)) v.resize(kPos * g.v_stride);
      if (m.size() < static_cast<size_t>(kPos * g.m_stride)) m.resize(kPos * g.m_stride);
      int64_t transformed = -1;  // the block whose input transform v holds
      int64_t checked = -1;      // the share whose channels `bad` lists
      std::vector<int64_t> bad;  // its channels with a non-finite weight
      for (int64_t task = b0; task < b1; ++task) {
        const int64_t blk = task / chunks, q = task % chunks;
        const int64_t t0 = blk * g.block, t1 = std::min(g.tiles, t0 + g.block);
        const int64_t o0 = q * g.chunk, o1 = std::min(g.op, o0 + g.chunk);
        if (transformed != blk) input_transform(xp, v.data(), t0, t1, g);
        transformed = blk;
        if (checked != q) bad = nonfinite_channels(up, o0, o1, g);
        checked = q;
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
        if (avx512)
          batched_gemm_avx512(v.data(), up, m.data(), t1 - t0, o0, o1, g);
        else
#endif
          batched_gemm(v.data(), up, m.data(), t1 - t0, o0, o1, g);
        output_transform(m.data(), bp, res, op, t0, t1, o0, o1, g, act, mode);
        for (int64_t t = t0; t < t1; ++t) {
          if (tile_nonfinite(v.data(), t - t0, g)) {
            std::vector<int64_t> all(std::max<int64_t>(0, std::min(o1, g.o) - o0));
            std::iota(all.begin(), all.end(), o0);
            direct_tile(xp, wp, bp, res, op, t, all, g, act, mode);
          } else if (!bad.empty()) {
            direct_tile(xp, wp, bp, res, op, t, bad, g, act, mode);
          }
        }
      }
    });
  });
}

void WinogradConv3x3::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("candle_nn.winograd_conv3x3: a CPU-only kernel (run on the CPU device)");
}

bool WinogradConv3x3::is_equivalent(const mx::Primitive& other) const {
  auto* p = dynamic_cast<const WinogradConv3x3*>(&other);
  return p && p->padding_ == padding_ && p->act_ == act_ && p->mode_ == mode_ &&
         p->has_bias_ == has_bias_;
}

void set_winograd_avx512(bool on) { g_winograd_avx512.store(on, std::memory_order_relaxed); }

}  // namespace candle_nn
