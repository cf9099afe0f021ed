"""Train the bundled demo model: a small RWKV-7 on the King James Bible, on the CPU.

The King James text (plain and as chats) is the bulk of the data; a share of synthetic chats
in the RWKV7-G1 format (thinking, short JSON answers, tool calls with their observations,
tools/demo_data.py) teaches the formats the server's chat route renders.

    apt-get install -y bible-kjv-text             # the text (see tools/demo_data.py)
    .venv/bin/pip install torch==2.13.0           # a tool dependency only, never a runtime one
    nice -n 19 .venv/bin/python tools/train_demo.py           # writes assets/models/demo.*

Outputs (in --out, default assets/models/):
  demo.st              the model: official RWKV-7 tensor names and shapes, fp16 safetensors
  demo_vocab.txt       its vocabulary, a subset of the RWKV World vocabulary, World .txt format
  demo_words.txt.gz    the training text's distinct words (for the tests' real-word check)
  demo_train_log.txt   this run's log: parameters, tokens seen, time, held-out loss vs unigram

The model here is our own torch transcription of rwkv-spec §2.5 (the v7 time mix) with the
chunked WKV of §3.2, so a whole context trains as a few matrix products per chunk instead of
one small update per token. The script checks that transcription twice: the chunked WKV
against the sequential recurrence before training, and the trained model against our numpy
engine loading the written file after training.
"""

from __future__ import annotations

import argparse
import gzip
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import demo_data

REPO = Path(__file__).resolve().parents[1]
DECAY_SCALE = math.exp(-0.5)  # v7 decay = exp(−e^{−1/2}·σ(w)) ∈ (0.545, 1)


# ---------------------------------------------------------------------------------------------
# WKV-7. State S per head is N×N, value-major (S[i = value, j = key]); one token does
#   S ← S·(diag(w) + a bᵀ) + v kᵀ,   y = S r
# with a = −κ̂, b = κ̂⊙α (rwkv-spec §2.5). All tensors below are [B, H, T, N].


def wkv7_sequential(r, log_w, k, v, a, b, state):
    """The recurrence token by token: the definition the chunked form must reproduce."""
    ys = []
    w = log_w.exp()
    for t in range(r.shape[2]):
        sa = state @ a[:, :, t, :, None]  # [B,H,N,1], the old state
        state = state * w[:, :, t, None, :] + sa @ b[:, :, t, None, :] + v[:, :, t, :, None] @ k[:, :, t, None, :]
        ys.append((state @ r[:, :, t, :, None])[..., 0])
    return torch.stack(ys, dim=2), state


def wkv7_chunk(r, log_w, k, v, a, b, state):
    """One chunk in closed form (rwkv-spec §3.2). With γ_t = Π_{s≤t} w_s, the state seen by
    token t is S₀·diag(γ_{t−1}) plus the updates of earlier tokens, each decayed by γ_t/γ_s,
    so all interactions inside the chunk are masked products of rescaled vectors. The
    "sa" vectors h_t = S_{t−1} a_t depend on each other (through b), which makes them the
    solution of a unit lower-triangular system. 1/γ grows like e^{0.61·T}: fine in fp32 for
    chunks of up to ~64 tokens."""
    T = r.shape[2]
    cum = log_w.cumsum(dim=2)  # log γ_t, inclusive
    before = cum - log_w  # log γ_{t−1}
    last = cum[:, :, -1:, :]  # log γ_T
    a_ = a * before.exp()
    r_ = r * cum.exp()
    inv = (-cum).exp()
    b_, k_ = b * inv, k * inv
    strict = torch.ones(T, T, dtype=torch.bool).tril(-1)
    causal = torch.ones(T, T, dtype=torch.bool).tril(0)
    ab = (a_ @ b_.transpose(-1, -2)).masked_fill(~strict, 0.0)
    ak = (a_ @ k_.transpose(-1, -2)).masked_fill(~strict, 0.0)
    rb = (r_ @ b_.transpose(-1, -2)).masked_fill(~causal, 0.0)
    rk = (r_ @ k_.transpose(-1, -2)).masked_fill(~causal, 0.0)
    s_t = state.transpose(-1, -2)  # [B,H,key,value]
    # (I − AB) H = Ã S₀ᵀ + AK V; unitriangular=True reads only the strictly lower part.
    h = torch.linalg.solve_triangular(-ab, a_ @ s_t + ak @ v, upper=False, unitriangular=True)
    y = r_ @ s_t + rb @ h + rk @ v
    tail = (last - cum).exp()  # γ_T / γ_s ≤ 1, computed without the large 1/γ
    state = state * last.exp() + h.transpose(-1, -2) @ (b * tail) + v.transpose(-1, -2) @ (k * tail)
    return y, state


