"""llama.cpp as an optional anchor for the engine benchmark (never part of the tests or CI).

The same seeded v7 checkpoint that bench/engine.py measures is converted to GGUF with the
`gguf` package (f16: matrices in f16, vectors in f32, as llama.cpp's own converter writes
them), then quantised to q8_0 and q4_0 by llama.cpp's own quantiser. Each file runs in a
process of its own with 2 threads through llama-cpp-python's low-level API: prefill
tokens/s of the 512-token prompt, decode tokens/s at batch 1, 4 and 16 (B sequences each
decoding one token per step in one llama_decode call, 32 steps, best of 3), and the
process's peak memory (VmHWM): one JSON line per type, shaped like bench/engine.py's.

llama-cpp-python is built once from its sdist, for this CPU (GGML_NATIVE, less AMX: see
`ensure_built`), into its own venv (bench/.cache/llama-venv; 5 to 8 minutes on 2 cores, log
in bench/.cache/llama-build.log). The GGUF files are made once next to the checkpoint.

`--check` verifies the conversion: each GGUF's logits for 16 prompt tokens and 4 decode
steps against our engine's on the fp32 checkpoint, as the largest difference relative to
the logits' standard deviation, overall and per token; and llama.cpp's World tokenizer's
ids for a sample text against ours. An all-f32 GGUF, made for the check only, must agree
to fp32 rounding (about 1e-4): that proves the layout. f16 is a few 1e-2 off on the first
tokens and about 1e-2 later, as our own engine is with f16 weights and f16-rounded
activations (what llama.cpp's f16 matmuls do); q8_0 and q4_0 are as far off as our Int8
and NF4 on these random weights.

Run it on an otherwise idle machine: llama.cpp's OpenMP workers spin at every barrier, so
another busy process on the 2 cores slows it many times over (a 64-token prefill once took
4.4 s instead of 0.09 s next to another benchmark), far more than it slows our engine.

    XDG_RUNTIME_DIR=$(mktemp -d) .venv/bin/python bench/llama_cpp_runner.py --check
    .venv/bin/python bench/llama_cpp_runner.py                 # the f16, q8_0 and q4_0 figures
    .venv/bin/python bench/engine.py --llama-cpp        # the same rows next to ours

The parent side runs in the project's venv; the work that needs llama_cpp or gguf runs in
the llama venv, which loads this file under another name and calls `child`: imported under
its own name from bench/, this file would shadow the llama_cpp package.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
CACHE = BENCH / ".cache"
VENV = CACHE / "llama-venv"
BUILD_LOG = CACHE / "llama-build.log"
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
# msgspec: our own checkpoint and vocabulary readers (ai00_like) import it.
VENV_PACKAGES = ("numpy", "gguf", "msgspec")
TYPES = ("f16", "q8_0", "q4_0")  # measured
# The check also runs an all-f32 file: it isolates the layout (which must then agree to fp32
# rounding) from llama.cpp's f16 arithmetic (its f16 matmuls round the activations to f16 too).
CHECK_TYPES = ("f32", *TYPES)
QUANT_FTYPES = {"q8_0": 7, "q4_0": 2}  # llama_ftype: LLAMA_FTYPE_MOSTLY_Q8_0, LLAMA_FTYPE_MOSTLY_Q4_0
THREADS = 2
CHECK_PROMPT, CHECK_DECODE = 16, 4
CHECK_TEXT = "The quick brown fox, 敏捷的棕色狐狸, jumps over\n\tthe lazy dog 🦊!"


# ------------------------------------------------------------------ parent side (project venv)


def venv_python() -> Path:
    return VENV / "bin" / "python"


def is_built() -> bool:
    if not venv_python().exists():
        return False
    probe = subprocess.run([str(venv_python()), "-c", "import llama_cpp, gguf, msgspec"], cwd=CACHE,
                           capture_output=True)
    return probe.returncode == 0


@functools.cache
def ensure_built() -> Path:
    """The llama venv's python, after building llama-cpp-python from its sdist once."""
    if is_built():
        return venv_python()
    CACHE.mkdir(exist_ok=True)
    if not venv_python().exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    print(f"building {LLAMA_CPP_PYTHON} from its sdist into {VENV} (minutes; log: {BUILD_LOG})",
          file=sys.stderr, flush=True)
    started = time.perf_counter()
    # GGML_NATIVE: kernels for this CPU, as a user building it locally gets; but without
    # AMX, whose q8_0/q4_0 matmul segfaults at its first tile instruction (ldtilecfg) on the
    # AMX Xeon this was written on (llama.cpp issue 20824: machine-dependent, unfixed), so
    # those types run on the AVX-512 kernels. gcc lets explicit -mno-* flags win over
    # -march=native whatever their order.
    no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    env = dict(os.environ, CMAKE_ARGS="-DGGML_NATIVE=ON", CFLAGS=no_amx, CXXFLAGS=no_amx,
               CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
    pip = [str(venv_python()), "-m", "pip", "install", "--no-input"]
    with open(BUILD_LOG, "w") as log:
        # --no-cache-dir: a wheel cached from another build could have other flags
        for command in (pip + list(VENV_PACKAGES),
                        pip + ["-v", "--no-cache-dir", "--no-binary", "llama-cpp-python", LLAMA_CPP_PYTHON]):
            done = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=CACHE)
            if done.returncode != 0:
                raise SystemExit(f"building llama-cpp-python failed; see {BUILD_LOG}")
    print(f"built in {(time.perf_counter() - started) / 60:.1f} min", file=sys.stderr, flush=True)
    return venv_python()


