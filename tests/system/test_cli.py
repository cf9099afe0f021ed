"""The command line as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ai00_like.rwkv.formats.safetensors import write_safetensors
from ai00_like.rwkv.synthetic import make_checkpoint


def run(*args):
    return subprocess.run([sys.executable, "-m", "ai00_like", *args], capture_output=True, text=True, timeout=120,
                          check=False)


def test_generate_streams_a_reproducible_continuation(tmp_path):
    model = tmp_path / "tiny.st"
    write_safetensors(make_checkpoint("7", n_layer=2, n_embd=64, head_size=32, vocab=65536, seed=5), model)
    first = run("generate", "--model", str(model), "--max-tokens", "8", "--seed", "7", "Once upon a time")
    second = run("generate", "--model", str(model), "--max-tokens", "8", "--seed", "7", "Once upon a time")
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout and first.stdout.strip()


def test_generate_reports_a_missing_model_in_one_line(tmp_path):
    result = run("generate", "--model", str(tmp_path / "missing.st"), "hello")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "missing.st" in lines[0] and "not found" in lines[0]


def test_generate_rejects_bad_sampling_values(tmp_path):
    result = run("generate", "--model", str(tmp_path / "x.st"), "--top-p", "2", "hello")
    assert result.returncode == 2 and "top_p" in result.stderr


def test_argument_mistakes_are_one_line_with_status_2():
    for args, named in ((["generate", "hello"], "--model"), (["--port", "eighty"], "--port"),
                        (["convert"], "IN"), (["frobnicate"], "frobnicate")):
        result = run(*args)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, (args, result.stderr)
        assert lines[0].startswith("ai00-like: error: ") and named in lines[0] and "--help" in lines[0], lines


DEMO = Path(__file__).resolve().parents[2] / "assets" / "models"


def test_generate_without_a_runtime_dir_prints_no_driver_noise():
    # Mesa's Vulkan drivers (the adapter probe of device "auto") complain on stderr when
    # XDG_RUNTIME_DIR is unset, as it is for services and root shells.
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    result = subprocess.run([sys.executable, "-m", "ai00_like", "generate", "--model", str(DEMO / "demo.st"),
                             "--tokenizer", str(DEMO / "demo_vocab.txt"), "--max-tokens", "4", "--seed", "1",
                             "In the beginning"], capture_output=True, text=True, timeout=120, check=False, env=env)
    assert result.returncode == 0 and result.stdout.strip(), result.stderr
    assert "XDG_RUNTIME_DIR" not in result.stderr


def test_a_tokenizer_of_another_model_is_one_line_naming_the_option(tmp_path):
    alone = tmp_path / "demo.st"  # without demo_vocab.txt beside it: the World vocabulary is used
    alone.write_bytes((DEMO / "demo.st").read_bytes())
    result = run("generate", "--model", str(alone), "--max-tokens", "4", "In the beginning")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "does not belong to this model" in lines[0] and "--tokenizer" in lines[0]