def wkv7(r, log_w, k, v, a, b, chunk: int):
    B, H, T, N = r.shape
    state = r.new_zeros(B, H, N, N)
    ys = []
    for t0 in range(0, T, chunk):
        part = slice(t0, t0 + chunk)
        y, state = wkv7_chunk(r[:, :, part], log_w[:, :, part], k[:, :, part], v[:, :, part],
                              a[:, :, part], b[:, :, part], state)
        ys.append(y)
    return torch.cat(ys, dim=2)


def check_wkv() -> float:
    """Chunked vs sequential on random inputs with strong and weak decays (float64)."""
    g = torch.Generator().manual_seed(0)
    B, H, T, N = 2, 2, 48, 16

    def rand():
        return torch.randn(B, H, T, N, generator=g, dtype=torch.float64)

    r, k, v = rand(), rand(), rand()
    kk = F.normalize(rand(), dim=-1)
    alpha = torch.rand(B, H, T, N, generator=g, dtype=torch.float64)
    log_w = -DECAY_SCALE * torch.sigmoid(rand() * 4)
    want, _ = wkv7_sequential(r, log_w, k, v, -kk, kk * alpha, r.new_zeros(B, H, N, N))
    got = wkv7(r, log_w, k, v, -kk, kk * alpha, chunk=16)
    return float((got - want).abs().max() / want.std())


# ---------------------------------------------------------------------------------------------
# The model. Module and parameter names are the official checkpoint names (rwkv-spec §1.2),
# so state_dict() is the file's tensor dict as it is.


def shift(x):
    """The previous token's vector (zeros before the first): token shift over [B, T, C]."""
    return F.pad(x, (0, 0, 1, -1))