# The child loads this file by path under another name, so that `import llama_cpp` in it
# finds the package; its working directory is the project root, which has no llama_cpp.
_CHILD_LOADER = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("bench_llama_cpp_child", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
module.child(sys.argv[2:])
"""


def run_child(*args: str) -> str:
    """Run `child(args)` in the llama venv (2 threads); its stdout."""
    # OPENBLAS_CORETYPE is left out, as bench/engine.py does for every engine.
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    env.update(OMP_NUM_THREADS=str(THREADS), PYTHONPATH=str(ROOT))
    out = subprocess.run([str(ensure_built()), "-c", _CHILD_LOADER, __file__, *map(str, args)],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"llama.cpp process {args[0]} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return out.stdout


def gguf_path(checkpoint: Path, gguf_type: str) -> Path:
    return checkpoint.with_name(f"{checkpoint.stem}-{gguf_type}.gguf")


def ensure_converted(checkpoint: Path, types=TYPES) -> dict[str, Path]:
    """The checkpoint as GGUF files of these types, each made once (quantised ones from f16)."""
    paths = {t: gguf_path(checkpoint, t) for t in types}
    for t, path in paths.items():
        if path.exists():
            continue
        if t in QUANT_FTYPES:
            f16 = ensure_converted(checkpoint, ("f16",))["f16"]
            run_child("quantize", f16, path, QUANT_FTYPES[t])
        else:
            run_child("convert", checkpoint, path, t)
    return paths


def measure(gguf: Path, prompt_len: int, steps: int, batches, short_len: int) -> dict:
    """Prefill (of the prompt and of its first `short_len` tokens) and decode tokens/s and
    peak MiB of one GGUF file, in a process of its own."""
    out = run_child("measure", gguf, prompt_len, steps, json.dumps(list(batches)), THREADS, short_len)
    return json.loads(out.strip().splitlines()[-1])


def measure_all(checkpoint: Path, prompt_len: int, steps: int, batches, short_len: int) -> dict[str, dict]:
    """Build and convert as needed, then measure every type: {"f16": figures, ...}."""
    return {t: measure(path, prompt_len, steps, batches, short_len)
            for t, path in ensure_converted(checkpoint).items()}


def check(checkpoint: Path) -> dict:
    """Every GGUF's logits against our engine's on the fp32 checkpoint, and the tokenizer."""
    import tempfile

    import numpy as np

    from ai00_like.rwkv import load_model
    from ai00_like.rwkv.tokenizer.vocab_files import default_tokenizer_path
    from ai00_like.rwkv.tokenizer.world import WorldTokenizer

    tokens = np.random.default_rng(1).integers(1, 65530, CHECK_PROMPT + CHECK_DECODE).tolist()
    ours = our_logits(load_model(checkpoint, device="cpu"), tokens)
    our_ids = WorldTokenizer.from_file(default_tokenizer_path()).encode(CHECK_TEXT)
    report = {"tokens": len(tokens), "logits_std": float(ours.std()), "tokenizer_agrees": True}
    with tempfile.TemporaryDirectory() as tmp:
        for t, path in ensure_converted(checkpoint, CHECK_TYPES).items():
            out = Path(tmp) / f"{t}.npy"
            ids = json.loads(run_child("logits", path, json.dumps(tokens), CHECK_PROMPT, out, CHECK_TEXT))
            report["tokenizer_agrees"] &= ids == our_ids
            theirs = np.load(out)
            error = np.abs(theirs - ours)
            report[t] = {
                "max_abs_err_over_std": float(error.max() / ours.std()),
                "mean_abs_err_over_std": float(error.mean() / ours.std()),
                "argmax_agree": float((theirs.argmax(-1) == ours.argmax(-1)).mean()),
                # per position: f16's first tokens are its worst (see the module docstring)
                "max_abs_err_over_std_by_token": [round(float(e), 5) for e in error.max(-1) / ours.std()],
            }
    return report


def our_logits(model, tokens: list[int]):
    """Our logits of every prompt token, then of each decode step: (len(tokens), V)."""
    import numpy as np

    prompt_logits, state = model.forward(tokens[:CHECK_PROMPT], full_output=True)
    rows = list(prompt_logits)
    for token in tokens[CHECK_PROMPT:]:
        logits, state = model.forward([token], state)
        rows.append(logits)
    return np.asarray(rows, dtype=np.float32)


def default_checkpoint() -> Path:
    """bench/engine.py's fp32 checkpoint of the 0.1B shape (made there if missing)."""
    from engine import checkpoint  # bench/ is on sys.path: this file runs as a script or from engine.py

    return checkpoint("0.1B")[0]


def main() -> None:
    import record  # here, not at the top: the child loads this file by path, without bench/ on sys.path

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="verify the conversion against our engine")
    parser.add_argument("--checkpoint", type=Path, help="an fp32 v7 .pth (default: bench/engine.py's 0.1B)")
    parser.add_argument("--no-save", action="store_true", help=record.NO_SAVE_HELP)
    args = parser.parse_args()
    path = args.checkpoint or default_checkpoint()
    if args.check:
        report = check(path)
        for t in CHECK_TYPES:
            r = report[t]
            print(f"{t:5} max |llama.cpp - ours| / std {r['max_abs_err_over_std']:.2e} "
                  f"(mean {r['mean_abs_err_over_std']:.2e}), same argmax {r['argmax_agree']:.0%}")
        print(f"tokenizer agrees with ours: {report['tokenizer_agrees']}")
        print(json.dumps(report))
        record.save("llama_cpp_check", report, args)
        return
    from engine import BATCHES, DECODE_STEPS, PROMPT, SHORT_PROMPT

    measured = measure_all(path, PROMPT, DECODE_STEPS, BATCHES, SHORT_PROMPT)
    for t, figures in measured.items():
        print(json.dumps({"type": t, **figures}))
    record.save("llama_cpp", measured, args)


