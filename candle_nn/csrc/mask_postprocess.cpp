// SAM's mask post-processing for many masks (automatic mask generation): the resize chain of
// low-res logits to the image (R · mask · Cᵀ, R and C the chain's bilinear products: at most a
// few non-zeros per row) and the stability score (pixel counts above two thresholds). As dense
// matmuls the resize is ~150 M multiply-adds a mask at 800x556 where its bands need ~2 M; MLX's
// compare / cast / sum for the counts are three one-thread passes over every full-size mask.
#include <algorithm>
#include <stdexcept>
#include <vector>

#include "cpu_eval.h"
#include "kernels.h"
#include "mlx/backend/cpu/encoder.h"
#include "small_gemm.h"
#include "thread_pool.h"

namespace candle_nn {

namespace {

using small_gemm::kLanes;
using small_gemm::load8;
using small_gemm::store8;
using small_gemm::transpose8;
using small_gemm::V8;

// The non-zero band [lo, hi) of each row of a (rows, cols) matrix (an empty row: lo = hi = 0).
std::vector<int64_t> bands(const float* m, int64_t rows, int64_t cols) {
  std::vector<int64_t> out(2 * rows, 0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = m + r * cols;
    int64_t lo = 0, hi = cols;
    while (lo < cols && row[lo] == 0.0f) ++lo;
    while (hi > lo && row[hi - 1] == 0.0f) --hi;
    out[2 * r] = lo < hi ? lo : 0;
    out[2 * r + 1] = lo < hi ? hi : 0;
  }
  return out;
}

// Output rows [y0, y1) of mask q, columns first: for each input row i that their R bands reach,
// u_i[x] = C[x] · mask[i] over x's band (w -> ow; fewer input rows than output rows, so fewer of
// these scalar band products), then out[y] = Σ R[y, i] u_i over y's band, a multiply-add of
// whole rows. Bands are ranges of non-zeros, so a NaN / Inf logit reaches exactly the pixels
// both of whose bands cover it, as in the other order.
CANDLE_NN_MULTIVERSION
void resize_rows(const float* masks, const float* r, const float* c, const int64_t* rb,
                 const int64_t* cb, float* out, int64_t h, int64_t w, int64_t oh, int64_t ow,
                 int64_t q, int64_t y0, int64_t y1) {
  thread_local std::vector<float> u, mt, ut;
  int64_t lo = h, hi = 0;  // the input rows the bands of rows [y0, y1) reach
  for (int64_t y = y0; y < y1; ++y)
    if (rb[2 * y] < rb[2 * y + 1]) {
      lo = std::min(lo, rb[2 * y]);
      hi = std::max(hi, rb[2 * y + 1]);
    }
  u.resize(std::max<int64_t>(hi - lo, 0) * ow);
  const float* m = masks + q * h * w;
  int64_t i = lo;
  if (w % kLanes == 0 && ow % kLanes == 0) {
    // eight input rows at a time, as lanes: their columns transposed into mt (w x 8), the band
    // products on 8-lane vectors into ut (ow x 8), transposed back into u's rows
    mt.resize(w * kLanes);
    ut.resize(ow * kLanes);
    for (; i + kLanes <= hi; i += kLanes) {
      for (int64_t j0 = 0; j0 < w; j0 += kLanes) {
        V8 a[kLanes];
        for (int l = 0; l < kLanes; ++l) a[l] = load8(m + (i + l) * w + j0);
        transpose8(a);
        for (int l = 0; l < kLanes; ++l) store8(mt.data() + (j0 + l) * kLanes, a[l]);
      }
      for (int64_t x = 0; x < ow; ++x) {
        const float* cx = c + x * w;
        V8 s{};
        for (int64_t j = cb[2 * x]; j < cb[2 * x + 1]; ++j)
          s += cx[j] * load8(mt.data() + j * kLanes);
        store8(ut.data() + x * kLanes, s);
      }
      for (int64_t x0 = 0; x0 < ow; x0 += kLanes) {
        V8 a[kLanes];
        for (int l = 0; l < kLanes; ++l) a[l] = load8(ut.data() + (x0 + l) * kLanes);
        transpose8(a);
        for (int l = 0; l < kLanes; ++l) store8(u.data() + (i + l - lo) * ow + x0, a[l]);
      }
    }
  }
  for (; i < hi; ++i) {
    const float* row = m + i * w;
    float* ui = u.data() + (i - lo) * ow;
    for (int64_t x = 0; x < ow; ++x) {
      const float* cx = c + x * w;
      float s = 0.0f;
      for (int64_t j = cb[2 * x]; j < cb[2 * x + 1]; ++j) s += cx[j] * row[j];
      ui[x] = s;
    }
  }
  for (int64_t y = y0; y < y1; ++y) {
    float* o = out + (q * oh + y) * ow;
    std::fill(o, o + ow, 0.0f);
    for (int64_t i = rb[2 * y]; i < rb[2 * y + 1]; ++i) {
      const float a = r[y * h + i];
      const float* ui = u.data() + (i - lo) * ow;
      for (int64_t x = 0; x < ow; ++x) o[x] += a * ui[x];
    }
  }
}

CANDLE_NN_MULTIVERSION
void count_rows(const float* x, int64_t n, float lo, float hi, int64_t* above_lo,
                int64_t* above_hi) {
  int64_t a = 0, b = 0;
  for (int64_t i = 0; i < n; ++i) {
    a += x[i] > lo;
    b += x[i] > hi;
  }
  *above_lo += a;
  *above_hi += b;
}

void check(bool ok, const char* op, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("candle_nn.") + op + ": " + what);
}

}  // namespace

