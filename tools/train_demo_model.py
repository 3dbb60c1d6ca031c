#!/usr/bin/env python3
"""Trains deltaserve's bundled demo model, models/qwen3_5-demo (run on the GPU machine).

One run does everything, each stage guarded so that a late failure still leaves what exists:
  1. smoke test of the transformers API on a tiny random model (abort early if it breaks),
  2. corpus: the .py/.md/.rst/.txt files of the installed site-packages, deduplicated,
     split train/held-out by content hash,
  3. a byte-level BPE tokenizer (HF tokenizers: NFC, Qwen's Split regex + ByteLevel, Qwen's
     special tokens appended after the BPE vocabulary),
  4. a qwen3_5 model (transformers' Qwen3_5ForCausalLM: Gated DeltaNet + gated attention 3:1,
     num_v_heads > num_k_heads) trained jointly with its MTP head (architecture reference
     section 6: slot t takes the embedding of token t+1 and the final-normed hidden of t, at
     position t, and predicts token t+2), bf16 autocast, AdamW, cosine schedule over a time
     budget,
  5. held-out perplexity, MTP one-draft greedy acceptance,
  6. the checkpoint in the real wrapper layout (config.json of Qwen3_5ForConditionalGeneration,
     model.language_model.*, lm_head.weight, mtp.*), bf16, sharded, with tokenizer files,
  7. reference logits of transformers (fp32, from the saved bf16 checkpoint) for
     tests/data/demo_reference,
  8. a tarball of models/ and tests/ split into 15 MB pieces in --out.

Usage (on the GPU machine, from the repo root):
  PYTHONUNBUFFERED=1 python3 tools/train_demo_model.py --out $OUT --deadline 420
"""
import argparse
import glob
import hashlib
import json
import math
import os
import random
import shutil
import site
import subprocess
import sys
import sysconfig
import time
import traceback

T0 = time.time()
METRICS = {"stages": {}, "errors": []}
ARGS = None

# Qwen3.5's pre-tokenizer regex (architecture reference section 7).
QWEN_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
           r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# (content, special): special tokens are stripped by skip_special_tokens, the others are not.
ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
         ("<tool_call>", False), ("</tool_call>", False),
         ("<tool_response>", False), ("</tool_response>", False),
         ("<think>", False), ("</think>", False)]
EXTS = (".py", ".md", ".rst", ".txt")


def log(msg):
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def elapsed():
    return time.time() - T0


def save_metrics():
    if ARGS is None:
        return
    os.makedirs(ARGS.out, exist_ok=True)
    with open(os.path.join(ARGS.out, "metrics.json"), "w") as f:
        json.dump(METRICS, f, indent=1)


def stage(name, fatal):
    """Decorator: runs a stage, records its time and any error; a fatal error stops the run."""
    def wrap(fn):
        def run(*a, **k):
            t = time.time()
            log(f"== {name}")
            try:
                r = fn(*a, **k)
                METRICS["stages"][name] = {"ok": True, "seconds": round(time.time() - t, 1)}
                return r
            except Exception as e:  # noqa: BLE001 - recorded and reported
                tb = traceback.format_exc()
                log(f"!! {name} failed: {e}\n{tb}")
                METRICS["stages"][name] = {"ok": False, "seconds": round(time.time() - t, 1)}
                METRICS["errors"].append({"stage": name, "error": str(e), "traceback": tb[-4000:]})
                if fatal:
                    raise
                return None
            finally:
                save_metrics()
        return run
    return wrap


# --------------------------------------------------------------------------------------------
# Model definition helpers (torch / transformers imported lazily, after argument parsing).

def text_config_dict(vocab):
    """The demo model's text_config: hybrid 3:1, Hv/Hk = 3, head dims multiples of 16."""
    return dict(
        vocab_size=vocab, hidden_size=256, intermediate_size=768,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 2,
        num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        linear_num_key_heads=2, linear_num_value_heads=6,
        linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25,
                             mrope_section=[3, 3, 2], mrope_interleaved=True),
        rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=False,
        max_position_embeddings=4096, initializer_range=0.02,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)


def vision_config_dict(hidden):
    """A tiny vision tower so the checkpoint has the published wrapper layout (never used)."""
    return dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3,
                patch_size=2, temporal_patch_size=2, spatial_merge_size=2,
                out_hidden_size=hidden, num_position_embeddings=16)