# ------------------------------------------------------------------ child side (llama venv)


def child(argv: list[str]) -> None:
    command, args = argv[0], argv[1:]
    if command == "convert":
        convert_to_gguf(Path(args[0]), Path(args[1]), args[2])
    elif command == "quantize":
        quantize(Path(args[0]), Path(args[1]), int(args[2]))
    elif command == "logits":
        ids = save_llama_logits(Path(args[0]), json.loads(args[1]), int(args[2]), Path(args[3]), args[4])
        print(json.dumps(ids))
    elif command == "measure":
        print(json.dumps(measure_here(Path(args[0]), int(args[1]), int(args[2]), json.loads(args[3]), int(args[4]),
                                      int(args[5]))))
    else:
        raise SystemExit(f"unknown command {command}")


# --- conversion: BlinkDL's .pth names and layout -> llama.cpp's rwkv7 graph
#
# ggml lists a tensor's dimensions innermost first, so a numpy (rows, cols) array is a
# ggml {cols, rows} tensor, and ggml_mul_mat(W, x) wants W as (out, in) rows: nn.Linear
# weights go as they are, the LoRA factors (stored for x @ W, as (in, out)) transposed.

LERP_ORDER = "rwkvag"  # the fused lerp tensor's slices, in the order the rwkv7 graph reads them
PER_LAYER = {  # ours -> llama.cpp, for the tensors that only get renamed (and squeezed)
    "ln1.weight": "attn_norm.weight", "ln1.bias": "attn_norm.bias",
    "ln2.weight": "attn_norm_2.weight", "ln2.bias": "attn_norm_2.bias",
    "att.w0": "time_mix_w0.weight", "att.a0": "time_mix_a0.weight", "att.v0": "time_mix_v0.weight",
    "att.k_k": "time_mix_k_k.weight", "att.k_a": "time_mix_k_a.weight", "att.r_k": "time_mix_r_k.weight",
    "att.receptance.weight": "time_mix_receptance.weight", "att.key.weight": "time_mix_key.weight",
    "att.value.weight": "time_mix_value.weight", "att.output.weight": "time_mix_output.weight",
    "att.ln_x.weight": "time_mix_ln.weight", "att.ln_x.bias": "time_mix_ln.bias",
    "ffn.x_k": "channel_mix_lerp_k.weight",
    "ffn.key.weight": "channel_mix_key.weight", "ffn.value.weight": "channel_mix_value.weight",
}
LORA = {"w": "time_mix_w", "a": "time_mix_a", "v": "time_mix_v", "g": "time_mix_g"}
GLOBAL = {
    "emb.weight": "token_embd.weight", "blocks.0.ln0.weight": "token_embd_norm.weight",
    "blocks.0.ln0.bias": "token_embd_norm.bias", "ln_out.weight": "output_norm.weight",
    "ln_out.bias": "output_norm.bias", "head.weight": "output.weight",
}
# Kept f32 in an f16 file, as llama.cpp's converter does (and its quantiser leaves them).
F32_MATRICES = ("time_mix_w1.weight", "time_mix_w2.weight", "time_mix_lerp_fused.weight")


