// What narrow_kernel.cpp, reorder_kernel.cpp and loss_kernel.cpp give attention_kernel.cpp's Python module
// (model/kernel.py), and the helpers they share.
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

// Whether x is NaN or infinite, read from its bits: -ffast-math lets the compiler drop std::isfinite.
template <typename T>
inline bool non_finite(T x) {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  const Bits exponent = sizeof(T) == 4 ? Bits(0x7f800000u) : Bits(0x7ff0000000000000ull);
  Bits bits;
  std::memcpy(&bits, &x, sizeof bits);
  return (bits & exponent) == exponent;
}

// x, hidden from the optimiser: under -ffast-math it may regroup (a - b) - c as a - (b + c), which loses the digits
// that subtracting b first kept.
template <typename T>
inline T opaque(T x) {
  asm volatile("" : "+m"(x));
  return x;
}

std::vector<at::Tensor> narrow_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const at::Tensor& allowed);
std::vector<at::Tensor> narrow_attention_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& v, const at::Tensor& probs);
void reorder_rows(const std::vector<at::Tensor>& buffers, const at::Tensor& index, int64_t filled);
std::vector<at::Tensor> smoothed_nll(const at::Tensor& logits, const at::Tensor& target, double eps);
at::Tensor smoothed_nll_backward(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& top,
                                 const at::Tensor& log_sum, const at::Tensor& scale, double eps);
