"""`python -m model info SPEC [--json]` | `python -m model list`: the resolved config and the parameter count of any model spec."""

from __future__ import annotations

import argparse
import json
import sys

import torch

from model.params import count_parameters
from model.registry import SpecError, default_spec, load_model, registered


def info(spec: str) -> dict[str, object]:
    with torch.device("meta"):  # counts shapes without allocating the weights
        model = load_model(spec)
    counts = count_parameters(model.parameter_groups())
    return {
        "spec": spec,
        "adapter": type(model).__module__ + "." + type(model).__qualname__,
        "config": model.config.to_dict(),
        "params": counts["total"],
        "params_by_part": {k: v for k, v in counts.items() if k != "total"},
        "unsupported": dict(model.unsupported),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_info = sub.add_parser("info", help="print the resolved config and parameter count of a model spec")
    p_info.add_argument(
        "spec",
        nargs="?",
        default=None,
        help="model spec (default: $AIAYN_MODEL or reference); see `python -m model list`",
    )
    p_info.add_argument("--json", action="store_true", help="print one JSON object")
    sub.add_parser("list", help="print the registered model names, one per line with what each is")
    args = parser.parse_args(argv)
    if args.command == "list":
        for name, entry in registered().items():
            print(f"{name:<10} {entry.about}")
        return 0
    try:
        result = info(args.spec or default_spec())
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"model   {result['spec']}  ({result['adapter']})")
    for key, value in result["config"].items():
        print(f"  {key:<16} {value}")
    print(f"params  {result['params']:,}  ({result['params'] / 1e6:.1f}M)")
    for part, n in result["params_by_part"].items():
        print(f"  {part:<16} {n:,}")
    for cap, why in result["unsupported"].items():
        print(f"lacks   {cap}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
