set -u
out=${1:?OUT}; mkdir -p $out/logs; export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > $out/logs/activate.log 2>&1 || exit 1
timeout 200 python3 out/probe/mhc_probe5.py $out/logs/probe5.json 2>&1 | tee $out/logs/probe5.log | cut -c1-200
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
timeout 200 $NCU --clock-control none --launch-skip 2 --launch-count 1 -k regex:"hc_mix_partials" \
  --section WarpStateStats --section SourceCounters --print-details all \
  python3 out/probe/ncu_target.py > $out/logs/ncu5.log 2>&1
grep -iE "stall|Warp Cycles|Duration|Samples" $out/logs/ncu5.log | cut -c1-150 | head -60
tar -C $out -czf $out/logs.tgz logs
