"""The benchmarks, three programs: cpu/ (`python -m ablations.bench`, and its profiling), gpu/ (`python -m
ablations.bench.gpu`) and check/ (`python -m ablations.bench.check`, the GPU check). Here: what they share (peers,
variants, workload, report) and two tools, shapes (a budget's batch shapes) and rowcost (a row's cost per step)."""
