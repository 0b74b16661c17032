#!/usr/bin/env python3
# A lane-by-lane model of kernels/lora_grouped.cu's shrink (the groups of the tile table as
# load_group finds them with its two ballots, mma m16n8k16 fragments as PTX documents them,
# the permuted k of a lane's 16-byte loads, split-K partial sums and the last block's ordered
# sum), checked against a[s] @ x[t]: the indexing, on a CPU (numpy), before a GPU run. Keep it
# in step with the kernel. Usage: python3 scripts/lora_grouped_emulate.py
import numpy as np
rng = np.random.default_rng(0)
WIN, WARPS, UNROLL = 8, 4, 4


def load_group(tiles, slots, g):
    """load_group: (slot, tok[8]) of group g, or None."""
    n = len(tiles)
    assert n <= 64
    live = [i < n and tiles[i][1] > 0 and tiles[i][2] < slots for i in range(64)]
    sl = [tiles[i][2] if live[i] else 0xffffffff for i in range(64)]
    tk = [tiles[i][0] if live[i] else -1 for i in range(64)]
    runs = 0
    for i in range(64):
        if live[i] and (i == 0 or tk[i - 1] < 0 or sl[i - 1] != sl[i]):
            runs |= 1 << i
    groups = 0
    for i in range(64):
        upto = (1 << (i + 1)) - 1
        run = (runs & upto).bit_length() - 1
        if live[i] and (i - run) % WIN == 0:
            groups |= 1 << i
    tok, slot, found = [-1] * WIN, None, False
    for i in range(64):
        if not live[i]:
            continue
        before = groups & ((1 << (i + 1)) - 1)
        if bin(before).count("1") - 1 == g:
            first = before.bit_length() - 1
            tok[i - first] = tk[i]
            if i == first:
                slot, found = sl[i], True
    return (slot, tok) if found else None


def mma(acc, A_regs, B_regs):
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
    mtiles = -(-pr // 16)
    counters = np.zeros(mtiles * ntiles, int)
    P = lambda v, i: (v[2*i], v[2*i+1])
    for by in range(ntiles):
        grp = load_group(tiles, slots, by)
        if grp is None:
            continue
        s, tok = grp
        for bx in range(mtiles):
            for bz in range(slices):
                j0 = bx * 16
                kslice = inn // slices; k0 = bz * kslice; chunks = kslice // 32
                red = np.zeros((WARPS, 16, WIN))
                for warp in range(WARPS):
                    acc = [[0.0] * 4 for _ in range(32)]
                    for c0 in range(warp, chunks, WARPS * UNROLL):
                        for u in range(UNROLL):
                            cc = c0 + u * WARPS
                            if cc >= chunks:
                                continue  # zeros add nothing
                            Ar, Br, Ar2, Br2 = [], [], [], []
                            for lane in range(32):
                                g, tig = lane >> 2, lane & 3
                                ja, jb = j0 + g, j0 + g + 8
                                k = k0 + cc * 32 + tig * 8
                                va = a[s, ja, k:k+8] if ja < pr else np.zeros(8)
                                vb = a[s, jb, k:k+8] if jb < pr else np.zeros(8)
                                vx = x[tok[g], k:k+8] if tok[g] >= 0 else np.zeros(8)
                                Ar.append((P(va, 0), P(vb, 0), P(va, 1), P(vb, 1))); Br.append((P(vx, 0), P(vx, 1)))
                                Ar2.append((P(va, 2), P(vb, 2), P(va, 3), P(vb, 3))); Br2.append((P(vx, 2), P(vx, 3)))
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
                        if ok:
                            y[tok[q], j] = v
                    elif ok:
                        part[bz, tok[q], j] = v
                if slices > 1:
                    ci = by * mtiles + bx
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
    live = set()
    for (t0, n, s) in tiles:
        if n > 0 and s < slots:
            live.add(t0)
            ref = a[s] @ x[t0]
            assert np.allclose(y[t0], ref), (t0, s, np.abs(y[t0] - ref).max())
    for r in range(rows):
        if r not in live:
            assert np.isnan(y[r]).all(), r
    print("ok", rows, slots, len(tiles), inn, pr, slices)


by_slot = sorted([(i, 1, i % 8) for i in range(16)], key=lambda t: t[2])
check(16, 8, by_slot + [(0, 0, 0)], 256, 48, 2)
scattered = [(i, 1, 99 if i == 17 else (i * 7) % 13) for i in range(24) if i % 5 != 3]
check(24, 16, scattered, 512, 24, 1)
check(24, 16, scattered, 512, 8, 4)
# One slot for 20 rows: groups of 8, 8 and 4.
check(20, 4, [(i, 1, 2) for i in range(20)], 128, 16, 1)