def make_mtp_module(text, attn_impl):
    import torch
    from torch import nn
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    cfg = Qwen3_5TextConfig(**{**text, "layer_types": ["full_attention"], "num_hidden_layers": 1})
    cfg._attn_implementation = attn_impl
    H = cfg.hidden_size

    class MTPHead(nn.Module):
        """Parameter names give exactly the published mtp.* keys (no embed_tokens, no lm_head)."""

        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2 * H, H, bias=False)
            self.pre_fc_norm_embedding = hf.Qwen3_5RMSNorm(H, eps=cfg.rms_norm_eps)
            self.pre_fc_norm_hidden = hf.Qwen3_5RMSNorm(H, eps=cfg.rms_norm_eps)
            self.layers = nn.ModuleList([hf.Qwen3_5DecoderLayer(cfg, 0)])
            self.norm = hf.Qwen3_5RMSNorm(H, eps=cfg.rms_norm_eps)
            self.rotary = hf.Qwen3_5TextRotaryEmbedding(cfg)  # buffers only, not saved
            with torch.no_grad():
                for m in self.modules():
                    if isinstance(m, nn.Linear):
                        m.weight.normal_(0.0, cfg.initializer_range)

        def forward(self, embed_weight, h, next_ids):
            """h [B,n,H]: main final-normed hidden of slots 0..n-1; next_ids [B,n]: token t+1.
            Slot t sits at position t. Returns the MTP output hidden after mtp.norm."""
            B, n = next_ids.shape
            e = self.pre_fc_norm_embedding(nn.functional.embedding(next_ids, embed_weight))
            hh = self.pre_fc_norm_hidden(h)
            u = self.fc(torch.cat([e, hh], dim=-1))
            pos = torch.arange(n, device=u.device)[None].expand(B, n)
            cos_sin = self.rotary(u, pos[None].expand(3, B, n))
            mask = torch.ones(n, n, dtype=torch.bool, device=u.device).tril()[None, None]
            u = self.layers[0](u, position_embeddings=cos_sin, attention_mask=mask, position_ids=pos)
            return self.norm(u)

    return MTPHead()