def layer_count(tensors: dict) -> int:
    return 1 + max(int(name.split(".")[1]) for name in tensors if name.startswith("blocks."))


def gguf_tensors(tensors: dict) -> dict:
    """llama.cpp's rwkv7 tensors, as fp32 numpy arrays, from our official-layout ones."""
    import numpy as np

    out = {new: tensors[old] for old, new in GLOBAL.items()}
    for i in range(layer_count(tensors)):
        ours, theirs = f"blocks.{i}.", f"blk.{i}."
        for old, new in PER_LAYER.items():
            if ours + old in tensors:  # layer 0's v0 may be missing; handled below
                value = tensors[ours + old]
                # vectors ((1, 1, C) mixes, w0 ..., r_k as (H, N)) are flat in the graph
                out[theirs + new] = value if value.ndim == 2 and not old.endswith("r_k") else value.reshape(-1)
        out[theirs + "time_mix_lerp_fused.weight"] = np.stack(
            [tensors[f"{ours}att.x_{c}"].reshape(1, 1, -1) for c in LERP_ORDER])  # (6, 1, 1, C)
        for c, new in LORA.items():
            if i > 0 or c != "v":
                out[f"{theirs}{new}1.weight"] = tensors[f"{ours}att.{c}1"].T
                out[f"{theirs}{new}2.weight"] = tensors[f"{ours}att.{c}2"].T
        if i == 0:
            # Layer 0 has no value residual, but the loader wants v0/v1/v2 there with the
            # ICLR (a) LoRA's rank; they are never read, so zeros do.
            C, rank = tensors[f"{ours}att.a1"].shape
            out[theirs + "time_mix_v0.weight"] = np.zeros(C, np.float32)
            out[theirs + "time_mix_v1.weight"] = np.zeros((rank, C), np.float32)
            out[theirs + "time_mix_v2.weight"] = np.zeros((C, rank), np.float32)
    return out


def stored(name: str, array, float_type: str):
    """The array as an f16 file keeps it (2-D and up weights f16, vectors and norms f32), or
    an f32 file (everything f32)."""
    import numpy as np

    half = float_type == "f16" and array.ndim >= 2 and not name.endswith(F32_MATRICES)
    return np.ascontiguousarray(array, dtype=np.float16 if half else np.float32)


