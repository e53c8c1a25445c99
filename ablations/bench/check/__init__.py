"""The GPU check (`python -m ablations.bench.check`, nox -s gpu_check): what one GPU must show in 8 minutes, its data
prepared beforehand on a CPU, its parts run under time limits, and the targets judged in its report."""
