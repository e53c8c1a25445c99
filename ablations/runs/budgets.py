"""How much compute a grid gets: smoke (CI), cpu (scaled models that translate, 2-core CPU), short (one GPU), paper.

A budget turns a Table 3 row into the model config and the training settings of one run.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass

import torch

from model.config import TransformerConfig
from model.objective import ADAM_BETAS, ADAM_EPS
from model.table3 import Table3Row, table3_rows

# A run's precision (ablations/training/precision.py): fp32 (the CPU's default), bf16 autocast over fp32 weights, or a
# bf16 working copy of the model stepping fp32 master weights (a GPU's default; on a CPU, slower, but the same steps).
PRECISIONS = ("fp32", "bf16", "bf16-weights")
BF16_WEIGHTS = "bf16-weights"


def autocast_of(precision: str) -> torch.dtype | None:
    """The dtype that evaluation and beam search run the fp32 model under: bf16 in both bf16 modes."""
    return None if precision == "fp32" else torch.bfloat16


def step_autocast(precision: str) -> torch.dtype | None:
    """The dtype the training step runs under autocast: bf16 for 'bf16' only; the working copy needs none."""
    return torch.bfloat16 if precision == "bf16" else None


SCALED_FIELDS = ("d_model", "d_ff", "d_k", "d_v")  # divided by Budget.scale; h and N are kept
# How a row's weights start (model/init.py): Xavier at the row's own width, Xavier with the stds of the row at the
# paper's width (a scaled row started as its full-size counterpart), or N(0, 0.02) at every width.
INIT_RULES = ("xavier", "paper-width", "normal")
# scaled_dot_product_attention's kernels a GPU run may be held to ('default': torch's choice); ablations/training/
# backends.py applies them.
SDPA_BACKENDS = ("default", "cudnn", "efficient", "flash", "math")


@dataclass(frozen=True)
class Budget:
    name: str
    scale: int  # d_model, d_ff, d_k, d_v are divided by this; 1 = the paper's sizes
    steps: int | None  # optimizer steps per row; None = the row's own (100K, big 300K)
    warmup: int  # warmup_steps of the learning-rate schedule (the paper: 4000 of 100K steps)
    lr_peak: (
        float | None
    )  # the schedule's peak for base's width (row_lr_peak scales it); None = eq. (3)'s d_model^-0.5 * warmup^-0.5
    batch_tokens: int  # source (and target) positions per optimizer step (the paper: about 25000)
    accumulation: int  # micro-batches per optimizer step; each holds batch_tokens / accumulation
    preset: str  # data preset used unless --preset says otherwise
    vocab_size: int | None  # shared BPE size; None = the preset's
    max_train_pairs: int | None  # training pairs kept after shuffling; None = all
    dev_pairs: int | None  # leading dev pairs scored for PPL and BLEU; None = all
    max_sentence_tokens: int  # longer training pairs are dropped
    log_every: int
    eval_every: int  # dev perplexity logged into metrics.jsonl
    checkpoint_every: int
    compile: bool  # torch.compile on a GPU (never on CPU)
    init: str = "xavier"  # one of INIT_RULES
    pad_multiple: int = 1  # each batch's lengths padded to a multiple of this (8 on a GPU: few distinct shapes)
    sdpa_backend: str = "efficient"  # scaled_dot_product_attention's kernel on a GPU (ablations/training/backends.py)
    precision: str | None = None  # one of PRECISIONS; None: the device's, bf16-weights on a GPU and fp32 on the CPU
    pack: bool = False  # several pairs per row on a GPU (ablations/data/batching.py): little padding at multiple 8

    def __post_init__(self) -> None:
        if self.init not in INIT_RULES:
            raise ValueError(f"init rule {self.init!r}: give one of {', '.join(INIT_RULES)}")
        if self.precision is not None and self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r}: give one of {', '.join(PRECISIONS)}")
        if self.sdpa_backend not in SDPA_BACKENDS:
            raise ValueError(f"attention backend {self.sdpa_backend!r}: give one of {', '.join(SDPA_BACKENDS)}")

    @property
    def scaled(self) -> bool:
        return self.scale != 1

    def replace(self, **changes: object) -> Budget:
        return dataclasses.replace(self, **changes)


# The Table 3 grid a 2-core CPU can train (docs/ablations.md has the studies behind it): sizes / 8, each row
# started with the stds of its paper-size counterpart (init paper-width), full Multi30k with a 2000-token BPE,
# 1500-token batches, eq. (3)'s shape peaking at 3e-3 after 500 steps, 4000 steps a row.
CPU = Budget(
    "cpu",
    scale=8,
    steps=4000,
    warmup=500,
    lr_peak=3e-3,
    batch_tokens=1500,
    accumulation=1,
    preset="multi30k",
    vocab_size=2000,
    max_train_pairs=None,
    dev_pairs=None,
    max_sentence_tokens=100,
    log_every=50,
    eval_every=250,
    checkpoint_every=250,
    compile=False,
    init="paper-width",
)


BUDGETS: dict[str, Budget] = {
    # The whole grid on 2 CPU cores in CI: every row trains, scores and records; far too little to translate.
    # Warmup = steps keeps eq. (3)'s rate low at d_model 64 (docs/ablations.md, "Budgets").
    "smoke": Budget(
        "smoke",
        scale=8,
        steps=24,
        warmup=24,
        lr_peak=None,
        batch_tokens=400,
        accumulation=1,
        preset="multi30k",
        vocab_size=1000,
        max_train_pairs=4000,
        dev_pairs=100,
        max_sentence_tokens=64,
        log_every=4,
        eval_every=12,
        checkpoint_every=8,
        compile=False,
    ),
    "cpu": CPU,
    # The first CPU grid (docs/ablations.md has its study and results): as cpu, but every row drew Xavier at its own
    # width, whose stds at d_model 64 are about 2.8x those of the paper's width; kept so that its results regenerate.
    "cpu-xavier": CPU.replace(name="cpu-xavier", init="xavier"),
    # Real sizes on one GPU, 1% of the paper's base steps for every row (big included): a first look. Warmup = steps,
    # so that the rate peaks at the last step (docs/ablations.md, "Budgets").
    "short": Budget(
        "short",
        scale=1,
        steps=1000,
        warmup=1000,
        lr_peak=None,
        batch_tokens=12000,
        accumulation=1,
        preset="news",
        vocab_size=None,
        max_train_pairs=None,
        dev_pairs=None,
        max_sentence_tokens=128,
        log_every=25,
        eval_every=250,
        checkpoint_every=250,
        compile=True,
        pad_multiple=8,
        pack=True,
    ),
    # The paper's recipe: 100K steps (big 300K) of 25000-token batches, warmup 4000, newstest2013 as dev.
    "paper": Budget(
        "paper",
        scale=1,
        steps=None,
        warmup=4000,
        lr_peak=None,
        batch_tokens=25000,
        accumulation=1,
        preset="wmt14",
        vocab_size=None,
        max_train_pairs=None,
        dev_pairs=None,
        max_sentence_tokens=256,
        log_every=100,
        eval_every=5000,
        checkpoint_every=1000,
        compile=True,
        pad_multiple=8,
        pack=True,
    ),
}


def budget(name: str) -> Budget:
    if name not in BUDGETS:
        raise ValueError(f"unknown budget {name!r}; valid budgets: {', '.join(BUDGETS)}")
    return BUDGETS[name]


def scale(cfg: TransformerConfig, b: Budget, vocab_size: int, what: str) -> TransformerConfig:
    """cfg with its sizes divided by the budget's scale and the BPE's vocabulary; `what` names cfg in the one-line
    ValueError for a size that does not divide."""
    scaled = {}
    for name in SCALED_FIELDS:
        value = getattr(cfg, name)
        if value % b.scale:
            raise ValueError(f"{what}: {name}={value} is not divisible by the {b.name} budget's scale {b.scale}")
        scaled[name] = value // b.scale
    return cfg.replace(**scaled, vocab_size=vocab_size)


def row_config(row: Table3Row, b: Budget, vocab_size: int) -> TransformerConfig:
    """The row's config (base + the row's changes), sizes divided by the budget's scale, the BPE's vocabulary, and
    the budget's init rule."""
    cfg = row.config()
    init_width = cfg.d_model if b.init == "paper-width" and b.scaled else 0
    return scale(cfg, b, vocab_size, f"row {row.name}").replace(
        init="normal" if b.init == "normal" else "xavier", init_width=init_width
    )


