// float32 exp and erf from multiply-adds and selects only, so the loops that call them
// vectorise (MLX 0.32's CPU exp/erf are scalar libm calls). Same polynomials as the pure-MLX
// fallbacks in candle_nn/cpu_fast.py (exp: Cephes' expf, 2.2 ulp) and candle_nn/cpu_fast_gelu.py
// (erf: within 1e-6 relative of the exact value).
#pragma once

#include <cstdint>
#include <cstring>

// Always inlined: an out-of-line call in a loop keeps GCC from vectorising it, and in the large
// kernel files (kernels.cpp's epilogue instantiations) GCC's inliner stops inlining plain
// `inline` functions once its unit-growth budget is spent, which leaves the GELU/SiLU epilogue
// of every packed-GEMM and depthwise tile scalar (~4x slower).
#define CANDLE_NN_MATH_INLINE inline __attribute__((always_inline))

namespace candle_nn {

CANDLE_NN_MATH_INLINE float bits_to_float(int32_t i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}

// exp(x) for float32, Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, degree-6 polynomial in r;
// 0 below -87.3 (where float32's exp is denormal or 0), exp(88.3) above 88.3.
CANDLE_NN_MATH_INLINE float exp_f32(float x_in) {
  float x = x_in;
  x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  // round(x / ln 2) without a libm call: adding 1.5 * 2^23 rounds to an integer.
  float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float two_n = bits_to_float((static_cast<int32_t>(n) + 127) << 23);
  float e = (p * (r * r) + r + 1.0f) * two_n;
  return x_in < -87.3f ? 0.0f : e;  // exp(-inf) = 0 (softmax's masked entries)
}

// erf(z) / z as a polynomial in z^2 on [0, 1] (cpu_fast_gelu._SMALL). T: float, or a GCC
// vector of floats (the same multiply-adds lane by lane).
template <class T>
CANDLE_NN_MATH_INLINE T erf_small_ratio(T z2) {
  T p = z2 * 7.9334939046e-05f - 8.0348466547e-04f;
  p = p * z2 + 5.1912183778e-03f;
  p = p * z2 - 2.6855399452e-02f;
  p = p * z2 + 1.1283625725e-01f;
  p = p * z2 - 3.7612629878e-01f;
  p = p * z2 + 1.1283791666e+00f;
  return p;
}

// erfc(a) for a in [1, 4] as a polynomial in t = (2a - 5) / 3 (cpu_fast_gelu._LARGE); 0 for
// a >= 4 (erfc(4) < 1.6e-8); any value for a < 1. T as for erf_small_ratio.
template <class T>
CANDLE_NN_MATH_INLINE T erfc_large(T a) {
  T t = (a < 4.0f ? a : 4.0f) * (2.0f / 3.0f) - 5.0f / 3.0f;
  T q = t * 1.1300180487e-03f - 1.8515676006e-03f;
  q = q * t - 3.4260997486e-03f;
  q = q * t + 1.0797660576e-02f;
  q = q * t - 7.4836259593e-03f;
  q = q * t - 9.8107911832e-03f;
  q = q * t + 3.2164325984e-02f;
  q = q * t - 4.6322068328e-02f;
  q = q * t + 4.3602195988e-02f;
  q = q * t - 2.8195845523e-02f;
  q = q * t + 1.2255908110e-02f;
  q = q * t - 3.2669689595e-03f;
  q = q * t + 4.0692064689e-04f;
  return a < 4.0f ? q : 0.0f;
}

CANDLE_NN_MATH_INLINE float erf_f32(float z) {
  float a = z < 0.0f ? -z : z;
  float e = a < 1.0f ? a * erf_small_ratio(a * a) : 1.0f - erfc_large(a);
  return z < 0.0f ? -e : e;
}

// Exact GELU x * Phi(x) = x / 2 * (1 + erf(x / sqrt 2)); for x / sqrt 2 <= -1 the factor is
// erfc(|z|) itself (no cancellation in 1 + erf).
CANDLE_NN_MATH_INLINE float gelu_f32(float x) {
  float z = x * 0.70710678118654752f;
  float a = z < 0.0f ? -z : z;
  float small = 1.0f + z * erf_small_ratio(z * z);
  float q = erfc_large(a);
  float large = z < 0.0f ? q : 2.0f - q;
  return 0.5f * x * (a < 1.0f ? small : large);
}

// Below -88 exp(-x) is clamped (finite), so x / (1 + exp(-x)) would give -Inf for -Inf: there
// x * 0 instead, -0 for finite x (silu underflows) and NaN for -Inf, as x * sigmoid(x) gives.
CANDLE_NN_MATH_INLINE float silu_f32(float x) { return x < -88.0f ? x * 0.0f : x / (1.0f + exp_f32(-x)); }

// 1 / (1 + exp(-x)); 0 below -88 (where it is denormal, and exp(-x) would be clamped), NaN for NaN.
CANDLE_NN_MATH_INLINE float sigmoid_f32(float x) { return x < -88.0f ? 0.0f : 1.0f / (1.0f + exp_f32(-x)); }

}  // namespace candle_nn
