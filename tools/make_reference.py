#!/usr/bin/env python3
"""Writes the tiny qwen3_5 reference fixtures under tests/data/ (run on the GPU machine).

Each fixture is a random checkpoint folder in a real published layout, saved in bf16, plus
what Hugging Face transformers computes from those bf16-rounded weights in fp32 on the CPU:
  reference.json   prompt ids, greedy continuation with its top-2 margins, the fixture's intent
  logits.npy       float32 [n_prompt, vocab]: logits of every prompt position
  mtp_logits.npy   float32 [n_prompt-1, vocab]: the MTP head's logits (only where mtp.* exists)
HF has no MTP module; the MTP reference is built from HF's own decoder layer and norms, wired as
../shared/reference/qwen3_5-architecture.md section 6 describes (vLLM's Qwen3_5MTP).

Usage: python3 tools/make_reference.py --out tests/data [--only NAME ...]
"""
import argparse
import json
import os
import shutil

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import transformers
from transformers import Qwen3_5Config, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration, Qwen3_5TextConfig
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

GREEDY_TOKENS = 24

# Every fixture changes something the others keep fixed. Prompts longer than 64 tokens cross
# the chunk boundary of the chunked gated-delta-rule form.
FIXTURES = [
    dict(
        name="tiny_wrapper_mtp",
        intent="wrapper layout, explicit layer_types (L,L,F,L,F), Hv/Hk=3, dk!=dv, GQA 4:2, "
        "head_dim 24 (partial rotary 0.25 -> 6 dims), single safetensors file, MTP head",
        wrapper=True, mtp=True, shards=False, layout="explicit",
        text=dict(vocab_size=320, hidden_size=64, intermediate_size=96,
                  layer_types=["linear_attention", "linear_attention", "full_attention",
                               "linear_attention", "full_attention"],
                  num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                  linear_num_key_heads=2, linear_num_value_heads=6,
                  linear_key_head_dim=16, linear_value_head_dim=24, linear_conv_kernel_dim=4,
                  rope_parameters=dict(rope_type="default", rope_theta=10000000.0,
                                       partial_rotary_factor=0.25, mrope_section=[1, 1, 1],
                                       mrope_interleaved=True)),
        prompt_len=80, seed=1),
    dict(
        name="tiny_causal_sharded",
        intent="text-only Qwen3_5ForCausalLM layout, full_attention_interval=2 (no layer_types), "
        "flattened rope fields, sharded safetensors with index, Hv=Hk, head_dim 40 with partial "
        "rotary 0.5, MHA (no GQA), no MTP",
        wrapper=False, mtp=False, shards=True, layout="interval",
        text=dict(vocab_size=300, hidden_size=48, intermediate_size=80,
                  layer_types=["linear_attention", "full_attention", "linear_attention",
                               "full_attention"],
                  num_attention_heads=3, num_key_value_heads=3, head_dim=40,
                  linear_num_key_heads=3, linear_num_value_heads=3,
                  linear_key_head_dim=20, linear_value_head_dim=20, linear_conv_kernel_dim=4,
                  rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                       partial_rotary_factor=0.5)),
        prompt_len=70, seed=2),
    dict(
        name="tiny_w4a16",
        intent="compressed-tensors pack-quantized W4A16 (int4, group 128, bf16 scales, a third of "
        "them negative) on every linear but lm_head, in_proj_a/b and mtp.*; wrapper layout, "
        "hidden 128 and Hv*dv 384 so groups are whole, down_proj with two groups per row, dk 32 != "
        "dv 64, MTP head in bf16",
        wrapper=True, mtp=True, shards=False, layout="explicit", quant=True,
        text=dict(vocab_size=320, hidden_size=128, intermediate_size=256,
                  layer_types=["linear_attention", "linear_attention", "linear_attention",
                               "full_attention"],
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  linear_num_key_heads=2, linear_num_value_heads=6,
                  linear_key_head_dim=32, linear_value_head_dim=64, linear_conv_kernel_dim=4,
                  rope_parameters=dict(rope_type="default", rope_theta=10000000.0,
                                       partial_rotary_factor=0.25, mrope_section=[2, 1, 1],
                                       mrope_interleaved=True)),
        prompt_len=72, seed=4),
    dict(
        name="tiny_wrapper_long",
        intent="wrapper layout, attention first (F,L,L,L,F,L), Hv/Hk=3 with 3 key heads, GQA 6:2, "
        "head_dim 32 (rotary 8 dims), 150-token prompt across three GDN chunks, MTP head",
        wrapper=True, mtp=True, shards=False, layout="explicit",
        text=dict(vocab_size=352, hidden_size=96, intermediate_size=160,
                  layer_types=["full_attention", "linear_attention", "linear_attention",
                               "linear_attention", "full_attention", "linear_attention"],
                  num_attention_heads=6, num_key_value_heads=2, head_dim=32,
                  linear_num_key_heads=3, linear_num_value_heads=9,
                  linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                  rope_parameters=dict(rope_type="default", rope_theta=1000000.0,
                                       partial_rotary_factor=0.25, mrope_section=[2, 1, 1],
                                       mrope_interleaved=True)),
        prompt_len=150, seed=3),
]