def as_recorded(b: Budget, config: dict) -> tuple[Budget, str]:
    """Budget b with the data settings a run's config.json recorded, and its preset: the data that run saw (`run
    --dev-pairs` or `--preset` change it from its budget's). A setting the config lacks keeps b's value."""
    data, train = config.get("data", {}), config.get("train", {})
    recorded = b.replace(
        vocab_size=config.get("config", {}).get("vocab_size", b.vocab_size),
        max_train_pairs=data.get("max_train_pairs", b.max_train_pairs),
        dev_pairs=data.get("dev_pairs", b.dev_pairs),
        max_sentence_tokens=train.get("max_sentence_tokens", b.max_sentence_tokens),
    )
    return recorded, config.get("preset", b.preset)


def row_steps(row: Table3Row, b: Budget) -> int:
    return b.steps if b.steps is not None else row.train_steps


def row_lr_peak(row: Table3Row, b: Budget) -> float | None:
    """The row's peak learning rate: the budget's peak (set for base's width) times sqrt(d_model_base / d_model_row),
    the d_model^-0.5 of eq. (3), so that rows C4, C5 and big keep the paper's width dependence."""
    if b.lr_peak is None:
        return None
    return b.lr_peak * math.sqrt(TransformerConfig().d_model / row.config().d_model)


