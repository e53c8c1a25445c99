"""The benchmark: the training step and beam search beside peers, profiling, and a row's cost per step."""
