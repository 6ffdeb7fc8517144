"""The Mosaic kernel's Nsight Compute figures from ncu_decode_fp8.sh logs,
as JSON (one row per log: its first ``anonymous_mosaic_gpu_kernel``):

    python3 benchmarks/kernels/ncu_summary.py OUT.json NAME=LOG [NAME=LOG ...]

``warp_instructions_per_sm`` is Executed Ipc Active x SM Active Cycles:
the warp instructions one SM executed (mbarrier polling included).
"""

from __future__ import annotations

import json
import re
import sys

METRICS = {
    "Duration": "duration_us",
    "SM Frequency": "sm_ghz",
    "DRAM Throughput": "dram_pct",
    "SM Active Cycles": "sm_active_cycles",
    "Executed Ipc Active": "ipc_active",
    "Issue Slots Busy": "issue_slots_busy_pct",
    "No Eligible": "no_eligible_pct",
    "Eligible Warps Per Scheduler": "eligible_warps_per_scheduler",
    "Warp Cycles Per Issued Instruction": "warp_cycles_per_issued",
    "Registers Per Thread": "registers_per_thread",
    "Dynamic Shared Memory Per Block": "dynamic_smem_kb",
}


def kernel_section(text: str) -> str:
    """The first Mosaic kernel's block of the log (up to the next kernel)."""
    start = text.index("  anonymous_mosaic_gpu_kernel (")
    nxt = re.search(r"\n  \S[^\n]*\(\d+, \d+, \d+\)x\(", text[start + 10:])
    return text[start:start + 10 + nxt.start()] if nxt else text[start:]


def summarize(text: str) -> dict:
    block = kernel_section(text)
    row = {"launch": block.splitlines()[0].strip()}
    for name, key in METRICS.items():
        m = re.search(rf"^\s+{re.escape(name)}\s+\S+\s+([\d,.]+)\s*$", block,
                      re.M)
        if m:
            row[key] = float(m.group(1).replace(",", ""))
    if "ipc_active" in row and "sm_active_cycles" in row:
        row["warp_instructions_per_sm"] = round(row["ipc_active"]
                                                * row["sm_active_cycles"])
    m = re.search(r"INF\s+(\w+) is the highest-utilized pipeline \(([\d.]+)%\)",
                  block)
    if m:
        row["busiest_pipe"], row["busiest_pipe_pct"] = m.group(1), float(
            m.group(2))
    return row


def main():
    out, *pairs = sys.argv[1:]
    rows = {}
    for pair in pairs:
        name, path = pair.split("=", 1)
        with open(path) as f:
            rows[name] = summarize(f.read())
    with open(out, "w") as f:
        json.dump({"command": "bash benchmarks/kernels/ncu_decode_fp8.sh "
                   "VARIANT > LOG (GPU machine), then python3 "
                   "benchmarks/kernels/ncu_summary.py " + " ".join(
                       sys.argv[1:]), "rows": rows}, f, indent=1)
    for name, r in rows.items():
        print(f"{name:12s} {r.get('duration_us', 0):7.1f} us  "
              f"{r.get('warp_instructions_per_sm', 0):8d} instr/SM  "
              f"IPC {r.get('ipc_active', 0):.2f}  issue "
              f"{r.get('issue_slots_busy_pct', 0):.0f}%  DRAM "
              f"{r.get('dram_pct', 0):.0f}%")


if __name__ == "__main__":
    main()
