// In-place edits of a step's f32 logits before any draw (argmax, top-k, whole-vocabulary
// draws and log-probs all read what these leave): the repetition penalty and a grammar's
// token masks. Launchers: src/engine/cuda/logits_ops.rs.
#include <stdint.h>
#include "common.cuh"

// vLLM's repetition penalty in place: entry at[i] of the flat f32 logits (the entries are
// distinct) is divided by p[i] when positive and multiplied by it otherwise.
extern "C" __global__ void repetition_penalty_f32(float* logits, const uint32_t* at,
                                                  const float* p, int n) {
  pdl_entry();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float* v = logits + at[i];
  *v = *v > 0.f ? *v / p[i] : *v * p[i];
}

// A grammar's token masks on f32 logits in place. Entry m of n (spec: rows [n], forced [n],
// at [n]) applies to row rows[m] of [*, vocab] logits: when forced[m] is a token id, that
// token alone stays (a mask that allows one token: no words uploaded for it); otherwise
// mask at[m] of `masks` (words u32 words, bit t % 32 of word t / 32 set = token t allowed).
// Every token not allowed becomes -inf. Grid: (ceil(vocab / 256), n).
extern "C" __global__ void mask_tokens_f32(float* logits, const uint32_t* masks,
                                           const uint32_t* spec, int n, int vocab, int words) {
  pdl_entry();
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= vocab) return;
  const int m = blockIdx.y;
  const uint32_t row = spec[m], forced = spec[n + m];
  bool allowed;
  if (forced != 0xffffffffu) {
    allowed = (uint32_t)t == forced;
  } else {
    const uint32_t w = masks[(size_t)spec[2 * n + m] * words + (t >> 5)];
    allowed = (w >> (t & 31)) & 1u;
  }
  if (!allowed) logits[(size_t)row * vocab + t] = -INFINITY;
}