class TimeMix(nn.Module):
    def __init__(self, C: int, H: int, layer: int, n_layer: int, lora: dict[str, int]):
        super().__init__()
        self.C, self.H, self.N, self.layer = C, H, C // H, layer
        depth = layer / max(n_layer - 1, 1)  # 0 at the bottom, 1 at the top
        shallow = 1.0 - layer / n_layer  # 1 at the bottom, → 0 at the top
        pos = torch.arange(C, dtype=torch.float32) / C

        def mix(power):  # per-channel token-shift amounts graded across channels
            return nn.Parameter((1.0 - pos ** (power * shallow)).view(1, 1, C))

        self.x_r, self.x_w, self.x_k = mix(0.2), mix(0.9), mix(0.7)
        self.x_v, self.x_a, self.x_g = mix(0.7), mix(0.9), mix(0.2)
        # Decay bias from fast to slow across channels (σ(w0) small = long memory).
        speed = -7.0 + 5.0 * (torch.arange(C, dtype=torch.float32) / (C - 1)) ** (0.85 + depth ** 0.5)
        self.w0 = nn.Parameter((speed + 0.5).view(1, 1, C))

        def lora_pair(rank):  # down starts at 0, up random: gradients still reach both
            return nn.Parameter(torch.zeros(C, rank)), nn.Parameter(torch.randn(rank, C) * 0.1 / math.sqrt(rank))

        self.w1, self.w2 = lora_pair(lora["decay"])
        self.a0 = nn.Parameter(torch.zeros(1, 1, C))
        self.a1, self.a2 = lora_pair(lora["a"])
        self.v0 = nn.Parameter(torch.ones(1, 1, C))
        self.v1, self.v2 = lora_pair(lora["value"])
        self.g1, self.g2 = lora_pair(lora["gate"])
        self.k_k = nn.Parameter(torch.full((1, 1, C), 0.85))
        self.k_a = nn.Parameter(torch.ones(1, 1, C))
        self.r_k = nn.Parameter(torch.full((H, self.N), -0.04))
        self.receptance = nn.Linear(C, C, bias=False)
        self.key = nn.Linear(C, C, bias=False)
        self.value = nn.Linear(C, C, bias=False)
        self.output = nn.Linear(C, C, bias=False)
        self.ln_x = nn.GroupNorm(H, C, eps=64e-5)
        bound = 0.5 / math.sqrt(C)
        for lin in (self.receptance, self.key, self.value):
            nn.init.uniform_(lin.weight, -bound, bound)
        nn.init.zeros_(self.output.weight)  # each block starts as the identity
        with torch.no_grad():
            self.ln_x.weight.fill_(((1 + layer) / n_layer) ** 0.7)

    def forward(self, z, v_first, chunk: int):
        B, T, C = z.shape
        H, N = self.H, self.N
        d = shift(z) - z
        xr, xw, xk = z + d * self.x_r, z + d * self.x_w, z + d * self.x_k
        xv, xa, xg = z + d * self.x_v, z + d * self.x_a, z + d * self.x_g
        r, k, v = self.receptance(xr), self.key(xk), self.value(xv)
        log_w = -DECAY_SCALE * torch.sigmoid(self.w0 + torch.tanh(xw @ self.w1) @ self.w2)
        if self.layer == 0:
            v_first = v
        else:  # value residual: mix in layer 0's value (v0/v1/v2 of block 0 stay unused)
            v = v + (v_first - v) * torch.sigmoid(self.v0 + (xv @ self.v1) @ self.v2)
        alpha = torch.sigmoid(self.a0 + (xa @ self.a1) @ self.a2)
        g = torch.sigmoid(xg @ self.g1) @ self.g2
        kk = F.normalize((k * self.k_k).view(B, T, H, N), dim=-1, eps=1e-12).view(B, T, C)
        k = k * (1.0 + (alpha - 1.0) * self.k_a)

        def heads(x):  # [B,T,C] → [B,H,T,N]
            return x.view(B, T, H, N).transpose(1, 2)

        y = wkv7(heads(r), heads(log_w), heads(k), heads(v), heads(-kk), heads(kk * alpha), chunk)
        y = self.ln_x(y.transpose(1, 2).reshape(B * T, C)).view(B, T, C)
        bonus = (r * k * self.r_k.view(C)).view(B, T, H, N).sum(-1, keepdim=True) * v.view(B, T, H, N)
        return self.output((y + bonus.view(B, T, C)) * g), v_first


class ChannelMix(nn.Module):
    def __init__(self, C: int, F_: int, layer: int, n_layer: int):
        super().__init__()
        shallow = 1.0 - layer / n_layer
        pos = torch.arange(C, dtype=torch.float32) / C
        self.x_k = nn.Parameter((1.0 - pos ** (shallow ** 4)).view(1, 1, C))
        self.key = nn.Linear(C, F_, bias=False)
        self.value = nn.Linear(F_, C, bias=False)
        nn.init.uniform_(self.key.weight, -0.5 / math.sqrt(C), 0.5 / math.sqrt(C))
        nn.init.zeros_(self.value.weight)

    def forward(self, z):
        xk = z + (shift(z) - z) * self.x_k
        return self.value(torch.relu(self.key(xk)) ** 2)


class Block(nn.Module):
    def __init__(self, C, H, F_, layer, n_layer, lora):
        super().__init__()
        if layer == 0:
            self.ln0 = nn.LayerNorm(C)
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.att = TimeMix(C, H, layer, n_layer, lora)
        self.ffn = ChannelMix(C, F_, layer, n_layer)

    def forward(self, x, v_first, chunk):
        dx, v_first = self.att(self.ln1(x), v_first, chunk)
        x = x + dx
        return x + self.ffn(self.ln2(x)), v_first


