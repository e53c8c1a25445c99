// Attention for heads of width up to 8 (the CPU budget's models have d_k = d_v = 8), every query of a (row, head) at
// once, forward (keeping the probabilities) and backward (__init__.py: _NarrowHeadAttention). At these sizes torch's
// bmm and softmax spend most of their time on overhead. Here each head's rows of q, k, v and dO are copied into eight
// lanes (zero past the head's width) and the keys are padded with zeros to a multiple of 8, so that every product is a
// small matrix product done eight output rows at a time, each row one vector register, and the softmax runs along the
// keys eight at a time. Compiled with -ffast-math (__init__.py); see attention.cpp on what that assumes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels.h"

namespace {

constexpr int64_t kLanes = 8;

// Eight lanes of T as one value (GCC's vector extensions): an AVX register of floats, two of doubles.
template <typename T>
struct Eight;
template <>
struct Eight<float> {
  typedef float type __attribute__((vector_size(32)));
};
template <>
struct Eight<double> {
  typedef double type __attribute__((vector_size(64)));
};
template <typename T>
using Lanes = typename Eight<T>::type;

template <typename T>
inline Lanes<T> load(const T* p) {
  Lanes<T> x;
  std::memcpy(&x, p, sizeof x);
  return x;
}

template <typename T>
inline void store(T* p, Lanes<T> x) {
  std::memcpy(p, &x, sizeof x);
}

inline int64_t padded(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// out[r * os + 0..8) = scale * sum_k a[r * ar + k * ak] * x[k * xs + 0..8) for r < R: a small matrix product, eight
// output rows at a time with their sums in registers (independent sums, so that no multiply-add waits for another).
template <typename T>
void times_eight(const T* a, int64_t ar, int64_t ak, int64_t R, int64_t K, const T* x, int64_t xs, T scale, T* out,
                 int64_t os) {
  int64_t r = 0;
  for (; r + kLanes <= R; r += kLanes) {
    Lanes<T> acc[kLanes] = {};
    for (int64_t k = 0; k < K; ++k) {
      const Lanes<T> xk = load(x + k * xs);
      const T* column = a + r * ar + k * ak;
      for (int u = 0; u < kLanes; ++u) acc[u] += column[u * ar] * xk;
    }
    for (int u = 0; u < kLanes; ++u) store(out + (r + u) * os, acc[u] * scale);
  }
  for (; r < R; ++r) {  // the last rows, one at a time
    Lanes<T> acc = {};
    for (int64_t k = 0; k < K; ++k) acc += a[r * ar + k * ak] * load(x + k * xs);
    store(out + r * os, acc * scale);
  }
}

// Rows t < n of x (row stride `stride`, `width` values each) into out (rows, 8), or transposed into out (8, rows);
// zero past the width and past n.
template <typename T>
void into_lanes(const T* x, int64_t stride, int64_t n, int64_t width, int64_t rows, T* out, bool transposed) {
  std::fill(out, out + rows * kLanes, T(0));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < width; ++j) out[transposed ? j * rows + t : t * kLanes + j] = x[t * stride + j];
}

// The first `width` lanes of each row of lanes (rows, 8) into rows of y (row stride `stride`).
template <typename T>
void out_of_lanes(const T* lanes, int64_t rows, int64_t width, T* y, int64_t stride) {
  for (int64_t t = 0; t < rows; ++t) std::copy_n(lanes + t * kLanes, width, y + t * stride);
}

template <typename T>
void forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed, at::Tensor& out,
             at::Tensor& probs) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2), Tp = padded(Tk);
  const int64_t d = q.size(3), dv = v.size(3);
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d)));
  const T lowest = std::numeric_limits<T>::lowest();
  const T floor = sizeof(T) == 4 ? T(-80) : T(-700);  // exp(floor) is a normal number: probabilities below it are 0
  const T tiny = std::ldexp(T(1), -64);  // 2^-64: the largest finite score times this, summed over any T_k, is finite
  const T *qp = q.data_ptr<T>(), *kp = k.data_ptr<T>(), *vp = v.data_ptr<T>();
  T* op = out.data_ptr<T>();  // (B, Tq, H, dv), contiguous
  T* pp = probs.data_ptr<T>();  // (B, H, Tq, Tp), contiguous
  const auto qs = q.strides(), ks = k.strides(), vs = v.strides(), as = allowed.strides();  // read once, not in loops
  // The mask as 1 (allowed) or 0 per key, zero past Tk, one row per row of `allowed` before it was broadcast (a
  // padding mask has one per sentence), so that the softmax below reads it as numbers along the keys.
  const int64_t nb = as[0] ? B : 1, nh = as[1] ? H : 1, nq = as[2] ? Tq : 1;
  std::vector<T> keep(nb * nh * nq * Tp, T(0));
  const bool* ap = allowed.data_ptr<bool>();
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t i = 0; i < nq; ++i)
        for (int64_t t = 0; t < Tk; ++t)
          keep[((b * nh + h) * nq + i) * Tp + t] = ap[b * as[0] + h * as[1] + i * as[2] + t * as[3]] ? T(1) : T(0);
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, Tq * Tp * kLanes));
  at::parallel_for(0, B * H, grain, [&](int64_t begin, int64_t end) {
    std::vector<T> ql(Tq * kLanes), kt(kLanes * Tp), vl(Tp * kLanes), ol(Tq * kLanes);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / H, h = r % H;
      T* P = pp + r * Tq * Tp;
      into_lanes(qp + b * qs[0] + h * qs[1], qs[2], Tq, d, Tq, ql.data(), false);
      into_lanes(kp + b * ks[0] + h * ks[1], ks[2], Tk, d, Tp, kt.data(), true);
      into_lanes(vp + b * vs[0] + h * vs[1], vs[2], Tk, dv, Tp, vl.data(), false);
      for (int64_t c = 0; c < Tp; c += kLanes)  // the scores, eight keys at a time
        times_eight(ql.data(), kLanes, 1, Tq, d, kt.data() + c, Tp, scale, P + c, Tp);
      for (int64_t i = 0; i < Tq; ++i) {
        T* s = P + i * Tp;
        const T* a = keep.data() + (((as[0] ? b : 0) * nh + (as[1] ? h : 0)) * nq + (as[2] ? i : 0)) * Tp;
        // A score that is NaN or infinite makes the sum of the scores so (found by its bits: -ffast-math lets the
        // compiler drop std::isfinite); the scores are summed scaled down, so that finite ones cannot overflow it.
        // Masked keys and the padding get weight 0 after the exp, whose argument is kept between `floor` (the vector
        // exp takes a slow scalar path for results that underflow) and 0 (a masked key may score far above m, and
        // exp's inf times 0 would be NaN); an allowed key's is always in between.
        T total = 0, m = lowest, z = 0;
        for (int64_t t = 0; t < Tp; ++t) total += s[t] * tiny;
        for (int64_t t = 0; t < Tp; ++t) m = std::max(m, a[t] > 0 ? s[t] : lowest);
        if (non_finite(total) || m == lowest) {  // as on the explicit path: NaN, or zero with no visible key
          std::fill(s, s + Tp, non_finite(total) ? std::numeric_limits<T>::quiet_NaN() : T(0));
          continue;
        }
        for (int64_t t = 0; t < Tp; ++t) {
          s[t] = std::exp(std::min(std::max(s[t] - m, floor), T(0))) * a[t];
          z += s[t];
        }
        const T inv = T(1) / z;
        for (int64_t t = 0; t < Tp; ++t) s[t] *= inv;
      }
      times_eight(P, Tp, 1, Tq, Tk, vl.data(), kLanes, T(1), ol.data(), kLanes);  // O = P V
      out_of_lanes(ol.data(), Tq, dv, op + (b * Tq * H + h) * dv, H * dv);
    }
  });
}

