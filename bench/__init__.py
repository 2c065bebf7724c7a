"""Benchmarks that print tables: our loops side by side with TRL's trainers, generation throughput,
local-mode overhead, sandbox throughput (CPU, ``python -m bench.run_all``) and a GPU benchmark
with the memory plan of an 8 B full fine-tune (``python bench/gpu_benchmark.py``).
Figures and the machines they came from: ``docs/BENCHMARKS.md``."""