QUANT_TARGETS = ("in_proj_qkv", "in_proj_z", "out_proj", "q_proj", "k_proj", "v_proj", "o_proj",
                 "gate_proj", "up_proj", "down_proj")
GROUP = 128


def quantize_w4a16(model, d, gen):
    """Quantizes the target linears of the fp32 `model` in place (weights become exactly the
    dequantised values) and rewrites d/model.safetensors in compressed-tensors pack-quantized
    form; adds quantization_config to d/config.json."""
    packed = {}
    with torch.no_grad():
        for name, mod in model.named_modules():
            if not isinstance(mod, torch.nn.Linear) or not name.endswith(QUANT_TARGETS):
                continue
            if "visual" in name or name.startswith("mtp") or name.endswith("lm_head"):
                continue
            W = mod.weight.float()
            N, K = W.shape
            assert K % GROUP == 0, name
            Wg = W.reshape(N, K // GROUP, GROUP)
            scale = (Wg.abs().amax(dim=-1) / 7.0).clamp_min(1e-4).to(torch.bfloat16).float()
            flip = torch.rand(scale.shape, generator=gen) < 0.33  # signed scales occur in the wild
            scale = torch.where(flip, -scale, scale)
            q = torch.clamp(torch.round(Wg / scale[..., None]), -8, 7)
            mod.weight.copy_((q * scale[..., None]).reshape(N, K))
            nib = (q.reshape(N, K) + 8).to(torch.int64).numpy().astype(np.uint32).reshape(N, K // 8, 8)
            words = np.zeros((N, K // 8), dtype=np.uint32)
            for j in range(8):
                words |= nib[:, :, j] << np.uint32(4 * j)
            packed[name] = dict(weight_packed=torch.from_numpy(words.view(np.int32).copy()),
                                weight_scale=scale.to(torch.bfloat16),
                                weight_shape=torch.tensor([N, K], dtype=torch.int64))
    p = os.path.join(d, "model.safetensors")
    t = load_file(p)
    for name, parts in packed.items():
        del t[name + ".weight"]
        for k, v in parts.items():
            t[name + "." + k] = v
    save_file(t, p, metadata={"format": "pt"})
    cp = os.path.join(d, "config.json")
    cj = json.load(open(cp))
    cj["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {
            "targets": ["Linear"], "input_activations": None, "output_activations": None,
            "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                        "group_size": GROUP, "actorder": None, "dynamic": False,
                        "observer": "minmax"}}},
        "ignore": ["lm_head", "re:.*visual.*", "re:.*linear_attn.in_proj_a$",
                   "re:.*linear_attn.in_proj_b$", "re:^mtp.*"],
        "kv_cache_scheme": None}
    json.dump(cj, open(cp, "w"), indent=2, sort_keys=True)
    return len(packed)


def perturb(model, gen):
    """Replaces every parameter with random values of a realistic scale, so no default hides a bug."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "visual" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
            elif name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(-1.5, 1.5, generator=gen))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.7)
            elif "conv1d" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif name.endswith("linear_attn.norm.weight"):  # plain multiplier
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) * 0.2)
            elif "norm" in name:  # zero-centred (1 + w) norms
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            elif p.dim() == 2:  # linears [out, in]
                p.copy_(torch.randn(p.shape, generator=gen) * (1.5 / p.shape[1] ** 0.5))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


def mtp_tensors(tc, gen):
    """Random MTP weights in the published key layout (HF ignores mtp.* on load)."""
    H, I = tc.hidden_size, tc.intermediate_size
    nq, nkv, hd = tc.num_attention_heads, tc.num_key_value_heads, tc.head_dim
    lin = lambda o, i: torch.randn(o, i, generator=gen) * (1.5 / i ** 0.5)
    nrm = lambda n: torch.randn(n, generator=gen) * 0.2
    t = {
        "mtp.fc.weight": lin(H, 2 * H),
        "mtp.pre_fc_norm_embedding.weight": nrm(H),
        "mtp.pre_fc_norm_hidden.weight": nrm(H),
        "mtp.norm.weight": nrm(H),
        "mtp.layers.0.input_layernorm.weight": nrm(H),
        "mtp.layers.0.post_attention_layernorm.weight": nrm(H),
        "mtp.layers.0.self_attn.q_proj.weight": lin(2 * nq * hd, H),
        "mtp.layers.0.self_attn.k_proj.weight": lin(nkv * hd, H),
        "mtp.layers.0.self_attn.v_proj.weight": lin(nkv * hd, H),
        "mtp.layers.0.self_attn.o_proj.weight": lin(H, nq * hd),
        "mtp.layers.0.self_attn.q_norm.weight": nrm(hd),
        "mtp.layers.0.self_attn.k_norm.weight": nrm(hd),
        "mtp.layers.0.mlp.gate_proj.weight": lin(I, H),
        "mtp.layers.0.mlp.up_proj.weight": lin(I, H),
        "mtp.layers.0.mlp.down_proj.weight": lin(H, I),
    }
    return {k: v.to(torch.bfloat16) for k, v in t.items()}


def mtp_reference(text, mtp, embed, h_final, ids):
    """MTP hidden for slots i = 0..n-2: token ids[i+1], hidden h_final[i], position i."""
    cfg = Qwen3_5TextConfig(**{**text, "layer_types": ["full_attention"], "num_hidden_layers": 1})
    cfg._attn_implementation = "eager"
    w = {k: v.float() for k, v in mtp.items()}
    layer = hf.Qwen3_5DecoderLayer(cfg, 0).float().eval()
    layer.load_state_dict({k[len("mtp.layers.0."):]: v for k, v in w.items() if k.startswith("mtp.layers.0.")})
    def norm(key):
        m = hf.Qwen3_5RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        m.weight.data.copy_(w[key])
        return m
    rotary = hf.Qwen3_5TextRotaryEmbedding(cfg)
    n = ids.shape[1] - 1
    with torch.no_grad():
        e = norm("mtp.pre_fc_norm_embedding.weight")(embed[ids[:, 1:]])
        h = norm("mtp.pre_fc_norm_hidden.weight")(h_final[:, :n])
        u = torch.cat([e, h], dim=-1) @ w["mtp.fc.weight"].T
        pos = torch.arange(n)[None, :]
        cos_sin = rotary(u, pos[None].expand(3, 1, n))
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        u = layer(u, position_embeddings=cos_sin, attention_mask=mask, position_ids=pos)
        m = norm("mtp.norm.weight")(u)
    return m


def build(fx, out_root):
    gen = torch.Generator().manual_seed(fx["seed"])
    torch.manual_seed(fx["seed"])
    text = dict(fx["text"])
    text.update(num_hidden_layers=len(text["layer_types"]), rms_norm_eps=1e-6, hidden_act="silu",
                tie_word_embeddings=False, max_position_embeddings=4096,
                bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if fx["wrapper"]:
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3,
                      patch_size=2, temporal_patch_size=2, spatial_merge_size=2,
                      out_hidden_size=text["hidden_size"], num_position_embeddings=16)
        cfg = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)
        model = Qwen3_5ForConditionalGeneration(cfg)
        tc = cfg.text_config
    else:
        cfg = Qwen3_5TextConfig(**text)
        model = Qwen3_5ForCausalLM(cfg)
        tc = cfg
    cfg._attn_implementation = "eager"
    tc._attn_implementation = "eager"
    perturb(model, gen)
    model = model.to(torch.bfloat16)

    d = os.path.join(out_root, fx["name"])
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d, max_shard_size="100KB" if fx["shards"] else "100GB")
    for extra in ("generation_config.json",):
        p = os.path.join(d, extra)
        if os.path.exists(p):
            os.remove(p)

    mtp = None
    if fx["mtp"]:
        mtp = mtp_tensors(tc, gen)
        p = os.path.join(d, "model.safetensors")
        t = load_file(p)
        t.update(mtp)
        save_file(t, p, metadata={"format": "pt"})

    # fp32 reference: the saved bf16 checkpoint loaded back in fp32, as a user would load it.
    # (Casting the in-memory model instead would also round the RoPE inv_freq buffer to bf16.)
    cls = Qwen3_5ForConditionalGeneration if fx["wrapper"] else Qwen3_5ForCausalLM
    model = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    tc = model.config.text_config if fx["wrapper"] else model.config
    if fx.get("quant"):
        n_quant = quantize_w4a16(model, d, gen)
        print(f"{fx['name']}: {n_quant} linears quantized to W4A16")
    g2 = torch.Generator().manual_seed(100 + fx["seed"])
    ids = torch.randint(0, tc.vocab_size, (1, fx["prompt_len"]), generator=g2)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
        lm = getattr(model.model, "language_model", model.model)
        h_final = lm(input_ids=ids).last_hidden_state
        assert torch.allclose(h_final[0] @ model.lm_head.weight.T, logits, atol=1e-4, rtol=1e-4)
        seq = ids.clone()
        greedy, margins = [], []
        for _ in range(GREEDY_TOKENS):
            last = model(input_ids=seq).logits[0, -1]
            top = torch.topk(last, 2).values
            nxt = int(torch.argmax(last))
            greedy.append(nxt)
            margins.append(float(top[0] - top[1]))
            seq = torch.cat([seq, torch.tensor([[nxt]])], dim=1)
    np.save(os.path.join(d, "logits.npy"), logits.numpy().astype(np.float32))
    ref = dict(intent=fx["intent"], transformers=transformers.__version__, torch=torch.__version__,
               prompt_ids=ids[0].tolist(), greedy_ids=greedy, greedy_margins=margins,
               logits_std=float(logits.std()))
    if mtp is not None:
        m = mtp_reference(text, mtp, lm.embed_tokens.weight, h_final, ids)
        mtp_logits = (m[0] @ model.lm_head.weight.T).detach().numpy().astype(np.float32)
        np.save(os.path.join(d, "mtp_logits.npy"), mtp_logits)
        ref["mtp_logits_std"] = float(mtp_logits.std())
    # Rewrite config.json in the variant this fixture exercises (same model, other spelling).
    cp = os.path.join(d, "config.json")
    cj = json.load(open(cp))
    tcj = cj.get("text_config", cj)
    if fx["layout"] == "interval":
        del tcj["layer_types"]
        tcj["full_attention_interval"] = 2
        rp = tcj.pop("rope_parameters")
        tcj["rope_theta"] = rp["rope_theta"]
        tcj["partial_rotary_factor"] = rp["partial_rotary_factor"]
    json.dump(cj, open(cp, "w"), indent=2, sort_keys=True)

    json.dump(ref, open(os.path.join(d, "reference.json"), "w"), indent=1)
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    print(f"{fx['name']}: {size/1e3:.0f} kB, logits std {ref['logits_std']:.3f}, "
          f"min greedy margin {min(margins):.3f}, files {sorted(os.listdir(d))}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data")
    ap.add_argument("--only", nargs="*", help="fixture names to (re)build; default all")
    args = ap.parse_args()
    torch.set_num_threads(8)
    for fx in FIXTURES:
        if not args.only or fx["name"] in args.only:
            build(fx, args.out)


if __name__ == "__main__":
    main()