class RWKV7(nn.Module):
    def __init__(self, vocab: int, n_layer: int, n_embd: int, head_size: int, lora: dict[str, int]):
        super().__init__()
        C, H = n_embd, n_embd // head_size
        self.emb = nn.Embedding(vocab, C)
        self.blocks = nn.ModuleList(Block(C, H, 4 * C, i, n_layer, lora) for i in range(n_layer))
        self.ln_out = nn.LayerNorm(C)
        self.head = nn.Linear(C, vocab, bias=False)
        # A tiny embedding that ln0 rescales: its rows move quickly away from the init.
        nn.init.uniform_(self.emb.weight, -1e-4, 1e-4)
        nn.init.normal_(self.head.weight, std=0.5 / math.sqrt(C))

    def forward(self, tokens, chunk: int = 32):
        x = self.blocks[0].ln0(self.emb(tokens))
        v_first = None
        for block in self.blocks:
            x, v_first = block(x, v_first, chunk)
        return self.head(self.ln_out(x))


def checkpoint_tensors(model: RWKV7) -> dict[str, np.ndarray]:
    return {name: p.detach().float().numpy().copy() for name, p in model.state_dict().items()}


# ---------------------------------------------------------------------------------------------
# Data


def token_stream(tok, docs: list[str]) -> np.ndarray:
    """Documents joined by end-of-text (0), with a leading 0, as the RWKV trainers do."""
    out = [0]
    for d in docs:
        out.extend(tok.encode(d))
        out.append(0)
    return np.array(out, dtype=np.int64)


def windows(stream: np.ndarray, ctx: int) -> np.ndarray:
    """Non-overlapping [n, ctx + 1] windows: inputs [:-1], targets [1:]."""
    n = (len(stream) - 1) // ctx
    idx = np.arange(n)[:, None] * ctx + np.arange(ctx + 1)[None, :]
    return stream[idx]


PAD = -1  # in packed windows: not a token; as an input it reads as 0, as a target it is skipped


def packed_windows(tok, docs: list[str], ctx: int) -> np.ndarray:
    """[n, ctx + 1] windows that hold whole documents ("0 doc 0 doc 0 …", padded with PAD), so
    an example (a tool list, the request, the call and the observation) is always seen from its
    start, from a fresh state, as the server runs it. Documents longer than a window are cut."""
    rows: list[list[int]] = []
    for d in docs:  # first fit, in document order: deterministic, little padding
        ids = tok.encode(d)[:ctx] + [0]
        row = next((r for r in rows if len(r) + len(ids) <= ctx + 1), None)
        if row is None:
            rows.append(row := [0])
        row.extend(ids)
    return np.array([r + [PAD] * (ctx + 1 - len(r)) for r in rows], dtype=np.int64)


def split_window(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of [B, ctx + 1] windows; PAD targets become cross_entropy's ignore_index."""
    return w[:, :-1].clamp(min=0), w[:, 1:].masked_fill(w[:, 1:] == PAD, -100)


@torch.no_grad()
def evaluate(model: RWKV7, wins: np.ndarray, batch: int) -> float:
    """Mean next-token loss (nats) over every target of the windows, each from a fresh state."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(wins), batch):
        w = torch.from_numpy(wins[i : i + batch])
        logits = model(w[:, :-1])
        total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1), reduction="sum"))
        count += w[:, 1:].numel()
    model.train()
    return total / count


def unigram_loss(train: np.ndarray, targets: np.ndarray, vocab: int) -> float:
    """Cross-entropy of `targets` under the training stream's token frequencies (add-one)."""
    counts = np.bincount(train, minlength=vocab).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[targets].mean())


