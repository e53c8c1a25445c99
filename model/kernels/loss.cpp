// Label-smoothed cross-entropy (section 5.4) over the vocabulary, forward and backward, row by row (model/objective.py).
// torch's log_softmax, exp and the smoothing terms each pass over the (tokens x vocabulary) logits and write one as
// large; here the forward reads each row twice (its maximum, then its sums) and writes two numbers per row, and the
// backward reads it once and writes the gradient. Built with attention.cpp (__init__.py).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels.h"

namespace {

void check_rows(const at::Tensor& logits, const at::Tensor& target) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous() && logits.is_cpu(), "logits must be contiguous (N, V) on the CPU");
  TORCH_CHECK(target.dim() == 1 && target.size(0) == logits.size(0) && target.scalar_type() == at::kLong &&
              target.is_contiguous() && target.is_cpu(), "target must be a contiguous (N,) long CPU tensor");
  const int64_t* t = target.data_ptr<int64_t>();
  TORCH_CHECK(std::all_of(t, t + target.size(0), [&](int64_t x) { return x >= 0 && x < logits.size(1); }),
              "target out of the vocabulary's range");
}

}  // namespace

// Per row n: (1 - eps) * (lse - x[target]) + eps * (lse - mean(x)), with lse = log sum exp(x); returns (loss, the
// row's maximum m, log sum exp(x - m)). Every term is formed from x - m, so that large logits lose nothing to
// cancellation, and `opaque` keeps -ffast-math from regrouping lse - x[target] as (m + log_z) - x[target].
std::vector<at::Tensor> smoothed_nll(const at::Tensor& logits, const at::Tensor& target, double eps) {
  check_rows(logits, target);
  const int64_t N = logits.size(0), V = logits.size(1);
  auto loss = at::empty({N}, logits.options()), top = at::empty({N}, logits.options());
  auto log_sum = at::empty({N}, logits.options());
  AT_DISPATCH_FLOATING_TYPES(logits.scalar_type(), "smoothed_nll", [&] {
    const scalar_t* x = logits.data_ptr<scalar_t>();
    const int64_t* t = target.data_ptr<int64_t>();
    scalar_t *lp = loss.data_ptr<scalar_t>(), *mp = top.data_ptr<scalar_t>(), *zp = log_sum.data_ptr<scalar_t>();
    const scalar_t keep = scalar_t(1 - eps), spread = scalar_t(eps);
    at::parallel_for(0, N, std::max<int64_t>(1, 65536 / std::max<int64_t>(1, V)), [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        const scalar_t* row = x + n * V;
        scalar_t m = std::numeric_limits<scalar_t>::lowest(), z = 0, sum = 0;
        for (int64_t v = 0; v < V; ++v) m = std::max(m, row[v]);
        for (int64_t v = 0; v < V; ++v) {
          z += std::exp(row[v] - m);
          sum += row[v] - m;
        }
        const scalar_t log_z = std::log(z), target_shifted = opaque(row[t[n]] - m);
        mp[n] = m;
        zp[n] = log_z;
        lp[n] = keep * (log_z - target_shifted) + spread * (log_z - sum / scalar_t(V));
      }
    });
  });
  return {loss, top, log_sum};
}

// d loss / d logits for per-row weights `scale` (N,): scale * (softmax(x) - eps / V - (1 - eps) * one-hot(target)),
// from smoothed_nll's m and log_z: softmax(x) = exp(x - m) / exp(log_z).
at::Tensor smoothed_nll_backward(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& top,
                                 const at::Tensor& log_sum, const at::Tensor& scale, double eps) {
  check_rows(logits, target);
  for (const at::Tensor* row : {&top, &log_sum, &scale})
    TORCH_CHECK(row->is_contiguous() && row->numel() == logits.size(0) && row->scalar_type() == logits.scalar_type(),
                "top, log_sum and scale must be contiguous (N,) of the logits' dtype");
  const int64_t N = logits.size(0), V = logits.size(1);
  auto grad = at::empty_like(logits);
  AT_DISPATCH_FLOATING_TYPES(logits.scalar_type(), "smoothed_nll_backward", [&] {
    const scalar_t *x = logits.data_ptr<scalar_t>(), *mp = top.data_ptr<scalar_t>(), *zp = log_sum.data_ptr<scalar_t>();
    const scalar_t* sp = scale.data_ptr<scalar_t>();
    const int64_t* t = target.data_ptr<int64_t>();
    scalar_t* g = grad.data_ptr<scalar_t>();
    const scalar_t spread = scalar_t(eps / V), keep = scalar_t(1 - eps);
    at::parallel_for(0, N, std::max<int64_t>(1, 65536 / std::max<int64_t>(1, V)), [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        const scalar_t* row = x + n * V;
        scalar_t* out = g + n * V;
        const scalar_t w = sp[n], m = mp[n], inv_z = opaque(std::exp(-zp[n]));  // not merged into the exp below
        for (int64_t v = 0; v < V; ++v) out[v] = w * (std::exp(row[v] - m) * inv_z - spread);
        out[t[n]] -= w * keep;
      }
    });
  });
  return grad;
}
