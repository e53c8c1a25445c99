"""The CPU benchmark (`python -m ablations.bench`, nox -s bench): the reference beside its peers and its own undone
speed choices, and the profile of where the CPU budget's time goes (`python -m ablations.bench.cpu.profiling`)."""
