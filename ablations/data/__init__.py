"""The corpora on disk, the shared BPE model, and batches of token ids: what the model reads."""
