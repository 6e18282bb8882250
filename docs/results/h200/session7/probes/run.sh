set -u
out=${1:?OUT}; mkdir -p $out/logs; export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > $out/logs/activate.log 2>&1 || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
timeout 420 python3 out/probe/mhc_probe2.py $out/logs/probe.json 2>&1 | tee $out/logs/probe.log | cut -c1-400
timeout 120 python3 -m pytest -q -p no:cacheprovider -rfEs -m gpu test/ops/mhc/test_hc_mix_stats.py 2>&1 | tee $out/logs/gpu_mhc.log | tail -15
tar -C $out -czf $out/logs.tgz logs