def save_checkpoint(model, mtp, text, d, extra_files, max_shard="12MB"):
    """Wrapper layout, bf16, shards <= max_shard, mtp.* appended to the last shard."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    cfg = Qwen3_5Config(text_config=text, vision_config=vision_config_dict(text["hidden_size"]),
                        tie_word_embeddings=False)
    wrapper = Qwen3_5ForConditionalGeneration(cfg)
    lm = getattr(wrapper.model, "language_model", None)
    missing = lm.load_state_dict(model.model.state_dict(), strict=True)
    log(f"wrapper language_model load: {missing}")
    with torch.no_grad():
        wrapper.lm_head.weight.copy_(model.lm_head.weight.detach().cpu())
    wrapper = wrapper.to(torch.bfloat16)
    METRICS["checkpoint_params"] = {
        "all": sum(p.numel() for p in wrapper.parameters()) + sum(p.numel() for p in mtp.parameters()),
        "vision": sum(p.numel() for n, p in wrapper.named_parameters() if "visual" in n)}
    shutil.rmtree(d, ignore_errors=True)
    wrapper.save_pretrained(d, max_shard_size=max_shard)
    gen = os.path.join(d, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    mtp_sd = {f"mtp.{k}": v.detach().to(torch.bfloat16).cpu().contiguous() for k, v in mtp.state_dict().items()}
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        ij = json.load(open(index))
        last = sorted(set(ij["weight_map"].values()))[-1]
        p = os.path.join(d, last)
        t = load_file(p)
        t.update(mtp_sd)
        save_file(t, p, metadata={"format": "pt"})
        for k, v in mtp_sd.items():
            ij["weight_map"][k] = last
        ij.setdefault("metadata", {})["total_size"] = int(ij.get("metadata", {}).get("total_size", 0)) + sum(
            v.numel() * 2 for v in mtp_sd.values())
        json.dump(ij, open(index, "w"), indent=2, sort_keys=True)
    else:
        p = os.path.join(d, "model.safetensors")
        t = load_file(p)
        t.update(mtp_sd)
        save_file(t, p, metadata={"format": "pt"})
    for name, content in extra_files.items():
        with open(os.path.join(d, name), "w") as f:
            f.write(content)
    files = {f: os.path.getsize(os.path.join(d, f)) for f in sorted(os.listdir(d))}
    log(f"saved {d}: {files}")
    return files, mtp_sd


# --------------------------------------------------------------------------------------------

@stage("smoke", fatal=True)
def smoke():
    """A tiny random model through every transformers call the run makes, in seconds."""
    import torch
    import torch.nn.functional as F
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig, Qwen3_5ForConditionalGeneration
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__))))
    from make_reference import mtp_reference

    text = text_config_dict(320)
    text.update(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                layer_types=["linear_attention"] * 3 + ["full_attention"])
    cfg = Qwen3_5TextConfig(**text)
    cfg._attn_implementation = "sdpa"
    model = Qwen3_5ForCausalLM(cfg).cuda()
    mtp = make_mtp_module(text, "sdpa").cuda()
    x = torch.randint(0, 320, (2, 70), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        h = model.model(input_ids=x[:, :68], use_cache=False).last_hidden_state
        logits = model.lm_head(h)
        m = mtp(model.model.embed_tokens.weight, h, x[:, 1:69])
        ml = model.lm_head(m)
        loss = F.cross_entropy(logits.float().reshape(-1, 320), x[:, 1:69].reshape(-1)) + \
            F.cross_entropy(ml.float().reshape(-1, 320), x[:, 2:70].reshape(-1))
    loss.backward()
    d = "/tmp/demo_smoke"
    save_checkpoint(model, mtp, text, d, {}, max_shard="60KB")
    w = Qwen3_5ForConditionalGeneration.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    lm = w.model.language_model
    ids = x[:1, :40].cpu()
    with torch.no_grad():
        hf_logits = w(input_ids=ids).logits[0]
        hN = lm(input_ids=ids).last_hidden_state
        mref = mtp_reference(text, {f"mtp.{k}": v.to(torch.bfloat16).cpu() for k, v in mtp.state_dict().items()},
                             lm.embed_tokens.weight, hN, ids)
        # The same head on the GPU module (fp32, bf16-rounded weights) must agree with the reference.
        mtp_cpu = make_mtp_module(text, "sdpa")
        mtp_cpu.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in mtp.state_dict().items()})
        mine = mtp_cpu(lm.embed_tokens.weight, hN[:, :39], ids[:, 1:40])
    diff = float((mine - mref).abs().max())
    log(f"smoke ok: loss {float(loss):.3f}, hf logits {tuple(hf_logits.shape)}, mtp module vs reference max diff {diff:.2e}")
    assert diff < 1e-4, "training MTP module disagrees with the reference wiring"
    METRICS["smoke_mtp_diff"] = diff


@stage("corpus", fatal=True)
def gather_corpus():
    roots = set()
    paths = list(site.getsitepackages()) + [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    for p in paths:
        if p and os.path.isdir(p):
            roots.add(os.path.realpath(p))
    roots = sorted(roots)
    seen = set()
    files = []  # (sha1, rel, text)
    skipped = {"size": 0, "utf8": 0, "long_lines": 0, "duplicate": 0}
    for root in roots:
        for dp, dn, fn in os.walk(root):
            dn.sort()
            for f in sorted(fn):
                if not f.endswith(EXTS):
                    continue
                p = os.path.join(dp, f)
                try:
                    size = os.path.getsize(p)
                except OSError:
                    continue
                if size < 200 or size > 400_000:
                    skipped["size"] += 1
                    continue
                try:
                    raw = open(p, "rb").read()
                    txt = raw.decode("utf-8")
                except (OSError, UnicodeDecodeError):
                    skipped["utf8"] += 1
                    continue
                if max(len(line) for line in txt.split("\n")) > 1000:
                    skipped["long_lines"] += 1
                    continue
                h = hashlib.sha1(raw).hexdigest()
                if h in seen:
                    skipped["duplicate"] += 1
                    continue
                seen.add(h)
                files.append((h, os.path.relpath(p, root), txt))
    files.sort()  # by content hash: a deterministic shuffle
    cap = int(ARGS.max_corpus_mb * 1e6)
    total = sum(len(t.encode()) for _, _, t in files)
    kept, nbytes = [], 0
    for item in files:
        if nbytes >= cap:
            break
        kept.append(item)
        nbytes += len(item[2].encode())
    held = [x for x in kept if int(x[0][:8], 16) % 50 == 0]
    train = [x for x in kept if int(x[0][:8], 16) % 50 != 0]

    def summary(items):
        by_pkg, by_ext = {}, {}
        for _, rel, t in items:
            pkg = rel.split(os.sep)[0]
            ext = os.path.splitext(rel)[1]
            b = len(t.encode())
            by_pkg[pkg] = by_pkg.get(pkg, 0) + b
            by_ext.setdefault(ext, [0, 0])
            by_ext[ext][0] += 1
            by_ext[ext][1] += b
        top = sorted(by_pkg.items(), key=lambda kv: -kv[1])
        return {"files": len(items), "bytes": sum(len(t.encode()) for _, _, t in items),
                "by_ext_files_bytes": by_ext, "top_packages_bytes": top[:25], "n_packages": len(by_pkg)}

    METRICS["corpus"] = {
        "roots": roots, "extensions": list(EXTS), "file_size_range": [200, 400000],
        "rules": "utf-8 only, no line > 1000 chars, exact-content dedup by sha1, files ordered by sha1, "
                 f"first {ARGS.max_corpus_mb} MB kept; held-out = int(sha1[:8],16) % 50 == 0",
        "candidates_after_filters": len(files), "candidate_bytes": total, "skipped": skipped,
        "train": summary(train), "heldout": summary(held)}
    log(f"corpus: roots {roots}; {len(files)} unique files ({total/1e6:.1f} MB), kept {len(kept)} "
        f"({nbytes/1e6:.1f} MB): train {len(train)}, held-out {len(held)}; skipped {skipped}")
    return train, held


@stage("tokenizer", fatal=True)
def train_tokenizer(train, d):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False, fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=ARGS.vocab - len(ADDED), min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    sample, n = [], 0
    for _, _, t in train:
        if n >= ARGS.tok_train_mb * 1e6:
            break
        sample.append(t)
        n += len(t)
    tok.train_from_iterator(sample, trainer=trainer, length=len(sample))
    tok.add_special_tokens([AddedToken(c, special=True, normalized=False) for c, s in ADDED if s])
    tok.add_tokens([AddedToken(c, special=False, normalized=False) for c, s in ADDED if not s])
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    ids = {c: tok.token_to_id(c) for c, _ in ADDED}
    V = tok.get_vocab_size(with_added_tokens=True)
    log(f"tokenizer: trained on {len(sample)} files ({n/1e6:.1f} MB chars), vocab {V}, added {ids}")
    enc = tok.encode("def add(a, b):\n    return a + b\n<|im_end|>")
    log(f"  'def add(a, b):...' -> {enc.ids} {enc.tokens}")
    assert tok.decode(enc.ids, skip_special_tokens=False) == "def add(a, b):\n    return a + b\n<|im_end|>"
    METRICS["tokenizer"] = {"vocab_size": V, "added_token_ids": ids, "train_files": len(sample),
                            "train_chars": n}
    return tok, ids, V


def tokenizer_config_json(ids):
    tmpl_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "tokenizer",
                             "qwen3_8_style_template.jinja")
    try:
        template = open(tmpl_path).read()
    except OSError:
        template = None
        log("!! chat template file not found; tokenizer_config.json gets none (patch locally)")
    added = {str(ids[c]): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                           "single_word": False, "special": s} for c, s in ADDED}
    cj = {"add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
          "bos_token": None, "chat_template": template, "clean_up_tokenization_spaces": False,
          "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 4096,
          "pad_token": "<|endoftext|>", "split_special_tokens": False,
          "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": None}
    return json.dumps(cj, indent=2, ensure_ascii=False) + "\n"


def generation_config_json(ids):
    g = {"bos_token_id": ids["<|endoftext|>"], "do_sample": True,
         "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]], "pad_token_id": ids["<|endoftext|>"],
         "temperature": 0.7, "top_k": 20, "top_p": 0.95}
    return json.dumps(g, indent=2) + "\n"


@stage("encode", fatal=True)
def encode(tok, files, eot):
    import numpy as np
    texts = [t for _, _, t in files]
    out = []
    def fn(batch):
        try:
            return tok.encode_batch_fast(batch, add_special_tokens=False)
        except (AttributeError, TypeError):
            return tok.encode_batch(batch, add_special_tokens=False)
    for i in range(0, len(texts), 4096):
        for e in fn(texts[i:i + 4096]):
            out.append(np.asarray(e.ids, dtype=np.int32))
            out.append(np.asarray([eot], dtype=np.int32))
    arr = np.concatenate(out) if out else np.zeros(0, np.int32)
    return arr


@stage("train", fatal=False)
def train(state, train_ids, V):
    import torch
    import torch.nn.functional as F
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    text = text_config_dict(V)
    state["text"] = text
    cfg = Qwen3_5TextConfig(**text)
    cfg._attn_implementation = "sdpa"
    model = Qwen3_5ForCausalLM(cfg).cuda()
    mtp = make_mtp_module(text, "sdpa").cuda()
    state["model"], state["mtp"] = model, mtp
    n_main = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    emb = model.model.embed_tokens.weight.numel() + model.lm_head.weight.numel()
    METRICS["params"] = {"main": n_main, "mtp": n_mtp, "total_text_plus_mtp": n_main + n_mtp,
                         "embed_plus_lm_head": emb, "non_embedding_main": n_main - emb}
    log(f"params: main {n_main/1e6:.2f}M (embeddings+lm_head {emb/1e6:.2f}M), mtp {n_mtp/1e6:.2f}M")

    data = torch.from_numpy(train_ids.astype("int64")).cuda()
    N = data.numel()
    L, B = ARGS.seq, ARGS.batch
    params = list(model.parameters()) + list(mtp.parameters())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=ARGS.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    offs = torch.arange(L + 2, device="cuda")

    def batch(bs):
        starts = torch.randint(0, N - L - 3, (bs,), device="cuda")
        return data[starts[:, None] + offs[None]]

    def step_loss(w):
        x, y, y2 = w[:, :L], w[:, 1:L + 1], w[:, 2:L + 2]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = model.model(input_ids=x, use_cache=False).last_hidden_state
            logits = model.lm_head(h)
            lm = F.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1))
            m = mtp(model.model.embed_tokens.weight, h, y)
            ml = F.cross_entropy(model.lm_head(m).float().reshape(-1, V), y2.reshape(-1))
        return lm, ml

    budget = min(ARGS.train_seconds, ARGS.deadline - elapsed() - ARGS.reserve)
    log(f"training budget {budget:.0f}s, batch {B}x{L}, corpus {N} tokens")
    METRICS["train"] = {"budget_s": round(budget, 1), "batch": B, "seq": L, "lr": ARGS.lr,
                        "mtp_loss_weight": ARGS.mtp_weight, "train_tokens_available": int(N), "curve": []}
    model.train()
    mtp.train()
    step, tokens, t_start = 0, 0, None
    acc_lm, acc_ml, acc_n = 0.0, 0.0, 0
    while True:
        if step == 2:  # exclude the first steps (allocator warm-up) from the clock
            torch.cuda.synchronize()
            t_start = time.time()
        frac = 0.0 if t_start is None else (time.time() - t_start) / budget
        if frac >= 1.0:
            break
        lr = ARGS.lr * min(1.0, (step + 1) / ARGS.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
        for g in opt.param_groups:
            g["lr"] = lr
        lm, ml = step_loss(batch(B))
        loss = lm + ARGS.mtp_weight * ml
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        state["steps"] = step
        tokens += B * L
        acc_lm += float(lm)
        acc_ml += float(ml)
        acc_n += 1
        if step <= 3 or step % ARGS.log_every == 0:
            rate = (tokens - 2 * B * L) / max(time.time() - t_start, 1e-9) if t_start and step > 2 else 0
            log(f"step {step} loss {acc_lm/acc_n:.4f} mtp {acc_ml/acc_n:.4f} lr {lr:.2e} gnorm {float(gn):.2f} "
                f"{rate/1e3:.0f}k tok/s frac {frac:.2f} mem {torch.cuda.max_memory_allocated()/2**30:.1f}GiB")
            METRICS["train"]["curve"].append({"step": step, "tokens": tokens, "loss": round(acc_lm / acc_n, 4),
                                              "mtp_loss": round(acc_ml / acc_n, 4), "lr": lr})
            acc_lm, acc_ml, acc_n = 0.0, 0.0, 0
            if step % (ARGS.log_every * 4) == 0:
                save_metrics()
        if not math.isfinite(float(loss)):
            raise RuntimeError(f"loss is not finite at step {step}")
    torch.cuda.synchronize()
    wall = time.time() - (t_start or time.time())
    METRICS["train"].update(steps=step, tokens=tokens, seconds=round(wall, 1),
                            tokens_per_s=round((tokens - 2 * B * L) / max(wall, 1e-9)),
                            epochs=round(tokens / N, 3))
    log(f"trained {step} steps, {tokens/1e6:.1f}M tokens in {wall:.0f}s")


@stage("eval", fatal=False)
def evaluate(state, held_ids, tok, ids):
    import torch
    import torch.nn.functional as F
    model, mtp = state["model"], state["mtp"]
    V = model.config.vocab_size
    model.eval()
    mtp.eval()
    L = ARGS.seq
    data = torch.from_numpy(held_ids.astype("int64"))
    nwin = min((data.numel() - 2) // L, ARGS.eval_windows)
    # bytes per token (byte-level: one char of a BPE token is one byte; added tokens by content)
    vocab = tok.get_vocab(with_added_tokens=True)
    added = {c for c, _ in ADDED}
    nbytes = torch.zeros(V, dtype=torch.float64)
    for s, i in vocab.items():
        nbytes[i] = len(s.encode()) if s in added else len(s)
    tot = {"nll": 0.0, "mtp_nll": 0.0, "n": 0, "n_mtp": 0, "bytes": 0.0, "acc": 0, "mtp_acc": 0,
           "agree": 0, "n_agree": 0}
    with torch.no_grad():
        for i in range(0, nwin, 16):
            k = min(16, nwin - i)
            w = torch.stack([data[(i + j) * L:(i + j) * L + L + 2] for j in range(k)]).cuda()
            x, y, y2 = w[:, :L], w[:, 1:L + 1], w[:, 2:L + 2]
            h = model.model(input_ids=x, use_cache=False).last_hidden_state
            logits = model.lm_head(h).float()
            m = mtp(model.model.embed_tokens.weight, h, y)
            ml = model.lm_head(m).float()
            tot["nll"] += float(F.cross_entropy(logits.reshape(-1, V), y.reshape(-1), reduction="sum"))
            tot["mtp_nll"] += float(F.cross_entropy(ml.reshape(-1, V), y2.reshape(-1), reduction="sum"))
            tot["n"] += y.numel()
            tot["n_mtp"] += y2.numel()
            tot["bytes"] += float(nbytes[y.reshape(-1).cpu()].sum())
            tot["acc"] += int((logits.argmax(-1) == y).sum())
            tot["mtp_acc"] += int((ml.argmax(-1) == y2).sum())
            # teacher-forced: the draft of slot t against the target's own greedy choice at t+1
            tot["agree"] += int((ml[:, :-1].argmax(-1) == logits[:, 1:].argmax(-1)).sum())
            tot["n_agree"] += k * (L - 1)
    ev = {"windows": nwin, "tokens": tot["n"], "heldout_tokens_available": int(data.numel()),
          "ppl": math.exp(tot["nll"] / tot["n"]), "nll": tot["nll"] / tot["n"],
          "bits_per_byte": tot["nll"] / math.log(2) / tot["bytes"],
          "top1_acc": tot["acc"] / tot["n"], "mtp_ppl": math.exp(tot["mtp_nll"] / tot["n_mtp"]),
          "mtp_top1_acc_vs_text": tot["mtp_acc"] / tot["n_mtp"],
          "mtp_accept_teacher_forced": tot["agree"] / tot["n_agree"]}
    log(f"held-out: {ev}")
    METRICS["eval"] = ev
    save_metrics()

    # Greedy generation from held-out prompts, then one-draft greedy speculative acceptance:
    # after the target emits x_{t+1}, the MTP slot t (token x_{t+1}, hidden h_t, position t)
    # drafts x_{t+2}; it is accepted iff it equals the target's greedy token at t+1.
    P, G, nb = 128, 96, 32
    starts = [j * (data.numel() // nb) for j in range(nb)]
    seq = torch.stack([data[s:s + P] for s in starts]).cuda()
    with torch.no_grad():
        for _ in range(G):
            nxt = model(input_ids=seq, use_cache=False).logits[:, -1].argmax(-1)
            seq = torch.cat([seq, nxt[:, None]], dim=1)
        h = model.model(input_ids=seq, use_cache=False).last_hidden_state
        logits = model.lm_head(h).float()
        m = mtp(model.model.embed_tokens.weight, h[:, :-1], seq[:, 1:])
        ml = model.lm_head(m).float()
        draft = ml.argmax(-1)          # slot t drafts x_{t+2}
        target = logits.argmax(-1)     # position t+1 greedy
        t0, t1 = P - 1, P + G - 2      # slots whose x_{t+1} was emitted by the target: t+1 >= P
        acc = (draft[:, t0:t1] == target[:, t0 + 1:t1 + 1]).float().mean().item()
    METRICS["eval"]["mtp_accept_greedy_generation"] = acc
    METRICS["eval"]["greedy_generation_setup"] = f"{nb} held-out prompts x {P} tokens, {G} greedy tokens each"
    log(f"MTP one-draft acceptance on greedy generations: {acc:.4f}")
    samples = []
    for prompt in ["def add(a, b):\n", "import torch\n\n\nclass ", "# Copyright 2024\n", "The model"]:
        x = torch.tensor([tok.encode(prompt, add_special_tokens=False).ids], device="cuda")
        with torch.no_grad():
            for _ in range(64):
                nxt = model(input_ids=x, use_cache=False).logits[:, -1].argmax(-1)
                x = torch.cat([x, nxt[:, None]], dim=1)
                if int(nxt) in (ids["<|endoftext|>"], ids["<|im_end|>"]):
                    break
        samples.append(tok.decode(x[0].tolist(), skip_special_tokens=False))
        log(f"sample: {samples[-1]!r}")
    METRICS["samples_hf"] = samples


@stage("save", fatal=False)
def save(state, model_dir, ids):
    files, mtp_sd = save_checkpoint(state["model"], state["mtp"], state["text"], model_dir,
                                    {"tokenizer.json": open(state["tokenizer_path"]).read(),
                                     "tokenizer_config.json": tokenizer_config_json(ids),
                                     "generation_config.json": generation_config_json(ids)})
    state["mtp_sd"] = mtp_sd
    METRICS["checkpoint_files"] = files
    METRICS["checkpoint_bytes"] = sum(files.values())


@stage("reference", fatal=False)
def reference(state, model_dir, ref_dir, held_ids, tok, ids):
    """transformers fp32 (the saved bf16 checkpoint loaded back) on 2 held-out sequences."""
    import numpy as np
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers import Qwen3_5ForConditionalGeneration
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from make_reference import mtp_reference

    torch.set_num_threads(16)
    model = Qwen3_5ForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    lm = model.model.language_model
    mtp_w = {}
    for f in glob.glob(os.path.join(model_dir, "*.safetensors")):
        mtp_w.update({k: v for k, v in load_file(f).items() if k.startswith("mtp.")})
    text = state["text"]
    eot = ids["<|endoftext|>"]
    # Two held-out files' openings: 100 tokens right after an <|endoftext|>, with none inside.
    ends = np.nonzero(held_ids == eot)[0]
    chosen = []
    for e in ends[len(ends) // 3:]:
        w = held_ids[e + 1:e + 101]
        if len(w) == 100 and not (w == eot).any() and not np.isin(w, list(ids.values())).any():
            if not chosen or e > chosen[-1][0] + 1000:
                chosen.append((e, w))
        if len(chosen) == 2:
            break
    R = 12
    seqs, all_logits, all_mtp = [], [], []
    for _, w in chosen:
        ids_t = torch.tensor(w[None].astype("int64"))
        n = ids_t.shape[1]
        with torch.no_grad():
            logits = model(input_ids=ids_t).logits[0]
            h = lm(input_ids=ids_t).last_hidden_state
            assert torch.allclose(h[0] @ model.lm_head.weight.T, logits, atol=1e-4, rtol=1e-4)
            m = mtp_reference(text, mtp_w, lm.embed_tokens.weight, h, ids_t)
            mtp_logits = m[0] @ model.lm_head.weight.T
            s = ids_t.clone()
            greedy, margins = [], []
            for _ in range(24):
                last = model(input_ids=s).logits[0, -1]
                top = torch.topk(last, 2).values
                nxt = int(torch.argmax(last))
                greedy.append(nxt)
                margins.append(float(top[0] - top[1]))
                s = torch.cat([s, torch.tensor([[nxt]])], dim=1)
        rows = sorted({int(round(i * (n - 1) / (R - 1))) for i in range(R)})
        mrows = sorted({int(round(i * (n - 2) / (R - 1))) for i in range(R)})
        all_logits.append(logits[rows].numpy().astype(np.float32))
        all_mtp.append(mtp_logits[mrows].numpy().astype(np.float32))
        seqs.append({"text": tok.decode(w.tolist()), "prompt_ids": w.tolist(), "greedy_ids": greedy,
                     "greedy_margins": margins, "logit_rows": rows, "mtp_rows": mrows,
                     "greedy_text": tok.decode(greedy)})
        log(f"reference seq: {seqs[-1]['text'][:80]!r} -> {seqs[-1]['greedy_text']!r}, min margin {min(margins):.3f}")
    os.makedirs(ref_dir, exist_ok=True)
    np.save(os.path.join(ref_dir, "logits.npy"), np.concatenate(all_logits))
    np.save(os.path.join(ref_dir, "mtp_logits.npy"), np.concatenate(all_mtp))
    ref = {"what": "transformers fp32 logits of models/qwen3_5-demo (its bf16 weights loaded with "
                   "dtype=float32, eager attention) on two held-out sequences; logits.npy stacks the "
                   "logit_rows of each sequence, mtp_logits.npy the mtp_rows of the MTP head (slot i: "
                   "token i+1, final-normed hidden of i, position i), built as tools/make_reference.py does",
           "transformers": transformers.__version__, "torch": torch.__version__,
           "vocab_size": int(model.config.text_config.vocab_size), "sequences": seqs}
    json.dump(ref, open(os.path.join(ref_dir, "reference.json"), "w"), indent=1)
    METRICS["reference"] = {"files": {f: os.path.getsize(os.path.join(ref_dir, f)) for f in os.listdir(ref_dir)}}


@stage("check_autotokenizer", fatal=False)
def check_autotokenizer(model_dir, tok):
    from transformers import AutoTokenizer
    at = AutoTokenizer.from_pretrained(model_dir)
    s = "def add(a, b):\n    return a + b  # 123 ünïcödé\n"
    same = at(s, add_special_tokens=False)["input_ids"] == tok.encode(s, add_special_tokens=False).ids
    r = at.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True,
                               enable_thinking=False)
    log(f"AutoTokenizer agrees with tokenizer.json: {same}; chat render: {r!r}")
    METRICS["autotokenizer_agrees"] = same


@stage("recover_tokenizer", fatal=False)
def recover_tokenizer(tok, train_ids, held_ids, ids):
    """Checks that this run's tokenizer is the one an earlier run trained its model with: the same
    token counts, the same encoding of a probe string, and the reference windows found verbatim
    in the held-out token stream."""
    import numpy as np
    exp = json.load(open(ARGS.recover_tokenizer))
    ref = json.load(open(exp["reference"]))
    checks = {"train_tokens": int(train_ids.size) == exp["train_tokens"],
              "heldout_tokens": int(held_ids.size) == exp["heldout_tokens"],
              "probe": tok.encode(exp["probe_text"], add_special_tokens=False).ids == exp["probe_ids"],
              "added_ids": {k: int(v) for k, v in ids.items()} == exp["added_token_ids"]}
    for i, sq in enumerate(ref["sequences"]):
        w = np.asarray(sq["prompt_ids"], dtype=held_ids.dtype)
        starts = np.nonzero(held_ids[: held_ids.size - w.size + 1] == w[0])[0]
        checks[f"reference_seq_{i}"] = any(np.array_equal(held_ids[s:s + w.size], w) for s in starts)
    log(f"tokenizer recovery checks: {checks}")
    METRICS["recover_checks"] = checks
    return all(checks.values())


def finalize(work):
    """Tarball of models/ and tests/ under work, split into 15 MB pieces in --out."""
    save_metrics()
    try:
        tar = os.path.join("/tmp", "demo_model.tar")
        parts = [p for p in ("models", "tests") if os.path.isdir(os.path.join(work, p))]
        subprocess.run(["tar", "-C", work, "-cf", tar] + parts, check=True)
        subprocess.run(["split", "-b", "15M", "-d", tar, os.path.join(ARGS.out, "demo_model.tar.part-")], check=True)
        sha = hashlib.sha256(open(tar, "rb").read()).hexdigest()
        METRICS["tarball"] = {"bytes": os.path.getsize(tar), "sha256": sha,
                              "parts": sorted(os.listdir(ARGS.out))}
        log(f"tarball {os.path.getsize(tar)} bytes sha256 {sha}")
    except Exception as e:  # noqa: BLE001
        log(f"!! finalize failed: {e}")
        METRICS["errors"].append({"stage": "finalize", "error": str(e)})
    METRICS["total_seconds"] = round(elapsed(), 1)
    save_metrics()


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--work", default="/tmp/demo_work")
    ap.add_argument("--deadline", type=float, default=420, help="seconds from start by which all must be done")
    ap.add_argument("--reserve", type=float, default=75, help="seconds kept for stages after training")
    ap.add_argument("--train-seconds", type=float, default=240)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=48)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--eval-windows", type=int, default=256)
    ap.add_argument("--max-corpus-mb", type=float, default=120)
    ap.add_argument("--tok-train-mb", type=float, default=30)
    ap.add_argument("--recover-tokenizer", default="",
                    help="JSON of an earlier run's token counts: rebuild its tokenizer, verify, and only "
                         "retrain the model if it differs")
    ARGS = ap.parse_args()
    os.makedirs(ARGS.out, exist_ok=True)
    METRICS["args"] = vars(ARGS)
    work = ARGS.work
    model_dir = os.path.join(work, "models", "qwen3_5-demo")
    ref_dir = os.path.join(work, "tests", "data", "demo_reference")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(model_dir)
    os.makedirs(ARGS.out, exist_ok=True)
    import numpy as np
    import torch
    import transformers
    import tokenizers
    METRICS["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                           "tokenizers": tokenizers.__version__, "python": sys.version.split()[0],
                           "gpu": torch.cuda.get_device_name(0)}
    log(f"versions {METRICS['versions']}")
    state = {}
    try:
        if not ARGS.recover_tokenizer:
            smoke()
        train_files, held_files = gather_corpus()
        tok, ids, V = train_tokenizer(train_files, work)
        state["tokenizer_path"] = os.path.join(work, "tokenizer.json")
        t = time.time()
        train_ids = encode(tok, train_files, ids["<|endoftext|>"])
        held_ids = encode(tok, held_files, ids["<|endoftext|>"])
        METRICS["tokens"] = {"train": int(train_ids.size), "heldout": int(held_ids.size),
                             "train_bytes_per_token": METRICS["corpus"]["train"]["bytes"] / max(1, train_ids.size)}
        log(f"encoded: train {train_ids.size} tokens, held-out {held_ids.size} in {time.time()-t:.0f}s")
        del train_files
        if ARGS.recover_tokenizer and recover_tokenizer(tok, train_ids, held_ids, ids):
            shutil.copy(state["tokenizer_path"], os.path.join(ARGS.out, "tokenizer.json"))
            log("tokenizer recovered: identical to the one the model was trained with")
            METRICS["total_seconds"] = round(elapsed(), 1)
            save_metrics()
            return
        train(state, train_ids, V)
        if state.get("steps", 0) > 0:
            evaluate(state, held_ids, tok, ids)
            save(state, model_dir, ids)
            if os.path.exists(os.path.join(model_dir, "config.json")):
                reference(state, model_dir, ref_dir, held_ids, tok, ids)
                check_autotokenizer(model_dir, tok)
    except Exception as e:  # noqa: BLE001
        log(f"!! stopped: {e}")
    finally:
        finalize(work)
    log("done")


if __name__ == "__main__":
    main()