mx::array resize_masks(const mx::array& masks, const mx::array& rows, const mx::array& cols,
                       mx::StreamOrDevice s) {
  const char* op = "resize_masks";
  for (const auto* a : {&masks, &rows, &cols}) check_float32_cpu(*a, op);
  check(!traced({&masks, &rows, &cols}), op, "no tracer inputs (use the reference)");
  check(masks.ndim() == 3 && rows.ndim() == 2 && cols.ndim() == 2 &&
            rows.shape(1) == masks.shape(1) && cols.shape(1) == masks.shape(2),
        op, "masks (k, h, w), rows (H, h), cols (W, w)");
  auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs;
  for (const auto* a : {&masks, &rows, &cols}) inputs.push_back(mx::contiguous(*a, false, stream));
  mx::Shape shape{masks.shape(0), rows.shape(0), cols.shape(0)};
  return primitive_output<ResizeMasks>(shape, std::move(inputs), stream);
}

void ResizeMasks::eval_cpu(const std::vector<mx::array>& inputs,
                           std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  auto& encoder = begin_eval(stream(), inputs, out);
  const int64_t k = inputs[0].shape(0), h = inputs[0].shape(1), w = inputs[0].shape(2);
  const int64_t oh = inputs[1].shape(0), ow = inputs[2].shape(0);
  encoder.dispatch([k, h, w, oh, ow, m = inputs[0].data<float>(), r = inputs[1].data<float>(),
                    c = inputs[2].data<float>(), o = out.data<float>(), bytes = out.nbytes()]() {
    if (k == 0 || oh == 0 || ow == 0) return;
    advise_huge_pages(o, bytes);
    const auto rb = bands(r, oh, h), cb = bands(c, ow, w);
    constexpr int64_t kRowsPerTask = 64;
    const int64_t blocks = (oh + kRowsPerTask - 1) / kRowsPerTask;
    ThreadPool::instance().run(static_cast<int>(k * blocks), [&](int task) {
      const int64_t q = task / blocks, y0 = task % blocks * kRowsPerTask;
      resize_rows(m, r, c, rb.data(), cb.data(), o, h, w, oh, ow, q, y0,
                  std::min(oh, y0 + kRowsPerTask));
    });
  });
}

void ResizeMasks::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("candle_nn.resize_masks: a CPU-only kernel (run on the CPU device)");
}

mx::array stability_score(const mx::array& masks, float threshold, float offset,
                          mx::StreamOrDevice s) {
  const char* op = "stability_score";
  check_float32_cpu(masks, op);
  check(!traced({&masks}), op, "no tracer inputs (use the reference)");
  check(masks.ndim() >= 2, op, "masks must be (..., H, W)");
  auto stream = mx::to_stream(s);
  mx::Shape shape(masks.shape().begin(), masks.shape().end() - 2);
  return primitive_output<StabilityScore>(shape, {mx::contiguous(masks, false, stream)}, stream,
                                          threshold, offset);
}

void StabilityScore::eval_cpu(const std::vector<mx::array>& inputs,
                              std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  auto& encoder = begin_eval(stream(), inputs, out);
  const auto& x = inputs[0];
  const int64_t plane = static_cast<int64_t>(x.shape(-1)) * x.shape(-2);
  const int64_t k = plane ? static_cast<int64_t>(x.size()) / plane : 0;
  encoder.dispatch([k, plane, lo = threshold_ - offset_, hi = threshold_ + offset_,
                    xp = x.data<float>(), o = out.data<float>()]() {
    if (k == 0) return;
    constexpr int64_t kChunk = 1 << 16;
    const int64_t chunks = (plane + kChunk - 1) / kChunk;
    std::vector<int64_t> counts(2 * k * chunks, 0);
    ThreadPool::instance().run(static_cast<int>(k * chunks), [&](int task) {
      const int64_t q = task / chunks, i0 = task % chunks * kChunk;
      count_rows(xp + q * plane + i0, std::min(kChunk, plane - i0), lo, hi, &counts[2 * task],
                 &counts[2 * task + 1]);
    });
    for (int64_t q = 0; q < k; ++q) {
      int64_t union_ = 0, inter = 0;
      for (int64_t j = 0; j < chunks; ++j) {
        union_ += counts[2 * (q * chunks + j)];
        inter += counts[2 * (q * chunks + j) + 1];
      }
      o[q] = static_cast<float>(inter) / static_cast<float>(union_);
    }
  });
}

void StabilityScore::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("candle_nn.stability_score: a CPU-only kernel (run on the CPU device)");
}

bool StabilityScore::is_equivalent(const mx::Primitive& other) const {
  auto* p = dynamic_cast<const StabilityScore*>(&other);
  return p && p->threshold_ == threshold_ && p->offset_ == offset_;
}

}  // namespace candle_nn
