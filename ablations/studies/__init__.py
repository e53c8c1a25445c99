"""Studies beside the grid: specs compared on the same batches, the dropout gap, attention maps of trained runs."""
