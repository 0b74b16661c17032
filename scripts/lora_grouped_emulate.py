#!/usr/bin/env python3
# A lane-by-lane model of kernels/lora_grouped.cu's shrink (mma m16n8k16 fragments as PTX documents
# them, the permuted k of a lane's 16-byte loads, runs of one slot in a window, split-K partial
# sums and the last block's ordered sum), checked against a[s] @ x[t]: the indexing, on a CPU
# (numpy), before a GPU run. Keep it in step with the kernel. Usage: python3 scripts/lora_grouped_emulate.py
import numpy as np
rng = np.random.default_rng(0)
WIN, WARPS, UNROLL = 8, 4, 4

def mma(acc, A_regs, B_regs):
    # A_regs[lane] = (a0,a1,a2,a3) each a pair (lo, hi); B_regs[lane] = (b0, b1)
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for lane in range(32):
        g, c = lane >> 2, lane & 3
        a = A_regs[lane]
        for e in range(2):
            A[g, 2*c+e] = a[0][e]; A[g+8, 2*c+e] = a[1][e]
            A[g, 2*c+8+e] = a[2][e]; A[g+8, 2*c+8+e] = a[3][e]
        b = B_regs[lane]
        for e in range(2):
            B[2*c+e, g] = b[0][e]; B[2*c+8+e, g] = b[1][e]
    D = A @ B
    for lane in range(32):
        g, c = lane >> 2, lane & 3
        acc[lane][0] += D[g, 2*c]; acc[lane][1] += D[g, 2*c+1]
        acc[lane][2] += D[g+8, 2*c]; acc[lane][3] += D[g+8, 2*c+1]

def shrink(x, a, tiles, slots, slices):
    rows, inn = x.shape
    _, pr, _ = a.shape
    ntiles = len(tiles)
    y = np.full((rows, pr), np.nan)
    part = np.zeros((slices, rows, pr))
    mtiles, windows = -(-pr // 16), -(-ntiles // WIN)
    counters = np.zeros(mtiles * windows, int)
    for by in range(windows):
        tok, slot = [-1]*WIN, [0xffffffff]*WIN
        for q in range(WIN):
            i = by*WIN + q
            if i < ntiles:
                t0, n, s = tiles[i]
                if n > 0 and s < slots: tok[q], slot[q] = t0, s
        if all(t < 0 for t in tok): continue
        for bx in range(mtiles):
            for bz in range(slices):
                j0 = bx*16
                kslice = inn // slices; k0 = bz*kslice; chunks = kslice // 32
                red = np.zeros((WARPS, 16, WIN))
                for warp in range(WARPS):
                    acc = [[0.0]*4 for _ in range(32)]
                    for q0 in range(WIN):
                        if tok[q0] < 0 or any(tok[p] >= 0 and slot[p] == slot[q0] for p in range(q0)): continue
                        s = slot[q0]
                        for c0 in range(warp, chunks, WARPS*UNROLL):
                            for u in range(UNROLL):
                                cc = c0 + u*WARPS
                                if cc >= chunks: continue  # zeros contribute nothing
                                Ar, Br = [], []
                                Ar2, Br2 = [], []
                                for lane in range(32):
                                    g, tig = lane >> 2, lane & 3
                                    ja, jb = j0+g, j0+g+8
                                    k = k0 + cc*32 + tig*8
                                    va = a[s, ja, k:k+8] if ja < pr else np.zeros(8)
                                    vb = a[s, jb, k:k+8] if jb < pr else np.zeros(8)
                                    mine = tok[g] >= 0 and slot[g] == s
                                    vx = x[tok[g], k:k+8] if mine else np.zeros(8)
                                    P = lambda v, i: (v[2*i], v[2*i+1])
                                    Ar.append((P(va,0), P(vb,0), P(va,1), P(vb,1))); Br.append((P(vx,0), P(vx,1)))
                                    Ar2.append((P(va,2), P(vb,2), P(va,3), P(vb,3))); Br2.append((P(vx,2), P(vx,3)))
                                mma(acc, Ar, Br); mma(acc, Ar2, Br2)
                    for lane in range(32):
                        g, tig = lane >> 2, lane & 3
                        red[warp, g, 2*tig] = acc[lane][0]; red[warp, g, 2*tig+1] = acc[lane][1]
                        red[warp, g+8, 2*tig] = acc[lane][2]; red[warp, g+8, 2*tig+1] = acc[lane][3]
                for tid in range(128):
                    i, q = tid >> 3, tid & 7
                    v = sum(red[w, i, q] for w in range(WARPS))
                    j = j0 + i
                    ok = tok[q] >= 0 and j < pr
                    if slices == 1:
                        if ok: y[tok[q], j] = v
                    elif ok: part[bz, tok[q], j] = v
                if slices > 1:
                    ci = by*mtiles + bx
                    counters[ci] += 1
                    if counters[ci] == slices:
                        for tid in range(128):
                            i, q = tid >> 3, tid & 7; j = j0 + i
                            if tok[q] >= 0 and j < pr:
                                y[tok[q], j] = sum(part[z, tok[q], j] for z in range(slices))
                        counters[ci] = 0
    assert (counters == 0).all()
    return y

def check(rows, slots, tiles, inn, pr, slices):
    x = rng.standard_normal((rows, inn)); a = rng.standard_normal((slots, pr, inn))
    y = shrink(x, a, tiles, slots, slices)
    for (t0, n, s) in tiles:
        if n > 0 and s < slots:
            ref = a[s] @ x[t0]
            assert np.allclose(y[t0], ref), (t0, s, np.abs(y[t0]-ref).max())
    live = {t0 for (t0, n, s) in tiles if n > 0 and s < slots}
    for r in range(rows):
        if r not in live: assert np.isnan(y[r]).all(), r
    print("ok", rows, slots, len(tiles), inn, pr, slices)

by_slot = sorted([(i, 1, i % 8) for i in range(16)], key=lambda t: t[2])
check(16, 8, by_slot + [(0, 0, 0)], 256, 48, 2)
scattered = [(i, 1, 99 if i == 17 else (i*7) % 13) for i in range(24) if i % 5 != 3]
check(24, 16, scattered, 512, 24, 1)
check(24, 16, scattered, 512, 8, 4)
check(12, 4, [(i, 1, 2) for i in range(12)], 128, 16, 1)
