// What every kernel file shares: the multiversioning macros and the start of an eval_cpu.
#pragma once

#include <cstdint>
#include <vector>

#include <sys/mman.h>

#include "kernels.h"
#include "mlx/backend/cpu/encoder.h"

// x86-64: each hot loop is compiled twice (AVX2+FMA and the baseline), the loader picks the one
// the CPU runs (GCC/Clang function multiversioning), so one build works on every x86-64 CPU. No
// AVX-512 clone: on an AVX-512 AMD CPU it sped a stand-alone GELU pass up ~10 % but made the
// depthwise kernel's per-chunk in-place GELU epilogue ~4.5x slower (256x256x256, 2 threads).
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#define CANDLE_NN_MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CANDLE_NN_MULTIVERSION
#endif
#define CANDLE_NN_INLINE inline __attribute__((always_inline))

namespace candle_nn {

// f.template operator()<A>() for the run-time `act` (with_residual: <M>() for `mode`): one
// instantiation per value, inlined into the caller and so into each CANDLE_NN_MULTIVERSION
// clone. Pass a lambda [&]<Act A>() CANDLE_NN_LAMBDA_INLINE { ... }.
#define CANDLE_NN_LAMBDA_INLINE __attribute__((always_inline))

template <class F>
CANDLE_NN_INLINE void with_act(Act act, F&& f) {
  switch (act) {
    case Act::Identity:
      return f.template operator()<Act::Identity>();
    case Act::Relu:
      return f.template operator()<Act::Relu>();
    case Act::Silu:
      return f.template operator()<Act::Silu>();
    case Act::Gelu:
      return f.template operator()<Act::Gelu>();
    case Act::Sigmoid:
      return f.template operator()<Act::Sigmoid>();
  }
}

template <class F>
CANDLE_NN_INLINE void with_residual(Residual mode, F&& f) {
  switch (mode) {
    case Residual::None:
      return f.template operator()<Residual::None>();
    case Residual::BeforeAct:
      return f.template operator()<Residual::BeforeAct>();
    case Residual::AfterAct:
      return f.template operator()<Residual::AfterAct>();
  }
}

// Asks for transparent huge pages under a fresh output buffer before its first write: MLX's CPU
// allocator maps every large buffer anew, and faulting a (64, 4096, 256) float32 output in page
// by page (65536 faults) costs more than the arithmetic of the kernels that write it.
inline void advise_huge_pages(void* data, size_t bytes) {
#ifdef MADV_HUGEPAGE
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data, (void)bytes;
#endif
}

// out allocated and every input and the output registered with the stream's CPU encoder, whose
// dispatch() then runs the kernel.
inline mx::cpu::CommandEncoder& begin_eval(mx::Stream stream, const std::vector<mx::array>& inputs,
                                           mx::array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream);
  for (const auto& a : inputs) encoder.set_input_array(a);
  encoder.set_output_array(out);
  return encoder;
}

// The fused epilogue's optional inputs, laid out as the ops build them: [x, w, bias?, residual?].
struct EpilogueInputs {
  const float* bias;
  const float* res;
};

inline EpilogueInputs epilogue_inputs(const std::vector<mx::array>& inputs, bool has_bias,
                                      Residual mode) {
  return {has_bias ? inputs[2].data<float>() : nullptr,
          mode != Residual::None ? inputs[has_bias ? 3 : 2].data<float>() : nullptr};
}

// begin_eval of a conv op with the fused epilogue, and its optional inputs' data.
struct EpilogueEval {
  mx::cpu::CommandEncoder& encoder;
  const float* bias;
  const float* res;
};

inline EpilogueEval begin_epilogue_eval(mx::Stream stream, const std::vector<mx::array>& inputs,
                                        mx::array& out, bool has_bias, Residual mode) {
  const auto [bias, res] = epilogue_inputs(inputs, has_bias, mode);
  return {begin_eval(stream, inputs, out), bias, res};
}

}  // namespace candle_nn
