// One tile of the MoE expert kernels (moe.cu, moe_mma.cu): the tile table `moe_align` writes
// holds (start in `order`, count, expert) per tile; block y takes tile y.
#pragma once
#include <stdint.h>

struct MoeTile {
  int start;  // first position in `order`
  int n;      // pairs (0: an unused tail entry)
  int ex;     // the expert among this rank's (first..first + local)
  bool live;  // pairs, on an expert this rank holds
};

__device__ __forceinline__ MoeTile moe_tile_of(const uint32_t* tiles, int first, int local) {
  const uint32_t* tl = tiles + 3 * blockIdx.y;
  MoeTile t;
  t.start = tl[0];
  t.n = tl[1];
  t.ex = (int)tl[2] - first;
  t.live = t.n != 0 && t.ex >= 0 && t.ex < local;
  return t;
}
