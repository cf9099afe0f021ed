"""The `ai00-like` command line.

Each subcommand is an `add_<name>(subparsers)` that declares its arguments and a
`cmd_<name>(args) -> int` that runs it; `main` only dispatches. Errors a user can cause
print one line, `ai00-like: error: <file>: <problem>`, and exit with status 2.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .rwkv.errors import ModelFileError

PROG = "ai00-like"
EXIT_USER_ERROR = 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    give_gpu_drivers_a_runtime_dir()
    try:
        return args.handler(args)
    except ModelFileError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


def give_gpu_drivers_a_runtime_dir() -> None:
    """Set XDG_RUNTIME_DIR to a private folder when it is missing (services, containers, root shells).

    Mesa's Vulkan drivers print "error: XDG_RUNTIME_DIR is invalid or not set" on every
    adapter probe without it: harmless, but it reads as a failure of ours. The folder is
    used only if it is this user's own and closed to others.
    """
    if os.environ.get("XDG_RUNTIME_DIR") or not hasattr(os, "getuid"):
        return
    folder = Path(tempfile.gettempdir()) / f"ai00-like-runtime-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.lstat()
    except OSError:
        return
    if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700:
        os.environ["XDG_RUNTIME_DIR"] = str(folder)


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (argparse prints the usage block first)."""

    def error(self, message: str):
        self.exit(EXIT_USER_ERROR, f"{PROG}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="A local inference server for RWKV language models.")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    add_serve(subparsers)
    add_convert(subparsers)
    add_generate(subparsers)
    add_pull(subparsers)
    add_lb_config(subparsers)
    # No command: serve, so that `ai00-like --port 8000` works as Ai00's binary does.
    add_serve_arguments(parser)
    parser.set_defaults(handler=cmd_serve)
    return parser


# --------------------------------------------------------------------------- serve


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", type=Path, default=None,
                   help="config file (default: ./config.toml, or built-in defaults when there is none)")
    p.add_argument("-i", "--ip", default=None, help="address to listen on (default: [listen] ip, 127.0.0.1)")
    p.add_argument("-p", "--port", type=int, default=None, help="port to listen on (default: [listen] port, 65530)")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info",
                   help="least severe log messages shown; request logs are JSON lines at info (default: info)")


