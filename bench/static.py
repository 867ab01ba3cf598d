"""Static-analysis speed on a real corpus nobody here wrote: the installed torch package's own .py files.

Prints, in one run and on the same files: a bare libcst parse (the floor), torchreview with one
job and with all jobs, and TorchFix (``pip install torchfix``) with one job and all jobs; files,
seconds, files/s and peak memory (max RSS of the measuring process tree) for each.

    python bench/static.py                 # every .py file of torch
    python bench/static.py --sample 5      # every 5th file (TorchFix takes ~50 CPU-minutes on all)
    python bench/static.py --sample 10 --repeat 3 --skip torchfix   # best of 3 rounds: for a busy machine
    python bench/static.py --skip torchfix
    python bench/static.py --rules default   # the default set of stable rules (what a plain check runs; default: all)
    python bench/static.py --only-cache    # the results cache: a cold run, then a warm re-run
    python bench/static.py --under nn --under optim --under utils/data --only-paired   # issue 25's 205 files:
                                           # the paired ratio alone, with the worst file's own ratio
    python bench/static.py --under nn --under optim --under utils/data --only-paired --repeat 3   # each file's
                                           # best of 3 rounds: one noisy file no longer decides the worst ratio

Each measurement runs in a fresh subprocess so memory and import costs do not leak between tools.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]


def torch_files(sample: int, under: list[str] = ()) -> list[str]:
    """Every ``sample``-th .py file of the installed torch package, or of its folders ``under`` (``nn``, ``utils/data``)."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("torch is not installed: pip install torch==2.13.0")
    root = Path(list(spec.submodule_search_locations)[0])
    folders = [root / folder for folder in under] or [root]
    for folder in folders:
        if not folder.is_dir():
            sys.exit(f"--under {folder.relative_to(root)}: no such folder in {root}")
    files = sorted({str(p) for folder in folders for p in folder.rglob("*.py")})
    return files[::sample]


def within_size_cap(files: list[str]) -> tuple[list[str], list[str]]:
    """torchreview reports files over its size cap as errors instead of parsing them; compare like with like."""
    sys.path.insert(0, str(ROOT))
    from analyzers.engine import MAX_FILE_BYTES

    kept = [f for f in files if os.path.getsize(f) <= MAX_FILE_BYTES]
    return kept, sorted(set(files) - set(kept))


