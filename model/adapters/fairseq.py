"""fairseq's module names, which HuggingFace's BART, Marian and FSMT keep, in the paper's layout: the weights of each
layer (paper_params) and the sub-layers' hooks (paper_sublayers), shared by model/adapters/hf.py and hf_fsmt.py."""

from __future__ import annotations

from torch import nn

from model.paper_params import DecoderLayer, EncoderLayer, FeedForward, MultiHead, layer_norm, multi_head


def fairseq_layers(
    encoder_layers: nn.ModuleList, decoder_layers: nn.ModuleList, h: int
) -> tuple[tuple[EncoderLayer, ...], tuple[DecoderLayer, ...]]:
    """The paper's layers from fairseq's module names, which BART, Marian and FSMT keep: q_proj, k_proj, v_proj,
    out_proj are W^Q, W^K, W^V, W^O as (out, in) Linears with biases; fc1, fc2 eq. (2)'s maps; self_attn_layer_norm,
    encoder_attn_layer_norm and final_layer_norm follow the sub-layers."""

    def mha(a: nn.Module) -> MultiHead:
        linears = (a.q_proj, a.k_proj, a.v_proj, a.out_proj)
        return multi_head(*(m.weight for m in linears), h, tuple(m.bias for m in linears))

    def ffn(layer: nn.Module) -> FeedForward:
        return FeedForward(layer.fc1.weight.T, layer.fc1.bias, layer.fc2.weight.T, layer.fc2.bias)

    encoder = tuple(
        EncoderLayer(mha(la.self_attn), layer_norm(la.self_attn_layer_norm), ffn(la), layer_norm(la.final_layer_norm))
        for la in encoder_layers
    )
    decoder = tuple(
        DecoderLayer(
            mha(la.self_attn),
            layer_norm(la.self_attn_layer_norm),
            mha(la.encoder_attn),
            layer_norm(la.encoder_attn_layer_norm),
            ffn(la),
            layer_norm(la.final_layer_norm),
        )
        for la in decoder_layers
    )
    return encoder, decoder


def fairseq_sublayer_hooks(
    encoder: nn.Module, decoder: nn.Module, output: nn.Module
) -> dict[str, tuple[nn.Module, str]]:
    """The sites of model.paper_params.sites on fairseq's module names, for sublayer_recorder; `output` is the
    pre-softmax linear, whose input is the decoder's output (attention is called with keyword arguments)."""
    hooks: dict[str, tuple[nn.Module, str]] = {}
    for name, stack in (("encoder", encoder), ("decoder", decoder)):
        hooks[f"{name}.embedded"] = (stack.layers[0], "input")
        for i, layer in enumerate(stack.layers):
            p = f"{name}.{i}."
            hooks |= {p + "self_attention.input": (layer.self_attn, "input"), p + "ffn.input": (layer.fc1, "input")}
            hooks |= {p + "self_attention": (layer.self_attn, "output"), p + "ffn": (layer.fc2, "output")}
            hooks[p + "norm_1"] = (layer.self_attn_layer_norm, "output")
            hooks[p + ("norm_2" if name == "encoder" else "norm_3")] = (layer.final_layer_norm, "output")
            if name == "decoder":
                a = layer.encoder_attn
                hooks |= {p + "cross_attention.input": (a, "input"), p + "cross_attention.memory": (a, "memory")}
                hooks |= {p + "cross_attention": (a, "output"), p + "norm_2": (layer.encoder_attn_layer_norm, "output")}
    hooks["decoder.output"] = (output, "input")
    return hooks
