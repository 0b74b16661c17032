// A decode graph's input rows advanced one token on the device, for the next pipelined step
// (LaunchOptions::graph_advance): the same words as the host's advance_decode_rows
// (src/engine/runner/graph_rows.rs), whose layout this reads: token, position, slot, context and run
// arrays of `rows` each, the tables' width, then each row's table of `width` blocks.
#pragma once

#include <stdint.h>

namespace {

// Row r of the layout at `in` (`len` words, rows `rows`) one position further when it is a
// one-token row that writes the cache: position + 1, context + 1, the slot the new position's
// in its table (left when the table holds no block for it, or the block lies past `len`). u32
// arithmetic, wrapping as the host's.
__device__ __forceinline__ void advance_row(uint32_t* in, int len, int rows, int r, uint32_t bs) {
  const uint32_t pos = in[rows + r], slot = in[2 * rows + r], ctx = in[3 * rows + r];
  if (slot == 0xffffffffu || in[4 * rows + r] != 1u || ctx == 0u) return;
  const uint32_t p = pos + 1u, width = in[5 * rows], blk = p / bs;
  const size_t at = 5 * (size_t)rows + 1 + (size_t)r * width + blk;
  if (blk < width && at < (size_t)len) in[2 * rows + r] = in[at] * bs + p % bs;
  in[rows + r] = p;
  in[3 * rows + r] = ctx + 1u;
}

}  // namespace
