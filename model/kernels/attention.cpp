// Scaled dot-product attention for a few queries at a time (a decoding step), fused for the CPU: scores, softmax
// and p.V in one pass over each query's keys, with no (B, h, T_q, T_k) tensors in between. torch's bmm multiplies
// one 1 x d_k query by d_k x T_k keys with a scalar loop (or one library call per head), which made a decoding
// step's attention cost more than its linear maps. __init__.py builds this file and says when it is used.
// It is compiled with -ffast-math (so that exp vectorises and sums may be reordered), under which the compiler may
// assume that no value is NaN or infinite: nothing here makes one on purpose (a masked key's score is the lowest
// finite value, which stays finite when the row's maximum is subtracted), and a query whose scores are not all finite
// is found by the bits of its scores and gets a NaN output, as a broken model's would on the torch path.
#include <torch/python.h>  // pybind11 and the tensor casters; not torch/extension.h, the whole C++ API
#include <ATen/Parallel.h>

#include "kernels.h"
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kMaxWidth = 256;  // d_k, d_v up to this (__init__.py checks before calling)

// q.k_t for the Tk keys of one head, into s. D is the head's width when known at compile time (0: d, read at run
// time), so that the loop over it has a fixed length and vectorises.
template <typename T, int D>
inline void dot_keys(const T* qs, const T* kr, int64_t kt, int64_t d, int64_t Tk, T* s) {
  for (int64_t t = 0; t < Tk; ++t) {
    T acc = 0;
    for (int64_t j = 0; j < (D ? D : d); ++j) acc += qs[j] * kr[t * kt + j];
    s[t] = acc;
  }
}

// scale * sum_t p_t v_t for one head, into o (summed in a local array, which the compiler may keep in registers).
template <typename T, int DV>
inline void weigh_values(const T* p, T scale, const T* vr, int64_t vt, int64_t dv, int64_t Tk, T* o) {
  T acc[DV ? DV : kMaxWidth] = {};
  for (int64_t t = 0; t < Tk; ++t)
    for (int64_t j = 0; j < (DV ? DV : dv); ++j) acc[j] += p[t] * vr[t * vt + j];
  for (int64_t j = 0; j < (DV ? DV : dv); ++j) o[j] = acc[j] * scale;
}

#if defined(__AVX2__) && defined(__FMA__)
// Heads of width 8 in float32 (the CPU budget's models), where the loops above leave most of a vector unit idle: a key
// is one 256-bit register, and eight keys' products are summed at once by a tree of horizontal adds.
template <>
inline void dot_keys<float, 8>(const float* qs, const float* kr, int64_t kt, int64_t, int64_t Tk, float* s) {
  const __m256 q = _mm256_loadu_ps(qs);
  int64_t t = 0;
  for (; t + 8 <= Tk; t += 8) {
    const float* k = kr + t * kt;
    __m256 p[8];
    for (int u = 0; u < 8; ++u) p[u] = _mm256_mul_ps(q, _mm256_loadu_ps(k + u * kt));
    const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(p[0], p[1]), _mm256_hadd_ps(p[2], p[3]));  // keys 0-3, per 128-bit half
    const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(p[4], p[5]), _mm256_hadd_ps(p[6], p[7]));  // keys 4-7
    _mm256_storeu_ps(s + t, _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31)));
  }
  dot_keys<float, 0>(qs, kr + t * kt, kt, 8, Tk - t, s + t);
}

template <>
inline void weigh_values<float, 8>(const float* p, float scale, const float* vr, int64_t vt, int64_t, int64_t Tk, float* o) {
  __m256 even = _mm256_setzero_ps(), odd = _mm256_setzero_ps();  // two sums, so that each add need not wait for the last
  int64_t t = 0;
  for (; t + 2 <= Tk; t += 2) {
    even = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), _mm256_loadu_ps(vr + t * vt), even);
    odd = _mm256_fmadd_ps(_mm256_set1_ps(p[t + 1]), _mm256_loadu_ps(vr + (t + 1) * vt), odd);
  }
  if (t < Tk) even = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), _mm256_loadu_ps(vr + t * vt), even);
  _mm256_storeu_ps(o, _mm256_mul_ps(_mm256_add_ps(even, odd), _mm256_set1_ps(scale)));
}
#endif

// One (row, head, query) at a time: scores, softmax over the allowed keys, then the weighted values.
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
    T qs[D ? D : kMaxWidth];
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / (H * Tq), h = r / Tq % H, i = r % Tq;
      const T* qr = qp + b * q.stride(0) + h * q.stride(1) + i * q.stride(2);
      const bool* ar = ap + b * allowed.stride(0) + h * allowed.stride(1) + i * allowed.stride(2);
      const int64_t at = allowed.stride(3);
      T* o = op + ((b * Tq + i) * H + h) * dv;
      for (int64_t j = 0; j < d; ++j) qs[j] = qr[j] * scale;
      dot_keys<T, D>(qs, kp + b * k.stride(0) + h * k.stride(1), k.stride(2), d, Tk, s.data());
      bool broken = false, seen = false;
      T m = lowest;
      for (int64_t t = 0; t < Tk; ++t) {
        broken |= non_finite(s[t]);
        seen |= ar[t * at];
        s[t] = ar[t * at] ? s[t] : lowest;
        m = std::max(m, s[t]);
      }
      if (broken || !seen) {  // NaN for scores that are not all finite; no visible key: zero, as on the explicit path
        std::fill(o, o + dv, broken ? std::numeric_limits<T>::quiet_NaN() : T(0));
        continue;
      }
      T z = 0;
      for (int64_t t = 0; t < Tk; ++t) {
        s[t] = std::exp(s[t] - m);  // exactly 0 for a masked key: lowest - m rounds to lowest, whose exp underflows
        z += s[t];
      }
      weigh_values<T, DV>(s.data(), T(1) / z, vp + b * v.stride(0) + h * v.stride(1), v.stride(2), dv, Tk, o);
    }
  });
}

template <typename T>
void dispatch(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed, at::Tensor& out) {
  const int64_t d = q.size(3), dv = v.size(3);
  if (d == dv && d == 2) return attend<T, 2, 2>(q, k, v, allowed, out);
  if (d == dv && d == 4) return attend<T, 4, 4>(q, k, v, allowed, out);
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
  check_heads(q, k, v, kMaxWidth);
  check_allowed(allowed, q, k);
  auto out = at::empty({q.size(0), q.size(2), q.size(1), v.size(3)}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "few_query_attention", [&] { dispatch<scalar_t>(q, k, v, allowed, out); });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("few_query_attention", &few_query_attention, py::call_guard<py::gil_scoped_release>());
  m.def("narrow_attention", &narrow_attention, py::call_guard<py::gil_scoped_release>());
  m.def("narrow_attention_backward", &narrow_attention_backward, py::call_guard<py::gil_scoped_release>());
  m.def("reorder_rows", &reorder_rows, py::call_guard<py::gil_scoped_release>());
  m.def("smoothed_nll", &smoothed_nll, py::call_guard<py::gil_scoped_release>());
  m.def("smoothed_nll_backward", &smoothed_nll_backward, py::call_guard<py::gil_scoped_release>());
}
