set -u
out=${1:?OUT}; mkdir -p $out/logs; export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > $out/logs/activate.log 2>&1 || exit 1
python3 out/probe8/ncu_target.py > /dev/null 2>&1  # build the module outside the profiler
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
timeout 200 $NCU --clock-control none --launch-skip 2 --launch-count 6 -k regex:"hc_mix_partials|_mix_finish" \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
  --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis \
  python3 out/probe8/ncu_target.py > $out/logs/ncu.log 2>&1
grep -E "hc_mix|_mix_finish|Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Memory Throughput|Compute \(SM\)|Stall|Warp Cycles Per Issued|Issued Warp|No Eligible|Achieved Occupancy|Registers|Block Size|Grid Size|Shared Memory Config|Executed Ipc|Mem Busy|Max Bandwidth|L2 Hit|Mem Pipes" $out/logs/ncu.log | cut -c1-150 | head -120
tar -C $out -czf $out/logs.tgz logs
