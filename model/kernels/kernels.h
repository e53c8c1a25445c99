// What narrow.cpp, reorder.cpp and loss.cpp give attention.cpp's Python module (__init__.py beside them builds
// it), and the helpers they share.
#pragma once

// The tensor, the dispatch macros, parallel_for and the two ops the kernels allocate with: all of ATen, torch's C++
// API and pybind11 are most of a file's compile time, and only attention.cpp, which binds the Python module, includes
// pybind11 (torch/python.h).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

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

// The heads that both attention kernels take: q (B, h, T_q, d_k), k (B, h, T_k, d_k), v (B, h, T_k, d_v) on the CPU,
// of one dtype, unit stride in the last dimension, widths up to max_width; and allowed, bool (B, h, T_q, T_k).
inline void check_heads(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t max_width) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be 4-d");
  TORCH_CHECK(q.is_cpu() && k.is_cpu() && v.is_cpu(), "q, k, v must be on the CPU");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), "q, k, v must share a dtype");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "q, k, v need unit stride in the last dimension");
  TORCH_CHECK(q.size(3) <= max_width && v.size(3) <= max_width, "head width above ", max_width);
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3), "k does not match q");
  TORCH_CHECK(v.size(0) == k.size(0) && v.size(1) == k.size(1) && v.size(2) == k.size(2), "v does not match k");
}

inline void check_allowed(const at::Tensor& allowed, const at::Tensor& q, const at::Tensor& k) {
  TORCH_CHECK(allowed.dim() == 4 && allowed.is_cpu() && allowed.scalar_type() == at::kBool &&
              allowed.size(0) == q.size(0) && allowed.size(1) == q.size(1) && allowed.size(2) == q.size(2) &&
              allowed.size(3) == k.size(2), "allowed must be bool (B, h, T_q, T_k) on the CPU");
}

std::vector<at::Tensor> narrow_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const at::Tensor& allowed);
std::vector<at::Tensor> narrow_attention_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& v, const at::Tensor& probs);
void reorder_rows(const std::vector<at::Tensor>& buffers, const at::Tensor& index, int64_t filled);
std::vector<at::Tensor> smoothed_nll(const at::Tensor& logits, const at::Tensor& target, double eps);
at::Tensor smoothed_nll_backward(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& top,
                                 const at::Tensor& log_sum, const at::Tensor& scale, double eps);