// The gradients, from the probabilities P the forward pass kept: with dP = dO V^T and dS = P * (dP - rowsum(P * dP))
// (softmax's Jacobian), dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO. A (row, head) is one thread's.
template <typename T>
void backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
              const at::Tensor& probs, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv_) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2), Tp = padded(Tk);
  const int64_t d = q.size(3), dv = v.size(3);
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d)));
  const T *gp = dout.data_ptr<T>(), *qp = q.data_ptr<T>(), *kp = k.data_ptr<T>(), *vp = v.data_ptr<T>();
  const T* pp = probs.data_ptr<T>();
  T *dqp = dq.data_ptr<T>(), *dkp = dk.data_ptr<T>(), *dvp = dv_.data_ptr<T>();  // each (B, T, H, width), contiguous
  const auto qs = q.strides(), ks = k.strides(), vs = v.strides();
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, Tq * Tp * kLanes));
  at::parallel_for(0, B * H, grain, [&](int64_t begin, int64_t end) {
    std::vector<T> gl(Tq * kLanes), ql(Tq * kLanes), kl(Tp * kLanes), vt(kLanes * Tp), ds(Tq * Tp);
    std::vector<T> ol(std::max(Tq, Tp) * kLanes);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / H, h = r % H;
      const T* P = pp + r * Tq * Tp;
      into_lanes(gp + (b * Tq * H + h) * dv, H * dv, Tq, dv, Tq, gl.data(), false);
      into_lanes(qp + b * qs[0] + h * qs[1], qs[2], Tq, d, Tq, ql.data(), false);
      into_lanes(kp + b * ks[0] + h * ks[1], ks[2], Tk, d, Tp, kl.data(), false);
      into_lanes(vp + b * vs[0] + h * vs[1], vs[2], Tk, dv, Tp, vt.data(), true);
      for (int64_t c = 0; c < Tp; c += kLanes)  // dP, eight keys at a time
        times_eight(gl.data(), kLanes, 1, Tq, dv, vt.data() + c, Tp, T(1), ds.data() + c, Tp);
      for (int64_t i = 0; i < Tq; ++i) {
        const T* p = P + i * Tp;
        T* s = ds.data() + i * Tp;
        T rowsum = 0;
        for (int64_t t = 0; t < Tp; ++t) rowsum += p[t] * s[t];
        for (int64_t t = 0; t < Tp; ++t) s[t] = p[t] * (s[t] - rowsum);  // dS, zero past Tk as P is
      }
      times_eight(ds.data(), Tp, 1, Tq, Tk, kl.data(), kLanes, scale, ol.data(), kLanes);  // dQ = scale dS K
      out_of_lanes(ol.data(), Tq, d, dqp + (b * Tq * H + h) * d, H * d);
      times_eight(ds.data(), 1, Tp, Tk, Tq, ql.data(), kLanes, scale, ol.data(), kLanes);  // dK = scale dS^T Q
      out_of_lanes(ol.data(), Tk, d, dkp + (b * Tk * H + h) * d, H * d);
      times_eight(P, 1, Tp, Tk, Tq, gl.data(), kLanes, T(1), ol.data(), kLanes);  // dV = P^T dO
      out_of_lanes(ol.data(), Tk, dv, dvp + (b * Tk * H + h) * dv, H * dv);
    }
  });
}

}  // namespace