def convert_to_gguf(checkpoint: Path, out: Path, float_type: str) -> None:
    """Write our v7 .pth as an f16 or f32 GGUF for llama.cpp's rwkv7 architecture."""
    import gguf

    from ai00_like.rwkv.loader import read_tensors

    tensors, layout = read_tensors(checkpoint)
    if layout != "official":
        raise SystemExit(f"{checkpoint}: expected the official .pth layout, got {layout}")
    vocab, C = tensors["emb.weight"].shape
    head_size = tensors["blocks.0.att.r_k"].shape[1]
    n_layer = layer_count(tensors)
    lora_rank = {c: tensors[f"blocks.0.att.{c}1"].shape[1] for c in "wag"}
    # layer 0's v LoRA, if there at all, is a dummy: the value-residual rank is layer 1's
    lora_rank["v"] = tensors["blocks.1.att.v1"].shape[1] if n_layer > 1 else lora_rank["a"]

    tmp = out.with_suffix(".tmp")
    writer = gguf.GGUFWriter(tmp, "rwkv7")
    writer.add_name(checkpoint.stem)
    writer.add_context_length(1 << 20)  # a recurrent model has no context limit; llama.cpp wants one
    writer.add_embedding_length(C)
    writer.add_block_count(n_layer)
    writer.add_layer_norm_eps(1e-5)
    writer.add_wkv_head_size(head_size)
    writer.add_decay_lora_rank(lora_rank["w"])
    writer.add_iclr_lora_rank(lora_rank["a"])
    writer.add_value_residual_mix_lora_rank(lora_rank["v"])
    writer.add_gate_lora_rank(lora_rank["g"])
    writer.add_feed_forward_length(tensors["blocks.0.ffn.key.weight"].shape[0])
    writer.add_head_count(0)  # read by llama.cpp's common code, unused by rwkv7
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if float_type == "f16" else gguf.LlamaFileType.ALL_F32)
    add_world_vocab(writer, vocab)
    for name, array in gguf_tensors(tensors).items():
        writer.add_tensor(name, stored(name, array, float_type))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.rename(out)  # a half-written file never passes for a converted one


def escaped_token(raw: bytes) -> str:
    """A token's bytes as llama.cpp's rwkv tokenizer stores them: text with \\t \\n \\r \\\\
    and \\xhh escapes (it unescapes each token when it loads the vocabulary)."""
    named = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r", 0x5C: "\\\\"}
    return "".join(named.get(b) or (chr(b) if 0x20 <= b < 0x7F else f"\\x{b:02x}") for b in raw)


def add_world_vocab(writer, vocab_size: int) -> None:
    """The RWKV World vocabulary, in the form llama.cpp loads an RWKV World model with."""
    import gguf

    from ai00_like.rwkv.tokenizer.vocab_files import default_tokenizer_path, read_world_vocab

    world = read_world_vocab(default_tokenizer_path())
    tokens, types = ["<s>"], [gguf.TokenType.CONTROL]  # id 0: end of text
    for tid in range(1, vocab_size):
        if tid in world:
            tokens.append(escaped_token(world[tid]))
            types.append(gguf.TokenType.NORMAL)
        else:  # the head's rows past the vocabulary
            tokens.append(f"[PAD{tid}]")
            types.append(gguf.TokenType.UNUSED)
    writer.add_tokenizer_model("rwkv")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)


