// Concatenation along the last axis (YOLO's channel concatenations of NHWC maps), float32:
// MLX 0.32's CPU concatenate copies each input into a strided slice of the output with its
// general N-d copy on one thread (~6 GB/s). Here the output's rows (pixels) are spread over the
// thread pool and each input's run of a row is one memcpy. An input that is a slice of the last
// axis of a contiguous array (mx.split's pieces) is read in place, without the copy
// mx.contiguous would make; any other view is read element by element.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "cpu_eval.h"
#include "kernels.h"
#include "mlx/backend/cpu/encoder.h"
#include "thread_pool.h"

namespace candle_nn {

namespace {

// The stride between consecutive rows (all axes but the last, flattened) of `a` when its last
// axis is contiguous and the rows are evenly spaced (a contiguous array, or a slice of the last
// axis of one); -1 otherwise.
int64_t row_stride(const mx::array& a) {
  const int nd = a.ndim();
  const int64_t c = a.shape(nd - 1);
  if (a.flags().row_contiguous) return c;
  if (c > 1 && a.strides()[nd - 1] != 1) return -1;
  int64_t stride = -1, expected = -1;  // the row stride, and the next outer axis' stride
  for (int d = nd - 2; d >= 0; --d) {
    if (a.shape(d) == 1) continue;
    const int64_t s = a.strides()[d];
    if (stride < 0) {
      stride = s;
    } else if (s != expected) {
      return -1;
    }
    expected = s * a.shape(d);
  }
  return stride < 0 ? c : stride;
}

}  // namespace

mx::array concat_last(const std::vector<mx::array>& xs, mx::StreamOrDevice s) {
  if (xs.empty()) throw std::invalid_argument("candle_nn.concat_last: no arrays");
  const auto& first = xs[0];
  if (first.ndim() == 0) throw std::invalid_argument("candle_nn.concat_last: 0-d array");
  int total = 0;
  for (const auto& x : xs) {
    check_float32_cpu(x, "concat_last");
    if (x.ndim() != first.ndim() ||
        !std::equal(x.shape().begin(), x.shape().end() - 1, first.shape().begin()))
      throw std::invalid_argument(
          "candle_nn.concat_last: the arrays must agree on every axis but the last");
    total += x.shape(-1);
  }
  auto stream = mx::to_stream(s);
  mx::Shape shape = first.shape();
  shape.back() = total;
  return mx::array(shape, mx::float32, std::make_shared<ConcatLast>(stream), xs);
}

void ConcatLast::eval_cpu(const std::vector<mx::array>& inputs,
                          std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  auto& encoder = begin_eval(stream(), inputs, out);
  struct Piece {
    const float* data;
    int64_t stride, width;   // stride < 0: not evenly spaced rows, read by `shape` / `strides`
    std::vector<int64_t> shape, strides;
  };
  std::vector<Piece> pieces;
  for (const auto& x : inputs) {
    if (x.shape(-1) == 0) continue;
    pieces.push_back({x.data<float>(), row_stride(x), x.shape(-1),
                      std::vector<int64_t>(x.shape().begin(), x.shape().end()),
                      std::vector<int64_t>(x.strides().begin(), x.strides().end())});
  }
  const int64_t c = out.shape(-1);
  const int64_t rows = c ? static_cast<int64_t>(out.size()) / c : 0;
  encoder.dispatch([pieces = std::move(pieces), o = out.data<float>(), rows, c]() {
    if (rows == 0 || c == 0) return;
    const int64_t min_rows = std::max<int64_t>(1, (1 << 14) / c);  // ~64 KiB of output a chunk
    parallel_for(rows, min_rows, 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        float* dst = o + r * c;
        for (const auto& p : pieces) {
          if (p.stride >= 0) {
            std::memcpy(dst, p.data + r * p.stride, sizeof(float) * p.width);
          } else {  // any other view: its element offsets from the strides
            int64_t offset = 0, rest = r;
            for (int d = static_cast<int>(p.shape.size()) - 2; d >= 0; --d) {
              offset += rest % p.shape[d] * p.strides[d];
              rest /= p.shape[d];
            }
            const int64_t step = p.strides.back();
            for (int64_t j = 0; j < p.width; ++j) dst[j] = p.data[offset + j * step];
          }
          dst += p.width;
        }
      }
    });
  });
}

void ConcatLast::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("candle_nn.concat_last: a CPU-only kernel (run on the CPU device)");
}

}  // namespace candle_nn
