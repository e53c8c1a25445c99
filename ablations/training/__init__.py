"""Training one run: the loop with its checkpoints, ranks under torchrun, clean stops, throughput, trained weights."""
