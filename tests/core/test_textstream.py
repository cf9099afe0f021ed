"""TextStream: what a streaming client sees, token by token, with stop strings and UTF-8."""

from __future__ import annotations

import random

import pytest

from ai00_like.backend.textstream import TextStream


def run(chunks: list[bytes], stop: list[str]) -> tuple[list[str], bool, str]:
    """Push every chunk; returns the pieces emitted by push, whether it stopped, and
    what finish() added."""
    stream = TextStream(stop)
    pieces = []
    for chunk in chunks:
        piece = stream.push(chunk)
        pieces.append(piece.text)
        if piece.stopped:
            break
    return pieces, stream.stopped, stream.finish()


def output(chunks: list[bytes], stop: list[str]) -> tuple[str, bool]:
    pieces, stopped, tail = run(chunks, stop)
    return "".join(pieces) + tail, stopped


def reference(text: str, stop: list[str]) -> tuple[str, bool]:
    """The specified result, computed on the whole text at once: cut before the stop
    string that completes first (the longest one on a tie), if any."""
    best = None  # (end, -length, start)
    for s in stop:
        if not s:
            continue
        at = text.find(s)
        if at >= 0:
            key = (at + len(s), -len(s), at)
            best = key if best is None or key < best else best
    if best is None:
        return text, False
    return text[: best[2]], True


def test_plain_text_is_streamed_as_it_comes():
    stream = TextStream([])
    assert stream.push(b"Hello").text == "Hello"
    assert stream.push(b", world").text == ", world"
    assert stream.finish() == ""
    assert stream.text_so_far == "Hello, world"
    assert stream.emitted_chars == 12


def test_incomplete_utf8_is_held_until_the_character_completes():
    euro = "€".encode()  # 3 bytes
    stream = TextStream([])
    assert stream.push(b"a" + euro[:1]).text == "a"
    assert stream.push(euro[1:2]).text == ""
    assert stream.push(euro[2:] + b"b").text == "€b"


def test_finish_emits_invalid_trailing_bytes_as_replacement_character():
    stream = TextStream([])
    assert stream.push(b"ok" + "€".encode()[:2]).text == "ok"
    assert stream.finish() == "\ufffd"


def test_stop_string_prefix_is_held_back_then_released_when_it_does_not_match():
    stream = TextStream(["\n\nUser"])
    assert stream.push(b"Hi.\n").text == "Hi."
    assert stream.push(b"\n").text == ""
    assert stream.push(b"Us").text == ""
    piece = stream.push(b"ually")
    assert (piece.text, piece.stopped) == ("\n\nUsually", False)


def test_stop_string_split_over_three_tokens():
    pieces, stopped, tail = run([b"The end", b"\n\nU", b"se", b"r: more"], ["\n\nUser:"])
    assert "".join(pieces) == "The end"
    assert stopped and tail == ""


def test_nothing_after_the_match_is_emitted_ever():
    stream = TextStream(["STOP"])
    piece = stream.push(b"abcSTOPdef")
    assert (piece.text, piece.stopped) == ("abc", True)
    assert stream.push(b"more").text == ""
    assert stream.finish() == ""
    assert stream.text_so_far == "abc"


def test_overlapping_pattern_is_found():
    # Ai00's scan without backtracking misses "aab" in "aaab".
    assert output([b"a", b"a", b"a", b"b", b"c"], ["aab"]) == ("a", True)
    assert output([b"aaab"], ["aab"]) == ("a", True)


def test_first_completed_stop_wins_whatever_the_token_split():
    # "bc" completes before "abcd"; the result must not depend on the split.
    assert output([b"abcd"], ["abcd", "bc"]) == ("a", True)
    assert output([b"a", b"b", b"c", b"d"], ["abcd", "bc"]) == ("a", True)
    # Completing at the same character: the longer (earlier-starting) one wins.
    assert output([b"xabc"], ["abc", "bc"]) == ("x", True)


def test_multibyte_stop_strings():
    text = "第一句。\n第二句"
    data = text.encode()
    for split in range(1, len(data)):
        assert output([data[:split], data[split:]], ["。\n"]) == ("第一句", True)
    emoji = "🙂"
    data = ("hi " + emoji + " there").encode()
    assert output([bytes([b]) for b in data], [emoji]) == ("hi ", True)


def test_stop_string_starting_inside_a_split_multibyte_character():
    # The stop begins with "é"; the token boundary cuts é's two bytes apart.
    e = "é".encode()
    pieces, stopped, _ = run([b"caf" + e[:1], e[1:] + b"!", b" ok"], ["é!"])
    assert "".join(pieces) == "caf" and stopped


def test_finish_emits_held_back_tail():
    # Generation ended (max_tokens) while "\n\nUs" could still have become a stop string:
    # Ai00 loses this text; we emit it.
    pieces, stopped, tail = run([b"Answer.", b"\n\nUs"], ["\n\nUser:"])
    assert "".join(pieces) == "Answer."
    assert not stopped and tail == "\n\nUs"


def test_empty_stop_strings_are_ignored():
    assert output([b"abc"], ["", "zz"]) == ("abc", False)
    assert TextStream([""]).push(b"x").text == "x"


def test_a_single_string_is_one_stop_not_its_characters():
    assert output([b"abcde"], "cd") == ("ab", True)


def test_held_back_text_stays_short():
    stream = TextStream(["</answer>"])
    for _ in range(1000):
        stream.push(b"<answer")  # always a live prefix at the end, never a match
        assert len(stream.held_back) <= len("</answer>") - 1
    assert stream.emitted_chars == 7000 - len(stream.held_back)


@pytest.mark.parametrize("seed", range(8))
def test_random_splits_reassemble_exactly(seed):
    rng = random.Random(seed)
    alphabet = ["a", "b", "\n", "é", "€", "🙂", "。", " "]
    stops_pool = ["ab", "aab", "\n\n", "é€", "🙂a", "。\n", "b a", "€€€"]
    for _ in range(40):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        stop = rng.sample(stops_pool, rng.randint(0, 3))
        data = text.encode()
        cuts = sorted(rng.sample(range(1, len(data)), rng.randint(0, max(0, len(data) - 1)))) if len(data) > 1 else []
        chunks = [data[i:j] for i, j in zip([0, *cuts], [*cuts, len(data)])]
        got = output(chunks, stop)
        assert got == reference(text, stop), (text, stop, chunks)


def test_random_byte_splits_never_emit_partial_characters_or_stop_text():
    rng = random.Random(1234)
    text = "Hello 世界! Stop here: END and never this 🙂" * 3
    data = text.encode()
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(data)), 30))
        chunks = [data[i:j] for i, j in zip([0, *cuts], [*cuts, len(data)])]
        pieces, stopped, tail = run(chunks, ["END"])
        assert stopped and tail == ""
        assert "".join(pieces) == "Hello 世界! Stop here: "
        assert all("\ufffd" not in p for p in pieces)
