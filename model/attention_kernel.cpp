// Scaled dot-product attention for a few queries at a time (a decoding step), fused for the CPU: scores, softmax
// and p.V in one pass over each query's keys, with no (B, h, T_q, T_k) tensors in between. torch's bmm multiplies
// one 1 x d_k query by d_k x T_k keys with a scalar loop (or one library call per head), which made a decoding
// step's attention cost more than its linear maps. model/kernel.py builds this file and says when it is used.
// It is compiled with -ffast-math (so that exp vectorises and sums may be reordered): nothing here makes an inf or
// NaN on purpose (a masked key's score is the lowest finite value, which stays finite when the row's maximum is
// subtracted).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kMaxWidth = 256;  // d_k, d_v up to this (model/kernel.py checks before calling)

// One (row, head, query) at a time. D and DV are the head widths when known at compile time (0: read at run time),
// so that the loops over a head's width have a fixed length and vectorise.
template <typename T, int D, int DV>
void attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed, at::Tensor& out) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2);
  const int64_t d = D ? D : q.size(3), dv = DV ? DV : v.size(3);
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  const T lowest = std::numeric_limits<T>::lowest();
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  const bool* ap = allowed.data_ptr<bool>();
  T* op = out.data_ptr<T>();  // (B, Tq, H, dv), contiguous
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, Tk * (d + dv)));
  at::parallel_for(0, B * H * Tq, grain, [&](int64_t begin, int64_t end) {
    std::vector<T> s(Tk);
    T qs[D ? D : kMaxWidth], o[DV ? DV : kMaxWidth];
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / (H * Tq), h = r / Tq % H, i = r % Tq;
      const T* qr = qp + b * q.stride(0) + h * q.stride(1) + i * q.stride(2);
      const T* kr = kp + b * k.stride(0) + h * k.stride(1);
      const T* vr = vp + b * v.stride(0) + h * v.stride(1);
      const bool* ar = ap + b * allowed.stride(0) + h * allowed.stride(1) + i * allowed.stride(2);
      const int64_t kt = k.stride(2), vt = v.stride(2), at = allowed.stride(3);
      for (int64_t j = 0; j < d; ++j) qs[j] = qr[j] * scale;
      T m = lowest;
      for (int64_t t = 0; t < Tk; ++t) {
        T acc = 0;
        for (int64_t j = 0; j < d; ++j) acc += qs[j] * kr[t * kt + j];
        s[t] = ar[t * at] ? acc : lowest;
        m = std::max(m, s[t]);
      }
      std::fill(o, o + dv, T(0));
      if (m > lowest) {  // some key is visible; a query with none gets a zero output, as on the explicit path
        T z = 0;
        for (int64_t t = 0; t < Tk; ++t) {
          s[t] = std::exp(s[t] - m);  // exactly 0 for a masked key: lowest - m rounds to lowest, whose exp underflows
          z += s[t];
        }
        const T inv = T(1) / z;
        for (int64_t t = 0; t < Tk; ++t) {
          const T p = s[t] * inv;
          for (int64_t j = 0; j < dv; ++j) o[j] += p * vr[t * vt + j];
        }
      }
      std::copy(o, o + dv, op + ((b * Tq + i) * H + h) * dv);
    }
  });
}

template <typename T>
void dispatch(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed, at::Tensor& out) {
  const int64_t d = q.size(3), dv = v.size(3);
  if (d == dv && d == 8) return attend<T, 8, 8>(q, k, v, allowed, out);
  if (d == dv && d == 16) return attend<T, 16, 16>(q, k, v, allowed, out);
  if (d == dv && d == 32) return attend<T, 32, 32>(q, k, v, allowed, out);
  if (d == dv && d == 64) return attend<T, 64, 64>(q, k, v, allowed, out);
  if (d == dv && d == 128) return attend<T, 128, 128>(q, k, v, allowed, out);
  attend<T, 0, 0>(q, k, v, allowed, out);
}

}  // namespace

// q (B, h, T_q, d_k), k (B, h, T_k, d_k), v (B, h, T_k, d_v), allowed bool broadcast to (B, h, T_q, T_k); each with
// unit stride in its last dimension. Returns (B, T_q, h, d_v), the layout W^O reads.
at::Tensor few_query_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && allowed.dim() == 4, "q, k, v, allowed must be 4-d");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "q, k, v need unit stride in the last dimension");
  TORCH_CHECK(q.size(3) <= kMaxWidth && v.size(3) <= kMaxWidth, "head width above ", kMaxWidth);
  TORCH_CHECK(allowed.scalar_type() == at::kBool, "allowed must be bool");
  auto out = at::empty({q.size(0), q.size(2), q.size(1), v.size(3)}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "few_query_attention", [&] { dispatch<scalar_t>(q, k, v, allowed, out); });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("few_query_attention", &few_query_attention); }