def measure(argv: list[str]) -> tuple[float, float, str, float]:
    """Wall seconds, peak RSS in MiB (largest process of its tree), stdout, and the tree's CPU seconds (on a
    busy machine they move far less than wall time)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True, cwd=ROOT)
        # wait4 gives this child's own rusage (its reaped descendants included), not a running max
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{argv[:3]} exited {proc.returncode}: {stderr[-2000:]}")
    return seconds, usage.ru_maxrss / 1024, stdout, usage.ru_utime + usage.ru_stime


# ---- workers (run in the subprocess) -----------------------------------------------------------


def worker_parse(filelist: str) -> None:
    import libcst as cst

    ok = failed = 0
    for path in Path(filelist).read_text().splitlines():
        try:
            cst.parse_module(Path(path).read_text(encoding="utf-8"))
            ok += 1
        except Exception:
            failed += 1
    print(json.dumps({"parsed": ok, "failed": failed}))


def worker_paired(filelist: str) -> None:
    """File by file in one process: a bare parse, then the whole analysis (which parses again). On a
    machine shared with other work both halves of a pair see the same load, so their ratio holds."""
    sys.path.insert(0, str(ROOT))
    import libcst as cst

    from analyzers.engine import analyze_file

    config = _config()
    # once per process, not per file: importing the rule modules, and libcst's first parse
    analyze_file(Path(__file__), __file__, config)
    cst.parse_module("import torch\n")
    parse = analysis = 0.0
    files = []  # (analysis / parse, parse seconds, path)
    for path in Path(filelist).read_text().splitlines():
        started = time.process_time()
        try:
            cst.parse_module(Path(path).read_text(encoding="utf-8"))
        except Exception:
            pass
        middle = time.process_time()
        analyze_file(Path(path), path, config)
        ended = time.process_time()
        parse += middle - started
        analysis += ended - middle
        files.append(((ended - middle) / max(middle - started, 1e-6), middle - started, path))
    print(json.dumps({"files": [[path, seconds, ratio * max(seconds, 1e-6)] for ratio, seconds, path in files]}))


def paired_summary(rounds: list[list]) -> dict:
    """Per file, the least parse time and the least analysis time over rounds run in fresh processes (each
    round sees the same caches at the same file, so a busy machine only ever adds time), then the totals and
    the worst files from those."""
    best: dict[str, list[float]] = {}
    for files in rounds:
        for path, parse_s, analysis_s in files:
            kept = best.setdefault(path, [parse_s, analysis_s])
            kept[0], kept[1] = min(kept[0], parse_s), min(kept[1], analysis_s)
    files = [(analysis_s / max(parse_s, 1e-6), parse_s, path) for path, (parse_s, analysis_s) in best.items()]
    parse = sum(seconds for _, seconds, _ in files)
    analysis = sum(ratio * max(seconds, 1e-6) for ratio, seconds, _ in files)
    measurable = [f for f in files if f[1] >= _MEASURABLE_PARSE_S]
    return {"parse_cpu_s": round(parse, 2), "torchreview_cpu_s": round(analysis, 2),
            "ratio": round(analysis / parse, 3) if parse else 0.0, "worst_file": _worst(files),
            "worst_measurable_file": _worst(measurable), "measurable_files": len(measurable), "rounds": len(rounds)}


# A file whose parse takes less than this is mostly the fixed cost of one analysis (reading, configuration,
# starting each rule): its own ratio says little about the engine's cost per line.
_MEASURABLE_PARSE_S = 0.005


def _worst(files: list) -> Optional[dict]:
    if not files:
        return None
    ratio, seconds, path = max(files)
    return {"ratio": round(ratio, 2), "parse_ms": round(1000 * seconds, 2), "path": path}


def worker_torchreview(filelist: str, jobs: int) -> None:
    sys.path.insert(0, str(ROOT))
    from analyzers.engine import analyze_files

    files = [(Path(p), p) for p in Path(filelist).read_text().splitlines()]
    run = analyze_files(files, _config(), jobs=jobs)
    internal = [e for e in run.errors if e.kind == "rule-error"]
    print(json.dumps({"findings": len(run.findings), "errors": len(run.errors), "rule_errors": len(internal),
                      "rule_error_samples": [e.to_dict() for e in internal[:5]]}))


def worker_torchreview_cached(filelist: str, jobs: int, cache_dir: str) -> None:
    sys.path.insert(0, str(ROOT))
    from analyzers.cache import ResultCache
    from analyzers.engine import analyze_files

    files = [(Path(p), p) for p in Path(filelist).read_text().splitlines()]
    run = analyze_files(files, _config(), jobs=jobs, cache=ResultCache.in_directory(Path(cache_dir)))
    print(json.dumps({"findings": len(run.findings), "errors": len(run.errors), "cached": run.cached,
                      "results": sorted(json.dumps(f.to_dict(), sort_keys=True) for f in run.findings)}))


def measure_cache(me: list[str], files: list[str], jobs: int) -> tuple[list, list[str]]:
    """A cold run into an empty cache, then a warm re-run of the same files: both must report the same."""
    rows, notes = [], []
    with tempfile.TemporaryDirectory(prefix="torchreview-cache-") as cache_dir:
        outputs = []
        for label in ("cold", "warm"):
            seconds, peak, out, _ = measure([*me, "--worker", "torchreview-cached", "--jobs", str(jobs),
                                          "--cache-dir", cache_dir])
            data = json.loads(out)
            outputs.append(data.pop("results"))
            rows.append((f"torchreview, {label} cache", jobs, seconds, peak))
            notes.append(f"torchreview -j{jobs} {label} cache: {json.dumps(data)}")
        cold, warm = rows[0][2], rows[1][2]
        same = "identical findings" if outputs[0] == outputs[1] else "FINDINGS DIFFER"
        notes.append(f"cache -j{jobs}: cold {cold:.1f} s, warm {warm:.2f} s = {100 * warm / cold:.1f}% of cold; {same}")
    return rows, notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample", type=int, default=1, help="take every Nth file (default: all)")
    parser.add_argument("--skip", action="append", default=[], choices=["parse", "torchreview", "torchfix"])
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds of parse and torchreview -j1, interleaved; the best of each is kept (a busy "
                             "machine only ever adds time); with --only-paired, rounds of the paired worker in fresh "
                             "processes, each file's best parse and best analysis kept")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--filelist", help=argparse.SUPPRESS)
    parser.add_argument("--jobs", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    parser.add_argument("--rules", choices=["all", "default"], default="all",
                        help="every rule, preview ones included (default), or the default set of stable rules")
    parser.add_argument("--only-cache", action="store_true",
                        help="measure only the results cache: torchreview cold, then warm (one job and all jobs)")
    parser.add_argument("--under", action="append", default=[],
                        help="only the files under this folder of the torch package (nn, optim, utils/data); repeatable")
    parser.add_argument("--only-paired", action="store_true",
                        help="measure only the paired ratio, file by file in one process (and the worst file's)")
    args = parser.parse_args()
    os.environ[_RULES_VARIABLE] = args.rules if args.worker is None else os.environ.get(_RULES_VARIABLE, "all")
    if args.worker == "paired":
        return worker_paired(args.filelist)
    if args.worker == "parse":
        return worker_parse(args.filelist)
    if args.worker == "torchreview":
        return worker_torchreview(args.filelist, args.jobs)
    if args.worker == "torchreview-cached":
        return worker_torchreview_cached(args.filelist, args.jobs, args.cache_dir)

    files, oversized = within_size_cap(torch_files(args.sample, args.under))
    cores = os.cpu_count() or 1
    lines = sum(1 for f in files for _ in open(f, encoding="utf-8", errors="replace"))
    print(f"corpus: {len(files)} .py files of the installed torch package ({lines:,} lines), {cores} cores")
    for path in oversized:
        print(f"  left out for every tool (over torchreview's {os.path.getsize(path):,}-byte file cap): {path}")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write("\n".join(files))
        filelist = handle.name
    me = [sys.executable, __file__, "--filelist", filelist]
    rows = []
    notes = []
    if args.only_cache:
        args.skip = ["parse", "torchreview", "torchfix"]
        for jobs in sorted({1, cores}):
            cache_rows, cache_notes = measure_cache(me, files, jobs)
            rows += cache_rows
            notes += cache_notes
    if args.only_paired:
        args.skip = ["parse", "torchreview", "torchfix"]
        notes.append(_paired_note(me, args.repeat))
    best: dict[str, tuple] = {}
    for _ in range(max(1, args.repeat)):
        for tool in ("parse", "torchreview"):
            if tool in args.skip:
                continue
            argv = [*me, "--worker", tool] + (["--jobs", "1"] if tool == "torchreview" else [])
            seconds, peak, out, cpu = measure(argv)
            kept = best.get(tool)
            best[tool] = (min(seconds, kept[0]), max(peak, kept[1]), out, min(cpu, kept[3])) if kept \
                else (seconds, peak, out, cpu)
    if "parse" not in args.skip and "torchreview" not in args.skip:
        notes.append(_paired_note(me, args.repeat))
    if "parse" in best:
        seconds, peak, out, cpu = best["parse"]
        rows.append(("libcst parse only (floor)", 1, seconds, peak, cpu))
        notes.append(f"parse: {out.strip()}")
    if "torchreview" in best:
        seconds, peak, out, cpu = best["torchreview"]
        rows.append((f"torchreview ({_rule_count()})", 1, seconds, peak, cpu))
        notes.append(f"torchreview -j1: {out.strip()}")
        if cores > 1:
            seconds, peak, out, cpu = measure([*me, "--worker", "torchreview", "--jobs", str(cores)])
            rows.append((f"torchreview ({_rule_count()})", cores, seconds, peak, cpu))
            notes.append(f"torchreview -j{cores}: {out.strip()}")
    if "torchfix" not in args.skip:
        exe = Path(sys.executable).with_name("torchfix")
        if not exe.exists():
            notes.append("torchfix: not installed (pip install torchfix); skipped")
        else:
            for jobs in (1, cores):
                seconds, peak, out, cpu = measure([str(exe), "--select", "ALL", "--jobs", str(jobs), *files])
                rows.append(("TorchFix (--select ALL, 16 rules)", jobs, seconds, peak, cpu))
                notes.append(f"torchfix -j{jobs}: {len(out.splitlines())} findings")
    os.unlink(filelist)

    if rows:
        print()
        print(f"| {'tool':<36} | jobs | files | seconds | files/s | peak RSS MiB | x parse | CPU s | x parse CPU |")
        print(f"|{'-' * 38}|-----:|------:|--------:|--------:|-------------:|--------:|------:|------------:|")
        floor = next((r[2] for r in rows if r[0].startswith("libcst")), None)
        floor_cpu = next((r[4] for r in rows if r[0].startswith("libcst")), None)
        for name, jobs, seconds, peak, *cpu in rows:
            ratio = f"{seconds / floor:.2f}" if floor else ""
            cpu_seconds = f"{cpu[0]:.1f}" if cpu else ""
            cpu_ratio = f"{cpu[0] / floor_cpu:.2f}" if cpu and floor_cpu and jobs == 1 else ""  # -jN spends more CPU for less wall
            print(f"| {name:<36} | {jobs:>4} | {len(files):>5} | {seconds:>7.1f} | {len(files) / seconds:>7.1f} "
                  f"| {peak:>12.0f} | {ratio:>7} | {cpu_seconds:>5} | {cpu_ratio:>11} |")
    for note in notes:
        print(note)


def _paired_note(me: list[str], repeat: int = 1) -> str:
    rounds = [json.loads(measure([*me, "--worker", "paired"])[2])["files"] for _ in range(max(1, repeat))]
    paired = paired_summary(rounds)
    best_of = f", each file's best of {paired['rounds']} rounds" if paired["rounds"] > 1 else ""
    note = (f"paired, file by file in one process (CPU, the fairest figure on a busy machine{best_of}): parse "
            f"{paired['parse_cpu_s']} s, torchreview -j1 {paired['torchreview_cpu_s']} s = "
            f"{paired['ratio']:.2f}x the parse (index included)")
    for key, label in (("worst_file", "worst file"),
                       ("worst_measurable_file", f"worst of the {paired['measurable_files']} files parsing in "
                                                 f"{1000 * _MEASURABLE_PARSE_S:.0f} ms or more")):
        worst = paired[key]
        if worst is not None:
            note += f"\n  {label}: {worst['ratio']:.2f}x its parse of {worst['parse_ms']} ms, {worst['path']}"
    return note


_RULES_VARIABLE = "TORCHREVIEW_BENCH_RULES"  # the parent's --rules, for its measuring subprocesses


def _config():
    """Every rule (preview included), or the default set a plain ``torchreview check`` runs."""
    sys.path.insert(0, str(ROOT))
    from analyzers.config import Config

    return Config(preview=os.environ.get(_RULES_VARIABLE, "all") == "all")


def _rule_count() -> str:
    sys.path.insert(0, str(ROOT))
    from analyzers import levels
    from analyzers.rules import all_rules

    if os.environ.get(_RULES_VARIABLE, "all") == "all":
        return f"all {len(all_rules())} rules"
    return f"{sum(1 for rule in all_rules() if not levels.is_preview(rule.id))} stable rules"


if __name__ == "__main__":
    main()
