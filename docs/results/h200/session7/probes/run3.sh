set -u
out=${1:?OUT}; mkdir -p $out/logs; export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > $out/logs/activate.log 2>&1 || exit 1
timeout 60 python3 -m pytest -q -p no:cacheprovider -rfEs -m gpu test/ops/mhc/test_hc_mix_stats.py 2>&1 | tee $out/logs/gpu_mhc.log | tail -4
timeout 200 python3 out/probe/mhc_probe3.py $out/logs/probe3.json 2>&1 | tee $out/logs/probe3.log | cut -c1-200
timeout 200 python3 -m benchmark.call_sites --sites mix_stats --json $out/logs/call_sites_mhc.json > $out/logs/call_sites_mhc.log 2>&1; tail -45 $out/logs/call_sites_mhc.log | cut -c1-160
tar -C $out -czf $out/logs.tgz logs
