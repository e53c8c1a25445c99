"""Adapters shipped with the harness: the reference model and torch.nn.Transformer."""
