#!/usr/bin/env bash
# Nsight Compute sections of one profile_decode_fp8.py variant (GPU machine,
# repo root): bash benchmarks/kernels/ncu_decode_fp8.sh VARIANT
v=$1
ncu --clock-control none -c 12 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section LaunchStats --section Occupancy python3 benchmarks/kernels/profile_decode_fp8.py --variant $v