// q (B, h, T_q, d_k), k (B, h, T_k, d_k), v (B, h, T_k, d_v) with d_k, d_v <= 8, allowed bool broadcast to
// (B, h, T_q, T_k). Returns the output (B, T_q, h, d_v), the layout W^O reads, and the probabilities (B, h, T_q, T_k
// padded with zeros to a multiple of 8) for narrow_attention_backward.
std::vector<at::Tensor> narrow_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const at::Tensor& allowed) {
  check_heads(q, k, v, kLanes);
  check_allowed(allowed, q, k);
  auto out = at::empty({q.size(0), q.size(2), q.size(1), v.size(3)}, q.options());
  auto probs = at::empty({q.size(0), q.size(1), q.size(2), padded(k.size(2))}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "narrow_attention", [&] { forward<scalar_t>(q, k, v, allowed, out, probs); });
  return {out, probs};
}

// The gradients of narrow_attention with respect to q, k and v, from the output's gradient dout (B, T_q, h, d_v) and
// the probabilities it kept; each in the (B, T, h, width) layout (the heads' view of a linear map's output).
std::vector<at::Tensor> narrow_attention_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& v, const at::Tensor& probs) {
  check_heads(q, k, v, kLanes);
  TORCH_CHECK(dout.is_contiguous() && dout.scalar_type() == q.scalar_type() &&
              dout.sizes() == at::IntArrayRef({q.size(0), q.size(2), q.size(1), v.size(3)}),
              "dout must be contiguous (B, T_q, h, d_v)");
  TORCH_CHECK(probs.is_contiguous() && probs.scalar_type() == q.scalar_type() &&
              probs.sizes() == at::IntArrayRef({q.size(0), q.size(1), q.size(2), padded(k.size(2))}),
              "probs must be narrow_attention's (B, h, T_q, T_k padded to a multiple of 8)");
  auto dq = at::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, q.options());
  auto dk = at::empty({k.size(0), k.size(2), k.size(1), k.size(3)}, k.options());
  auto dv = at::empty({v.size(0), v.size(2), v.size(1), v.size(3)}, v.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "narrow_attention_backward", [&] {
    backward<scalar_t>(dout, q, k, v, probs, dq, dk, dv);
  });
  return {dq, dk, dv};
}
