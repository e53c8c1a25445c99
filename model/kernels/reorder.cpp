// The decoding cache's reorder for beam search (__init__.py: reorder_rows), built with attention.cpp.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels.h"

// Beam search's reorder of the self-attention cache, in place: row r of every buffer (rows, h, capacity, d) takes the
// first `filled` positions of row index[r]. Rows that keep their hypothesis are not touched, and a moved row is
// copied once, straight from its source (torch's index_select then index_copy_ copies it twice, through a gathered
// tensor); only sources that are themselves overwritten are saved first.
void reorder_rows(const std::vector<at::Tensor>& buffers, const at::Tensor& index, int64_t filled) {
  TORCH_CHECK(index.scalar_type() == at::kLong && index.dim() == 1 && index.is_contiguous() && index.is_cpu(),
              "index must be a 1-d long CPU tensor");
  const int64_t rows = index.size(0);
  TORCH_CHECK(filled >= 0, "filled must be >= 0");
  std::vector<const void*> seen;  // everything is checked before anything is written: no half-reordered cache
  for (const at::Tensor& buffer : buffers) {
    TORCH_CHECK(buffer.dim() == 4 && buffer.is_cpu() && buffer.is_contiguous() && buffer.size(0) == rows &&
                filled <= buffer.size(2), "buffers must be contiguous CPU (rows, h, capacity, d) with >= `filled` positions");
    TORCH_CHECK(std::find(seen.begin(), seen.end(), buffer.data_ptr()) == seen.end(), "a buffer is given twice");
    seen.push_back(buffer.data_ptr());
  }
  const int64_t* from = index.data_ptr<int64_t>();
  std::vector<int64_t> moved, saved_slot(rows, -1);
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(from[r] >= 0 && from[r] < rows, "index out of range");
    if (from[r] != r) moved.push_back(r);
  }
  int64_t saved = 0;
  for (int64_t r : moved)
    if (from[from[r]] != from[r] && saved_slot[from[r]] < 0) saved_slot[from[r]] = saved++;  // its source moves too
  for (const at::Tensor& buffer : buffers) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, buffer.scalar_type(), "reorder_rows", [&] {
      const int64_t heads = buffer.size(1), row = buffer.stride(0), head = buffer.stride(1), span = filled * buffer.size(3);
      scalar_t* data = buffer.data_ptr<scalar_t>();
      std::vector<scalar_t> keep(saved * heads * span);
      const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, heads * span));  // rows per thread's chunk
      at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
        for (int64_t s = begin; s < end; ++s)
          if (saved_slot[s] >= 0)
            for (int64_t h = 0; h < heads; ++h)
              std::copy_n(data + s * row + h * head, span, keep.data() + (saved_slot[s] * heads + h) * span);
      });
      at::parallel_for(0, static_cast<int64_t>(moved.size()), grain, [&](int64_t begin, int64_t end) {
        for (int64_t m = begin; m < end; ++m) {
          const int64_t r = moved[m], s = from[r];
          for (int64_t h = 0; h < heads; ++h) {
            const scalar_t* source = saved_slot[s] >= 0 ? keep.data() + (saved_slot[s] * heads + h) * span
                                                         : data + s * row + h * head;
            std::copy_n(source, span, data + r * row + h * head);
          }
        }
      });
    });
  }
}
