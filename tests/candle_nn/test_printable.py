"""``candle_nn.cli.printable``: text from files (class names, tensor names, metadata) printed
within one line, its control characters escaped; and the text outputs that use it (the validation
table, ``candle-nn-weights inspect``) on hostile names."""

from __future__ import annotations

import codecs

import numpy as np
from safetensors.numpy import save_file

from candle_nn.cli import printable

MOVERS = [chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))] + [
    "\u2028", "\u2029", "\u202e", "\u2066", "\u200f"]  # separators, bidi overrides and marks


def test_control_characters_become_their_escapes():
    """Each one alone and inside a name: ASCII, printable, and Python's unicode_escape decoder
    gives the original back (so nothing is lost, only shown)."""
    for c in MOVERS:
        for text in (c, f"cat{c}dog"):
            shown = printable(text)
            assert shown.isascii() and shown.isprintable(), repr(text)
            assert codecs.decode(shown, "unicode_escape") == text, repr(text)
    kept = "héllo wörld 猫 🐈 a-b_c.d (e) 50%"
    assert printable(kept) is kept


def test_validation_table_and_weights_report_escape_names(tmp_path):
    from candle_nn_models.yolo_v8_metrics import DetectionMetrics
    from candle_nn_models.weights.inspection import format_report, inspect_file

    names = ["\x1b[2Jcat\nall     1  1  1  1  1  1", "dog\r"]
    metrics = DetectionMetrics(names)
    box = np.array([[10.0, 10.0, 50.0, 50.0]])
    metrics.update(box, [0.9], [0], box, [0])
    metrics.update(box, [0.8], [1], box + 5, [1])
    lines = metrics.results().table().split("\n")
    assert len(lines) == 4 and all(line.isprintable() for line in lines), lines
    assert "\\x1b[2Jcat\\nall" in lines[2] and "dog\\r" in lines[3], lines

    path = tmp_path / "odd.safetensors"
    save_file({"w\x1b]0;title\x07": np.zeros(2, np.float32), "x\ny": np.zeros(1, np.float32)},
              str(path), metadata={"note\x1b[31m": "line one\nline two\u202e"})
    text = format_report(inspect_file(path))
    assert all(line.isprintable() for line in text.split("\n")), text
    for shown in ("w\\x1b]0;title\\x07", "x\\ny", "note\\x1b[31m = line one\\nline two\\u202e"):
        assert shown in text, text