@dataclass(frozen=True)
class TrainSettings:
    """Everything about a run's training and scoring that is not the model config (written to config.json)."""

    steps: int
    warmup: int
    batch_tokens: int  # source (and target) positions per optimizer step
    accumulation: int  # micro-batches per step
    max_sentence_tokens: int
    log_every: int
    eval_every: int
    checkpoint_every: int
    precision: str  # one of PRECISIONS: 'fp32', 'bf16' (autocast) or 'bf16-weights' (GPU only: precision.py)
    compile: bool  # torch.compile (GPU only)
    pad_multiple: int = 1  # batch lengths padded to a multiple of this
    sdpa_backend: str = "default"  # scaled_dot_product_attention's kernel (GPU only; 'default': torch's choice)
    pack: bool = False  # several pairs per row (GPU only): ablations/data/batching.py
    beam: int = 4
    alpha: float = 0.6
    extra_len: int = 50  # maximum output length = source length + extra_len
    adam_betas: tuple[float, float] = ADAM_BETAS
    adam_eps: float = ADAM_EPS
    lr_peak: float | None = None  # None: eq. (3)'s peak d_model^-0.5 * warmup^-0.5

    @property
    def micro_tokens(self) -> int:
        return max(1, self.batch_tokens // self.accumulation)

    @property
    def autocast(self) -> torch.dtype | None:
        """The dtype that evaluation and beam search run the (fp32) model under autocast."""
        return autocast_of(self.precision)

    @property
    def step_autocast(self) -> torch.dtype | None:
        """The dtype that the training step runs under autocast ('bf16' only: 'bf16-weights' needs none)."""
        return step_autocast(self.precision)

    def to_dict(self) -> dict:
        """The settings as config.json records them; the GPU-only fields only where set, so that a CPU run's record
        (and the hash that names its folder) is what it was before they existed."""
        unset = {"pad_multiple": 1, "sdpa_backend": "default", "pack": False}
        return {k: v for k, v in asdict(self).items() if k not in unset or unset[k] != v}


def precision_on(b: Budget, device: torch.device) -> str:
    """A run's precision: the budget's if it names one, else bf16 weights on a GPU and fp32 on the CPU."""
    return b.precision or (BF16_WEIGHTS if device.type == "cuda" else "fp32")


def settings_for(row: Table3Row, b: Budget, device: torch.device, accumulation: int | None = None) -> TrainSettings:
    """The row's training and scoring settings under the budget: compilation and packing on a GPU only; the budget's
    precision if it names one, else bf16 weights on a GPU and fp32 on the CPU."""
    gpu = device.type == "cuda"
    return TrainSettings(
        steps=row_steps(row, b),
        warmup=b.warmup,
        lr_peak=row_lr_peak(row, b),
        batch_tokens=b.batch_tokens,
        accumulation=accumulation or b.accumulation,
        max_sentence_tokens=b.max_sentence_tokens,
        log_every=b.log_every,
        eval_every=b.eval_every,
        checkpoint_every=b.checkpoint_every,
        precision=precision_on(b, device),
        compile=b.compile and gpu,
        pad_multiple=b.pad_multiple,
        sdpa_backend=b.sdpa_backend if gpu else "default",
        pack=b.pack and gpu,
    )


def select_rows(text: str) -> list[Table3Row]:
    """'all', or a comma list of row names (A2) and groups (A = A1..A4), in the paper's order."""
    rows = table3_rows()
    if text.strip() == "all":
        return rows
    names = {r.name for r in rows}
    wanted: set[str] = set()
    for item in (part.strip() for part in text.split(",") if part.strip()):
        group = [r.name for r in rows if r.group == item]
        if item in names:
            wanted.add(item)
        elif group:
            wanted.update(group)
        else:
            groups = sorted({r.group for r in rows if r.group not in names})
            raise ValueError(
                f"unknown row {item!r}; valid rows: all, {', '.join(r.name for r in rows)}; groups: {', '.join(groups)}"
            )
    if not wanted:
        raise ValueError("no rows selected; give --rows all or names such as base,A,C3")
    return [r for r in rows if r.name in wanted]
