"""``candle-nn-bench``'s outputs: the ratio table, a terminal table, JSON and a PNG chart.

Ratios are **time ours / time theirs** for the same model, device and dtype, measured in the same
run: below 1.0 candle_nn is faster. ``bs1`` compares steady batch-1 medians; ``batch`` compares
time per image at the throughput batch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from candle_nn import CandleNNError
from candle_nn.atomic_write import atomic_write

OURS_PREFIX = "candle_nn"


def read_saved_run(path: str) -> dict:
    """A run saved by ``--json``, or :class:`CandleNNError` (one line: what, where, how to fix)."""
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise CandleNNError(f"cannot read the saved run {path}: {exc}") from None
    if not isinstance(report, dict) or not isinstance(report.get("results"), list):
        raise CandleNNError(f"{path} is not a run saved by candle-nn-bench --json (no 'results' "
                            "list); make one with `python -m benchmarks ... --json FILE`")
    return report


def _key(row: dict) -> tuple:
    return row["model"], row["device"], row["dtype"]


def ratios(rows: list[dict]) -> list[dict]:
    """One entry per (ours, peer) pair of measured rows with the same model, device and dtype."""
    ok = [r for r in rows if r["status"] == "ok"]
    out = []
    for ours in (r for r in ok if r["impl"].startswith(OURS_PREFIX)):
        for peer in (r for r in ok if not r["impl"].startswith(OURS_PREFIX)):
            if _key(peer) != _key(ours):
                continue
            out.append({
                "model": ours["model"], "device": ours["device"], "dtype": ours["dtype"],
                "ours": ours["impl"], "peer": peer["impl"],
                "bs1": ours["median_ms"] / peer["median_ms"],
                "batch": peer["throughput_ips"] / ours["throughput_ips"],
                "batch_size": ours["batch"] if ours["batch"] == peer["batch"] else None,
                "load": (ours["load_s"] / peer["load_s"]) if peer.get("load_s") else None,
            })
    return out


def build(meta: dict, rows: list[dict]) -> dict:
    """The full report: ``{"meta", "results", "ratios"}`` (what ``--json`` writes)."""
    return {"meta": meta, "results": rows, "ratios": ratios(rows)}


def merge(reports: list[dict]) -> dict:
    """Several saved runs as one report (a GPU table measured one model and dtype per run):
    their results side by side, the ratios recomputed, the first run's ``meta`` with every
    run's command under ``runs``."""
    meta = dict(reports[0]["meta"])
    meta["runs"] = [r["meta"].get("command") for r in reports]
    return build(meta, [row for r in reports for row in r["results"]])


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _grid(header: list[str], body: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header] + body) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i > 3 else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in body])


def table(report: dict) -> str:
    """Measurements, then ratios, then what was unavailable (with why), as plain text."""
    rows = report["results"]
    measured = [r for r in rows if r["status"] == "ok"]
    head = ["model", "device", "dtype", "impl", "load s", "first s", "bs1 med ms", "bs1 p90 ms",
            "batch", "img/s"]
    body = [[r["model"], r["device"], r["dtype"], r["impl"], _fmt(r["load_s"], ".3f"),
             _fmt(r["first_s"], ".3f"), _fmt(r["median_ms"], ".2f"), _fmt(r["p90_ms"], ".2f"),
             str(r["batch"]), _fmt(r["throughput_ips"], ".1f")] for r in measured]
    meta = report["meta"]
    blas = meta["info"]["blas"]
    kind = meta["info"].get("cpu")  # the CPU's kind and micro-kernels (cpu_model.py)
    kind = (f"; {kind['microarchitecture']}, micro-kernels GEMM {kind['gemm']} / Winograd "
            f"{kind['winograd']}") if kind else ""
    parts = [f"candle_nn {meta['info']['candle_nn']} / MLX {meta['info']['mlx']}; CPU BLAS: "
             f"{blas['name']}; threads: {meta['options']['threads'] or 'default'}; "
             f"{meta.get('cpu') or ''} ({meta.get('cpu_count')} cores{kind})",
             _grid(head, body) + ("" if body else "\n(nothing measured)")]
    if report["ratios"]:
        rhead = ["model", "device", "dtype", "ours / peer", "bs1 ×", "batch ×", "load ×"]
        rbody = [[q["model"], q["device"], q["dtype"], f"{q['ours']} / {q['peer']}",
                  _fmt(q["bs1"], ".2f"), _fmt(q["batch"], ".2f"), _fmt(q["load"], ".2f")]
                 for q in report["ratios"]]
        parts.append("ratios: time ours / time theirs, same run (< 1: candle_nn faster)\n"
                     + _grid(rhead, rbody))
    outputs = [r for r in measured if r.get("output")]
    if outputs:  # what a pipeline returned (benchmarks/bench_amg.py: masks per image)
        parts.append("outputs:\n" + "\n".join(
            f"  {r['model']} {r['device']} {r['dtype']} {r['impl']}: {r['output']}"
            for r in outputs))
    missing = [r for r in rows if r["status"] != "ok"]
    if missing:
        parts.append("not measured:\n" + "\n".join(
            f"  {r['model']} {r['device']} {r['dtype']} {r['impl']}: {r['status']} - {r['reason']}"
            for r in missing))
    return "\n\n".join(parts)


