"""A table by kernel from `ncu --import R --csv --page details` (scripts/gpu_call_round32.sh):
launches, mean duration, DRAM read bytes and throughput, achieved occupancy, registers, grid,
and the two largest warp stall reasons (cycles a warp spends stalled per issued instruction)."""
import collections
import csv
import sys

rows = list(csv.DictReader(open(sys.argv[1])))
by = collections.defaultdict(lambda: collections.defaultdict(list))
for r in rows:
    name = r["Kernel Name"].split("(")[0]
    try:
        v = float(r["Metric Value"].replace(",", ""))
    except ValueError:
        continue
    key = (name, r.get("Grid Size", ""), r.get("Block Size", ""))
    by[key][r["Metric Name"]].append((v, r.get("Metric Unit", "")))


def mean(d, k, scale=1.0):
    xs = d.get(k)
    if not xs:
        return float("nan")
    return sum(x for x, _ in xs) / len(xs) * scale


def unit_scale(d, k, want):
    xs = d.get(k)
    if not xs:
        return 1.0
    u = xs[0][1]
    table = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "byte": 1.0, "Kbyte": 1e3,
             "Mbyte": 1e6, "Gbyte": 1e9}
    return table.get(u, 1.0) / table.get(want, 1.0)


print(f"{'kernel':34} {'grid':>14} {'n':>4} {'us':>7} {'MB':>7} {'TB/s':>6} {'dram%':>6} "
      f"{'occ%':>5} {'regs':>4}  top stalls (cycles/instr)")
total = 0.0
for (name, grid, block), d in sorted(by.items(), key=lambda kv: -mean(kv[1], "Duration")):
    n = len(d.get("Duration", []))
    us = mean(d, "Duration", unit_scale(d, "Duration", "usecond"))
    mb = mean(d, "dram__bytes_read.sum", unit_scale(d, "dram__bytes_read.sum", "byte")) / 1e6
    stalls = sorted(((mean(d, k), k.split("issue_stalled_")[1].split("_per_issue")[0])
                     for k in d if "issue_stalled_" in k), reverse=True)[:3]
    st = ", ".join(f"{k} {v:.1f}" for v, k in stalls)
    total += us * n
    print(f"{name[:34]:34} {grid[:14]:>14} {n:4d} {us:7.2f} {mb:7.2f} {mb / us / 1e0 if us else 0:6.2f} "
          f"{mean(d, 'DRAM Throughput'):6.1f} {mean(d, 'Achieved Occupancy'):5.1f} "
          f"{mean(d, 'Registers Per Thread'):4.0f}  {st}")
print(f"sum of durations over the profiled launches: {total:.1f} us")