# ---------------------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kjv", help="a dump of `bible -f Gen1:1-Rev22:21` (default: run `bible`)")
    p.add_argument("--out", default=str(REPO / "assets" / "models"), help="output directory")
    p.add_argument("--vocab", type=int, default=4096, help="vocabulary size incl. end-of-text")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--embd", type=int, default=256)
    p.add_argument("--head-size", type=int, default=64)
    p.add_argument("--ctx", type=int, default=512, help="training context length")
    p.add_argument("--eval-ctx", type=int, default=256,
                   help="held-out evaluation windows (256 as in earlier runs, so losses compare)")
    p.add_argument("--chunk", type=int, default=64,
                   help="WKV chunk length (fastest measured here; fp32-safe up to ~128)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--g1-docs", type=int, default=2400,
                   help="synthetic G1 documents (thinking, JSON, tool calls; a third each)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--lr-final", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1: a busy second core cannot stall every step at nice 19)")
    p.add_argument("--eval-every", type=int, default=100)
    args = p.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        log_lines.append(msg)

    log(f"args: {vars(args)}")
    err = check_wkv()
    log(f"check: chunked WKV vs sequential, max|Δ|/std = {err:.1e}")
    assert err < 1e-9, "the chunked WKV does not reproduce the recurrence"

    # ---- data and vocabulary
    verses = demo_data.read_kjv(args.kjv)
    train_docs = demo_data.documents(verses, held_out=False, seed=args.seed)
    eval_docs = demo_data.documents(verses, held_out=True, seed=args.seed)
    log(f"data: King James Bible, {len(verses)} verses; train {len(train_docs)} chapters "
        f"({sum(map(len, train_docs))} chars), held out {len(eval_docs)} chapters of "
        f"{', '.join(demo_data.HELD_OUT)} ({sum(map(len, eval_docs))} chars)")
    g1 = demo_data.g1_documents(verses, args.g1_docs, seed=args.seed)
    g1_docs = [text for _, text in g1]
    log(f"data: {len(g1_docs)} synthetic G1 documents from the training books' verses "
        f"({sum(map(len, g1_docs))} chars): "
        + ", ".join(f"{k} {sum(kind == k for kind, _ in g1)}" for k in demo_data.G1_KINDS))
    world = demo_data.read_world_lines()
    vocab_ids = demo_data.choose_vocab(train_docs + g1_docs, args.vocab, world, log=log)
    vocab_path = out / "demo_vocab.txt"
    demo_data.write_vocab(vocab_ids, world, vocab_path)
    from ai00_like.rwkv.tokenizer import load_tokenizer

    tok = load_tokenizer(vocab_path)
    V = tok.vocab_size
    words = demo_data.word_list(train_docs + g1_docs)
    with gzip.GzipFile(out / "demo_words.txt.gz", "wb", mtime=0) as f:  # mtime=0: same bytes each run
        f.write(("\n".join(words) + "\n").encode())
    bible = token_stream(tok, train_docs)
    held = token_stream(tok, eval_docs)
    g1_wins = packed_windows(tok, g1_docs, args.ctx)
    g1_tokens = g1_wins[:, 1:][g1_wins[:, 1:] != PAD]
    train = np.concatenate([bible, g1_tokens])  # every training token once (for counts and the unigram)
    train_bytes = sum(len(d.encode()) for d in train_docs + g1_docs)
    log(f"vocab: {V} ids (0 = end-of-text, 1..256 bytes, {V - 257} longer World tokens); "
        f"train {len(train)} tokens ({train_bytes / len(train):.2f} bytes/token), held out {len(held)} tokens; "
        f"{len(words)} distinct words")
    for name in ("<think>", "</think>", "<tool_call>", "</tool_call>", '"arguments": ', "Observation:"):
        log(f"vocab: {name!r} is {len(tok.encode(name))} tokens")
    by_kind = {k: [len(tok.encode(t)) + 1 for kind, t in g1 if kind == k] for k in demo_data.G1_KINDS}
    log(f"mix: King James {len(bible)} tokens ({len(bible) / len(train):.1%}; plain and chat chapters), "
        f"G1 {len(g1_tokens)} tokens ({len(g1_tokens) / len(train):.1%}): "
        + ", ".join(f"{k} {sum(n)} ({sum(n) / len(train):.1%}, longest {max(n)})" for k, n in by_kind.items())
        + f"; G1 packed whole into {len(g1_wins)} windows of {args.ctx} "
        f"({1 - len(g1_tokens) / g1_wins[:, 1:].size:.1%} padding)")

    train_wins = np.concatenate([windows(bible, args.ctx), g1_wins])
    eval_wins = windows(held, args.eval_ctx)
    eval_targets = eval_wins[:, 1:].reshape(-1)
    uni = unigram_loss(train, eval_targets, V)
    log(f"baseline: unigram held-out loss {uni:.4f} nats/token, perplexity {math.exp(uni):.1f}")

    # ---- model
    lora = {"decay": 32, "a": 32, "value": 32, "gate": 64}
    model = RWKV7(V, args.layers, args.embd, args.head_size, lora)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: RWKV-7 L{args.layers} D{args.embd} head size {args.head_size} ffn {4 * args.embd} "
        f"LoRA {lora}, vocab {V}: {n_params:,} parameters")

    decay, no_decay = [], []
    for name, prm in model.named_parameters():
        # Weight decay on the big matrices only; mixes, biases, norms and LoRAs are left alone.
        (decay if name.endswith(".weight") and prm.ndim == 2 and "ln" not in name else no_decay).append(prm)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.99), eps=1e-8)

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        frac = (step - args.warmup) / max(args.steps - args.warmup, 1)
        return args.lr_final + 0.5 * (args.lr - args.lr_final) * (1 + math.cos(math.pi * frac))

    order = np.random.default_rng(args.seed)
    perm, pos = order.permutation(len(train_wins)), 0
    tokens_seen, start, epoch = 0, time.time(), 0
    for step in range(args.steps):
        if pos + args.batch > len(perm):  # next epoch: a fresh deterministic shuffle
            perm, pos, epoch = order.permutation(len(train_wins)), 0, epoch + 1
        inputs, targets = split_window(torch.from_numpy(train_wins[perm[pos : pos + args.batch]]))
        pos += args.batch
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        logits = model(inputs, args.chunk)
        loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        tokens_seen += int((targets != -100).sum())
        if step % 10 == 0 or step == args.steps - 1:
            elapsed = time.time() - start
            print(f"step {step:5d}  loss {loss.item():.4f}  lr {lr_at(step):.2e}  tokens {tokens_seen:,}  "
                  f"{tokens_seen / elapsed:.0f} tok/s  {elapsed / 60:.1f} min", flush=True)
        if (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            held_loss = evaluate(model, eval_wins, 32)
            log(f"step {step + 1}: train loss {loss.item():.4f}, held-out {held_loss:.4f} "
                f"(ppl {math.exp(held_loss):.1f}), {tokens_seen:,} tokens, {(time.time() - start) / 60:.1f} min")
    train_time = time.time() - start

    # ---- export: the fp16 file is the model; evaluate it as stored
    tensors = checkpoint_tensors(model)
    from ai00_like.rwkv.formats.safetensors import write_safetensors

    st_path = out / "demo.st"
    write_safetensors(tensors, st_path, dtype="fp16")
    with torch.no_grad():
        for prm in model.parameters():
            prm.copy_(prm.half().float())
    held_loss = evaluate(model, eval_wins, 32)
    held_bytes = sum(len(d.encode()) for d in eval_docs)
    log(f"done: {args.steps} steps, {tokens_seen:,} tokens seen ({tokens_seen / len(train):.2f} epochs), "
        f"training time {train_time / 60:.1f} min ({tokens_seen / train_time:.0f} tokens/s, {args.threads} threads)")
    log(f"held-out (fp16 weights as shipped): loss {held_loss:.4f} nats/token, perplexity {math.exp(held_loss):.1f} "
        f"vs unigram {uni:.4f} / {math.exp(uni):.1f}; {held_loss / math.log(2) * len(held) / held_bytes:.3f} bits/byte")
    log(f"file: {st_path.name} {st_path.stat().st_size / 1e6:.1f} MB, {vocab_path.name} {V} ids")

    # ---- the file through our own engine must compute what the torch model computes
    from ai00_like.rwkv import load_model

    engine = load_model(st_path)
    sample = held[1:129].tolist()
    ours, _ = engine.forward(sample)
    with torch.no_grad():
        theirs = model(torch.tensor([sample]))[0, -1].numpy()
    rel = float(np.abs(ours - theirs).max() / theirs.std())
    log(f"check: numpy engine on {st_path.name} vs the torch model after 128 tokens, max|Δ|/std = {rel:.1e}")
    assert rel < 1e-3, "the exported model does not match the torch model"
    (out / "demo_train_log.txt").write_text("\n".join(log_lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