def markdown(report: dict) -> str:
    """A Markdown table for the README: one line per model, device and dtype, with candle_nn's
    batch-1 median and throughput and its ratios to each measured peer."""
    rows = [r for r in report["results"] if r["status"] == "ok"]
    peers = list(dict.fromkeys(r["impl"] for r in rows if not r["impl"].startswith(OURS_PREFIX)))
    head = ["model", "device", "dtype", "candle_nn bs1 ms", "batch img/s", "load s"]
    for peer in peers:
        head += [f"{peer} bs1 ms", f"× {peer} (bs1 / batch)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for ours in (r for r in rows if r["impl"].startswith(OURS_PREFIX)):
        name = ours["model"] + ("" if ours["impl"] == OURS_PREFIX else f" ({ours['impl'][10:]})")
        cells = [name, ours["device"], ours["dtype"], f"{ours['median_ms']:.1f}",
                 f"{ours['throughput_ips']:.1f} (bs{ours['batch']})", f"{ours['load_s']:.2f}"]
        for peer in peers:
            hit = next((r for r in rows if r["impl"] == peer and _key(r) == _key(ours)), None)
            ratio = next((q for q in report["ratios"] if q["peer"] == peer
                          and q["ours"] == ours["impl"] and _key(q) == _key(ours)), None)
            cells += ["-" if hit is None else f"{hit['median_ms']:.1f}",
                      "-" if ratio is None else f"{ratio['bs1']:.2f} / {ratio['batch']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_json(report: dict, path: str | os.PathLike) -> None:
    """Write the report (whole or not at all, as every file here)."""
    with atomic_write(path) as tmp:
        tmp.write_text(json.dumps(report, indent=2) + "\n")


def write_markdown(report: dict, path: str | os.PathLike) -> None:
    """Write :func:`markdown`'s table."""
    with atomic_write(path) as tmp:
        tmp.write_text(markdown(report))


def write_chart(report: dict, path: str | os.PathLike) -> str:
    """A PNG bar chart of batch-1 latency per model and implementation (one panel per device
    and dtype, log scale). Returns a one-line message (also when matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "chart skipped: matplotlib not installed (pip install 'candle-nn-mlx[bench]')"
    measured = [r for r in report["results"] if r["status"] == "ok"]
    if not measured:
        return "chart skipped: nothing measured"
    panels = sorted({(r["device"], r["dtype"]) for r in measured})
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 3.6 * len(panels)), squeeze=False)
    for ax, (device, dtype) in zip(axes[:, 0], panels):
        group = [r for r in measured if (r["device"], r["dtype"]) == (device, dtype)]
        models = list(dict.fromkeys(r["model"] for r in group))
        impls = list(dict.fromkeys(r["impl"] for r in group))
        width = 0.8 / len(impls)
        for j, impl in enumerate(impls):
            xs, ys = [], []
            for i, model in enumerate(models):
                hit = next((r for r in group if r["model"] == model and r["impl"] == impl), None)
                if hit:
                    xs.append(i + (j - (len(impls) - 1) / 2) * width)
                    ys.append(hit["median_ms"])
            bars = ax.bar(xs, ys, width, label=impl)
            ax.bar_label(bars, labels=[f"{y:.3g}" for y in ys], fontsize=7)
        ax.set_xticks(range(len(models)), models)
        ax.set_yscale("log")
        ax.set_ylabel("batch-1 median, ms (log)")
        ax.set_title(f"{device}, {dtype}: lower is faster")
        ax.legend(fontsize=8)
    meta = report["meta"]
    fig.suptitle(f"candle-nn-bench  ({meta.get('cpu') or ''}; threads "
                 f"{meta['options']['threads'] or 'default'}; BLAS "
                 f"{meta['info']['blas']['name'].split(',')[0]})", fontsize=9)
    fig.tight_layout()
    with atomic_write(path) as tmp:  # PNG: the temporary file keeps the suffix
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return f"wrote {path}"
