"""The GPU benchmark (`python -m ablations.bench.gpu`, nox -s bench_gpu): training steps and beam search of the
reference beside its peers on one GPU, eager and compiled, timed under a limit, with its report."""