def add_serve(subparsers) -> None:
    p = subparsers.add_parser(
        "serve",
        help="run the server (the default command)",
        description=(
            "Run the OpenAI-compatible server. It listens at once and loads the model of "
            "[model] in the background; inference routes answer 503 until it is loaded."
        ),
    )
    add_serve_arguments(p)
    p.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from .api.app import ApiStartError, serve_forever
    from .api.logs import configure_logging
    from .config import ConfigError, load_config

    configure_logging(args.log_level)
    if args.port is not None and not 0 <= args.port <= 65535:
        print(f"{PROG}: error: --port: must be in 0..65535, got {args.port}", file=sys.stderr)
        return EXIT_USER_ERROR
    try:
        config = load_config(args.config)
        serve_forever(config, ip=args.ip, port=args.port)
    except (ConfigError, ApiStartError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    return 0


# --------------------------------------------------------------------------- convert


def add_convert(subparsers) -> None:
    p = subparsers.add_parser(
        "convert",
        help="convert a .pth checkpoint to safetensors",
        description=(
            "Convert an RWKV checkpoint (official .pth, or safetensors in either layout) to "
            "safetensors. The input format is recognised from the file's content."
        ),
    )
    p.add_argument("input", metavar="IN", type=Path, help="checkpoint to read (.pth or .st/.safetensors)")
    p.add_argument("output", metavar="OUT", type=Path, nargs="?", help="file to write (default: IN with suffix .st)")
    p.add_argument(
        "--dtype",
        choices=("fp16", "fp32", "bf16"),
        default="fp16",
        help=(
            "storage type of the weights. fp16 halves an fp32 file and is lossless for bf16 "
            "releases in the range weights use; fp32 lets the CPU backend map the file without "
            "any conversion; bf16 keeps official releases bit for bit (default: fp16)"
        ),
    )
    p.add_argument(
        "--layout",
        choices=("official", "web-rwkv"),
        default="official",
        help=(
            "tensor names and layout: 'official' as in BlinkDL's .pth releases, or 'web-rwkv' "
            "as Ai00's converter writes them, for which Ai00 needs --dtype fp16 (default: official)"
        ),
    )
    p.add_argument("--quant", type=int, default=0, metavar="N",
                   help="quantise the projections of the first N layers (a 'prefab' that loads quantised; official "
                        "layout only, read by this server)")
    p.add_argument("--quant-type", choices=("int8", "nf4"), default="int8",
                   help="Int8 (blocks of 128, ~0.52 of fp16) or NF4 (blocks of 64, ~0.27) (default: int8)")
    p.add_argument("--quant-head", action="store_true",
                   help="the head (output matrix) as Int8 blocks too (a prefab, as --quant)")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.set_defaults(handler=cmd_convert)


def cmd_convert(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .rwkv.formats.safetensors import write_safetensors
    from .rwkv.loader import read_checkpoint

    out: Path = args.output or args.input.with_suffix(".st")
    if out.resolve() == args.input.resolve():
        raise ModelFileError(out, "is the input file; choose another output name")
    if out.exists() and not args.force:
        raise ModelFileError(out, "already exists (use --force to overwrite)")
    if args.layout == "web-rwkv" and args.dtype != "fp16":
        print(f"{PROG}: warning: Ai00/web-rwkv only load fp16 files; writing {args.dtype} anyway", file=sys.stderr)

    ckpt = read_checkpoint(args.input, keep_bf16=True)
    if args.quant or args.quant_head:
        from .rwkv.quant import quantise_tensors

        if args.layout != "official":
            raise ModelFileError(out, "a quantised model is written in the official layout only")
        ckpt.tensors = quantise_tensors(ckpt.tensors, args.quant, args.quant_type, head=args.quant_head)
    itemsize = 4 if args.dtype == "fp32" else 2
    total = sum(arr.size for arr in ckpt.tensors.values()) * itemsize
    partial = out.with_name(out.name + ".part")  # never leave a half-written OUT behind
    try:
        with tqdm(total=total, unit="B", unit_scale=True, desc=out.name, file=sys.stderr, disable=None) as bar:
            write_safetensors(
                ckpt.tensors,
                partial,
                layout=args.layout,
                dtype=args.dtype,
                on_tensor=lambda _name, nbytes: bar.update(nbytes),
            )
        os.replace(partial, out)
    except OSError as e:
        raise ModelFileError(out, f"cannot write: {e.strerror or e}") from None
    finally:
        partial.unlink(missing_ok=True)
    info = ckpt.info
    print(
        f"{out}: RWKV v{info.version} L{info.n_layer} D{info.n_embd} vocab {info.vocab}, "
        f"{args.dtype}, {args.layout} layout" + (f", {args.quant} layers {args.quant_type}" if args.quant else "")
        + (", head int8" if args.quant_head else ""),
        file=sys.stderr,
    )
    return 0


# --------------------------------------------------------------------------- generate


def add_generate(subparsers) -> None:
    p = subparsers.add_parser(
        "generate",
        help="load a model and continue a prompt on the command line",
        description="Load an RWKV model (v4–v7, .pth or safetensors) and stream a continuation of PROMPT.",
    )
    p.add_argument("prompt", metavar="PROMPT", help="text to continue")
    p.add_argument("--model", type=Path, required=True, help="model file")
    p.add_argument("--tokenizer", type=Path,
                   help="vocabulary file (default: the model's own, beside it as MODEL_vocab.txt or named in its "
                        "metadata; else the RWKV World vocabulary)")
    p.add_argument("--max-tokens", type=int, default=100, help="tokens to generate at most (default: 100)")
    p.add_argument("--temperature", type=float, default=1.0, help="0 picks the most likely token (default: 1)")
    p.add_argument("--top-p", type=float, default=0.5, help="nucleus probability mass (default: 0.5)")
    p.add_argument("--seed", type=int, help="makes the output reproducible")
    p.add_argument("--stop", action="append", default=[], help="stop before this text (repeatable)")
    p.set_defaults(handler=cmd_generate)


def cmd_generate(args) -> int:
    """Streams through the same middleware and backend threads as the server."""
    import queue

    from .messages import Cancel, Failed, Finished, Generate, Load, Loaded, ModelSpec, TextPiece
    from .middleware import Middleware
    from .sampler import SamplerError, options_from_openai

    if args.max_tokens < 1:
        print(f"{PROG}: error: --max-tokens must be at least 1", file=sys.stderr)
        return EXIT_USER_ERROR
    try:
        options = options_from_openai(temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    except SamplerError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    events: queue.Queue = queue.Queue()
    middleware = Middleware()
    try:
        spec = ModelSpec(path=str(args.model), tokenizer=str(args.tokenizer) if args.tokenizer else None, max_batch=1)
        middleware.send(Load(spec, events.put))
        loaded = events.get()
        if not isinstance(loaded, Loaded):
            print(f"{PROG}: error: {loaded.message}", file=sys.stderr)
            return EXIT_USER_ERROR
        cancel = Cancel()
        middleware.send(Generate(prompt=args.prompt, reply=events.put, cancel=cancel, options=options,
                                 max_tokens=args.max_tokens, stop=tuple(args.stop)))
        while True:
            try:
                event = events.get()
            except KeyboardInterrupt:
                cancel.set()
                raise
            if isinstance(event, TextPiece):
                sys.stdout.write(event.text)
                sys.stdout.flush()
            elif isinstance(event, Finished):
                sys.stdout.write("\n")
                return 0
            elif isinstance(event, Failed):
                print(f"{PROG}: error: {event.message}", file=sys.stderr)
                return EXIT_USER_ERROR
    finally:
        middleware.close()


# --------------------------------------------------------------------------- pull


def add_pull(subparsers) -> None:
    p = subparsers.add_parser(
        "pull",
        help="download a released model from the Hugging Face hub",
        description=(
            "Download a model into the models folder ([model] path of the config): an alias of "
            "the catalogue (--list), or REPO/FILE. An interrupted download resumes; the file "
            "gets its final name only once its SHA-256 matches the hub's. HF_ENDPOINT and "
            "HF_TOKEN are honoured, for mirrors and gated repositories."
        ),
    )
    p.add_argument("name", nargs="?", help="alias (e.g. rwkv7-g1-1.5b) or REPO/FILE")
    p.add_argument("--list", action="store_true", help="list the catalogue and what fits this machine's memory")
    p.add_argument("--dir", type=Path, default=None, help="folder to write to (default: [model] path of the config)")
    p.add_argument("-c", "--config", type=Path, default=None, help="config file (default: ./config.toml)")
    p.add_argument("--convert", choices=("fp16", "bf16", "fp32"), default=None,
                   help="also write it as safetensors of this dtype beside it (as `convert`)")
    p.add_argument("--quant", type=int, default=0, metavar="N",
                   help="also write it as safetensors with the first N layers quantised (as `convert --quant`)")
    p.add_argument("--quant-type", choices=("int8", "nf4"), default="int8")
    p.add_argument("--quant-head", action="store_true", help="the head as Int8 blocks too (as `convert --quant-head`)")
    p.set_defaults(handler=cmd_pull)


def cmd_pull(args) -> int:
    from .config import ConfigError, load_config
    from .hub.catalogue import UnknownModel, load_catalogue, resolve
    from .hub.download import PullError, pull
    from .rwkv.memory import available_bytes

    free = available_bytes()
    if args.list:
        print(f"{'alias':18}{'params':>7}{'size':>10}  {'fits here as':13}file")
        for m in load_catalogue():
            print(f"{m.alias:18}{m.params:>7}{m.size / 1e9:>8.2f}GB  {m.recommended(free) or 'too large':13}"
                  f"{m.repo}/{m.file}")
        return 0
    if not args.name:
        print(f"{PROG}: error: pull: give a model name or --list", file=sys.stderr)
        return EXIT_USER_ERROR
    try:
        folder = args.dir
        if folder is None:
            config = load_config(args.config)
            folder = config.model_dir
        repo, filename, model = resolve(args.name)
        path = pull(repo, filename, folder)
    except (ConfigError, UnknownModel, PullError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    print(path)
    if args.convert or args.quant or args.quant_head:
        converted = argparse.Namespace(input=path, output=None, dtype=args.convert or "bf16", layout="official",
                                       quant=args.quant, quant_type=args.quant_type, quant_head=args.quant_head,
                                       force=False)
        if code := cmd_convert(converted):
            return code
        path = path.with_suffix(".st")
    if model is not None:
        precision = model.recommended(free)
        advice = f'precision = "{precision}"' if precision in ("bf16", None) else f'quant = 1000, quant_type = "{precision}"'
        print(f'to serve it, in [model] of config.toml: name = "{path.name}", thinking = "{model.thinking}", '
              f"{advice if precision else 'it is larger than the free memory'}")
    return 0


# --------------------------------------------------------------------------- lb-config


def add_lb_config(subparsers) -> None:
    p = subparsers.add_parser(
        "lb-config",
        help="write a haproxy.cfg for several replicas of this server",
        description=(
            "Write a HAProxy configuration that spreads requests over the given replicas by a "
            "consistent hash of each conversation's affinity key (prompt_cache_key, then the "
            "X-Session-Id header, then user, then the first message), with health checks on /health. "
            "Replicas may serve different models: a request whose JSON `model` only some replicas "
            "serve goes to those replicas; one without `model`, or naming a model no list has, goes "
            "to the replicas given without a list (or to all of them, when every replica has one)."
        ),
    )
    p.add_argument("--replica", action="append", required=True, metavar="URL[=MODEL,...]",
                   help="a replica, such as http://10.0.0.2:65530 (repeat for each). One that serves only some "
                        "models lists them: http://10.0.0.2:65530=small,org/large:7b (every name clients send "
                        "for them, ids and aliases; letters, digits and . _ : / @ + ~ -). Without a list, a "
                        "replica serves every model")
    p.add_argument("--port", type=int, default=8080, help="port HAProxy listens on (default: 8080)")
    p.add_argument("--bind", default="0.0.0.0", help="address HAProxy listens on (default: 0.0.0.0)")
    p.add_argument("-o", "--output", type=Path, default=None, help="file to write (default: standard output)")
    p.set_defaults(handler=cmd_lb_config)


def cmd_lb_config(args) -> int:
    from .lb_config import haproxy_config

    try:
        text = haproxy_config(args.replica, args.port, args.bind, args.output.name if args.output else "haproxy.cfg")
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text, encoding="utf-8")
    return 0