def quantize(src: Path, out: Path, ftype: int) -> None:
    """llama.cpp's own quantiser, with its own choice of which tensors to quantise how."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = THREADS
    tmp = out.with_suffix(".tmp")
    if llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params) != 0:
        raise SystemExit(f"llama_model_quantize {src} -> {out} failed")
    tmp.rename(out)


# --- running a GGUF through the low-level API


class Session:
    """A model and a context with `n_seq` sequences, and one reusable batch."""

    def __init__(self, gguf: Path, *, n_seq: int, n_batch: int, threads: int):
        import llama_cpp

        self.ll = llama_cpp
        llama_cpp.llama_backend_init()
        self.model = llama_cpp.llama_model_load_from_file(str(gguf).encode(), llama_cpp.llama_model_default_params())
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {gguf}")
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = 4096  # positions only; a recurrent model's state does not grow with it
        params.n_batch = params.n_ubatch = n_batch  # the whole prompt in one graph
        params.n_seq_max = n_seq
        params.n_outputs_max = max(n_seq, CHECK_PROMPT)  # logits rows; a prompt-sized buffer would inflate RSS
        params.n_threads = params.n_threads_batch = threads
        params.no_perf = True
        self.ctx = llama_cpp.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise SystemExit(f"llama.cpp could not make a context for {gguf}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self.next_pos = [0] * n_seq

    def reset(self) -> None:
        """Every sequence back to the zero state."""
        self.ll.llama_memory_clear(self.ll.llama_get_memory(self.ctx), True)
        self.next_pos = [0] * len(self.next_pos)

    def decode(self, items: list[tuple[int, int, bool]]) -> None:
        """One llama_decode of (sequence, token, wants logits) items, each at its sequence's next position."""
        batch = self.batch
        for i, (seq, token, wanted) in enumerate(items):
            batch.token[i] = token
            batch.pos[i] = self.next_pos[seq]
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = wanted
            self.next_pos[seq] += 1
        batch.n_tokens = len(items)
        if self.ll.llama_decode(self.ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
        self.ll.llama_synchronize(self.ctx)

    def prompt(self, tokens: list[int], *, all_logits: bool = False) -> None:
        last = len(tokens) - 1
        self.decode([(0, t, all_logits or i == last) for i, t in enumerate(tokens)])

    def logits(self, i: int):
        """A copy of the logits at position i of the last decode's batch (which must have wanted them)."""
        import numpy as np

        row = self.ll.llama_get_logits_ith(self.ctx, i)
        return np.ctypeslib.as_array(row, shape=(self.n_vocab,)).copy()

    def tokenize(self, text: str) -> list[int]:
        raw = text.encode()
        ids = (self.ll.llama_token * (len(raw) + 8))()
        n = self.ll.llama_tokenize(self.vocab, raw, len(raw), ids, len(ids), False, False)
        return list(ids[:n])


def save_llama_logits(gguf: Path, tokens: list[int], prompt_len: int, out: Path, text: str) -> list[int]:
    """The GGUF's logits of every prompt token and of each decode step after it, saved as
    .npy (the check's counterpart of `our_logits`); and its tokenization of `text`."""
    import numpy as np

    session = Session(gguf, n_seq=1, n_batch=prompt_len, threads=THREADS)
    session.prompt(tokens[:prompt_len], all_logits=True)
    rows = [session.logits(i) for i in range(prompt_len)]
    for token in tokens[prompt_len:]:
        session.decode([(0, token, True)])
        rows.append(session.logits(0))
    np.save(out, np.asarray(rows, dtype=np.float32))
    return session.tokenize(text)


def best_of(n: int, fn, setup=lambda: None) -> float:
    times = []
    for _ in range(n):
        setup()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def peak_mb() -> float:
    """This process's VmHWM, as bench/engine.py measures its engines."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure_here(gguf: Path, prompt_len: int, steps: int, batches: list[int], threads: int, short_len: int) -> dict:
    """bench/engine.py's measurements on one GGUF: the same prompt, short prompt, steps and batches."""
    import numpy as np

    prompt = np.random.default_rng(0).integers(1, 65530, prompt_len).tolist()
    t = time.perf_counter()
    session = Session(gguf, n_seq=max(batches), n_batch=max(prompt_len, max(batches)), threads=threads)
    load_s = time.perf_counter() - t
    session.prompt(prompt[:64])  # warm-up, as ours
    session.reset()
    prefill_s = best_of(2, lambda: session.prompt(prompt), setup=session.reset)
    short_s = best_of(3, lambda: session.prompt(prompt[:short_len]), setup=session.reset)
    decode = {}
    for b in batches:
        session.reset()
        step = [(seq, prompt[seq], True) for seq in range(b)]  # every sequence's logits, as our step gives
        session.decode(step)

        def decode_steps():
            for _ in range(steps):
                session.decode(step)

        decode[b] = b * steps / best_of(3, decode_steps)
    return {"load_s": load_s, "prefill_tps": prompt_len / prefill_s, "short_prefill_tps": short_len / short_s,
            "decode_tps": decode, "peak_mb": peak_mb(), "file_mb": gguf.stat().st_size / 2**20}


if __name__ == "__main__":
    main()
