"""What a training step's forward pass keeps for its backward pass, by precision (ablations/training/precision.py):
a bf16 copy of the model ('bf16-weights') against fp32 weights under bf16 autocast ('bf16') and fp32.

    python -m ablations.bench.precision_memory                      # d_model 512, 2 layers, 32 x 32 tokens
    python -m ablations.bench.precision_memory --layers 6 --rows 64  # base's depth, a bigger batch

Counted on the CPU by torch.autograd.graph.saved_tensors_hooks: each tensor saved for the backward pass, one storage
once, the model's own parameters left out. Those of a parameter's shape are apart from the activations: autocast's
bf16 copy of a weight at each use, and the chunked loss's gradient of the embedding matrix (model/objective.py,
in the weight's dtype). Attention runs through torch's fused kernel, as on a GPU. Each precision trains the same
weights on the same batch with the same dropout masks; the table gives its loss beside fp32's.
"""

from __future__ import annotations

import sys

import torch

from ablations.bench.launches import on_a_gpu
from ablations.runs.budgets import BF16_WEIGHTS, PRECISIONS, step_autocast
from ablations.runs.options import failed
from model import Transformer, TransformerConfig
from model.batch import Batch
from model.params import working_copy
from plumbing.cli import OneLineParser, check_counts


def saved_bytes(model: torch.nn.Module, batch: Batch, precision: str) -> tuple[dict[str, int], float]:
    """The bytes saved for the backward pass by one forward pass of the training loss, the activations by dtype and
    the weight-shaped apart; and the loss."""
    ours = {p.untyped_storage().data_ptr() for p in model.parameters()}
    shapes = {p.shape for p in model.parameters() if p.dim() == 2}
    saved: dict[int, tuple[str, int]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in ours:
            kind = "weight-shaped" if t.shape in shapes else str(t.dtype).removeprefix("torch.")
            saved[storage.data_ptr()] = (kind, storage.nbytes())
        return t

    autocast = step_autocast(precision)
    torch.manual_seed(0)  # the same dropout masks in every precision
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast is not None):
            loss = batch.forward(model, with_labels=True)
    by_kind: dict[str, int] = {}
    for kind, nbytes in saved.values():
        by_kind[kind] = by_kind.get(kind, 0) + nbytes
    return by_kind, loss.item()


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m ablations.bench.precision_memory", description=__doc__.split("\n")[0])
    parser.add_argument("--d-model", type=int, default=512, help="d_model (d_ff 4x, 8 heads)")
    parser.add_argument("--layers", type=int, default=2, help="N, encoder and decoder layers each")
    parser.add_argument("--rows", type=int, default=32, help="sentence pairs in the batch")
    parser.add_argument("--length", type=int, default=32, help="source and target tokens per sentence")
    parser.add_argument("--vocab", type=int, default=8000)
    args = parser.parse_args(argv)
    try:
        check_counts(*((f"--{k.replace('_', '-')}", v) for k, v in vars(args).items()))
    except ValueError as exc:
        return failed(exc)
    d = args.d_model
    cfg = TransformerConfig(N=args.layers, d_model=d, d_ff=4 * d, h=8, d_k=d // 8, d_v=d // 8, vocab_size=args.vocab)
    torch.manual_seed(0)
    model = Transformer(cfg).train()
    ids = lambda: torch.randint(4, args.vocab, (args.rows, args.length))  # noqa: E731
    no_pad = torch.zeros(args.rows, args.length, dtype=torch.bool)
    batch = Batch(ids(), ids(), no_pad, no_pad, ids())
    print(
        f"d_model {d}, N {args.layers}, {args.rows} x {args.length} tokens a side, vocabulary {args.vocab}, "
        f"dropout {cfg.P_drop}, CPU"
    )
    kinds = ("float32", "bfloat16", "weight-shaped")
    print("| precision | saved (MB) | activations fp32 | activations bf16 | weight-shaped | loss | / fp32's - 1 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    losses = {}
    for precision in PRECISIONS:
        trained = working_copy(model) if precision == BF16_WEIGHTS else model
        with on_a_gpu(stacked=False, causal=False):  # torch's fused attention, as on a GPU
            by_kind, losses[precision] = saved_bytes(trained, batch, precision)
        mb = " | ".join(f"{by_kind.get(kind, 0) / 1e6:.1f}" for kind in kinds)
        print(
            f"| {precision} | {sum(by_kind.values()) / 1e6:.1f} | {mb} | {losses[precision]:.5f} | "
            f"{losses[precision] / losses['fp32'] - 1:+.1e} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
