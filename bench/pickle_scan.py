"""Scanning a big checkpoint: ``torchreview check`` on zip-format and legacy torch checkpoints of ~2 GB of
tensor data (with an ``os.system`` payload in the zip one) and a pickle with 2 GB of bytes inline.

Each file is scanned by a fresh ``torchreview check --format json`` process; printed: the file's size,
wall seconds, the process's peak memory (VmHWM) and the rules reported. The tensor data comes from a
sparse file mapped into memory, so building the files needs disk, not RAM.

    python bench/pickle_scan.py             # ~2 GB each (needs ~6 GB of free disk)
    python bench/pickle_scan.py --mb 300
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The child reports its own peak RSS (getrusage's would include this parent's).
_CHECK = """
import sys, runpy
sys.argv = ["torchreview", "check", "--no-cache", "--format", "json", sys.argv[1]]
try:
    runpy.run_module("bot.cli", run_name="__main__")
except SystemExit:
    pass
finally:
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    print("PEAK", int(status["VmHWM"].split()[0]) // 1024, file=sys.stderr)
"""


class _RunsShell:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def build(directory: Path, megabytes: int) -> list[Path]:
    import torch

    elements = megabytes * 1024 * 1024 // 4
    sparse = directory / "zeros.bin"
    with sparse.open("wb") as stream:
        stream.truncate(elements * 4)
    tensor = torch.from_file(str(sparse), shared=True, size=elements, dtype=torch.float32)
    zip_format, legacy = directory / "big.pt", directory / "big_legacy.pt"
    torch.save({"weight": tensor, "hook": _RunsShell()}, zip_format)
    torch.save({"weight": tensor}, legacy, _use_new_zipfile_serialization=False)
    del tensor
    sparse.unlink()
    inline = directory / "inline.pkl"
    with inline.open("wb") as stream:
        size = megabytes * 1024 * 1024
        stream.write(b"\x80\x04\x8e" + struct.pack("<Q", size))
        chunk = bytes(1 << 20)
        for _ in range(megabytes):
            stream.write(chunk)
        stream.write(b"0" + pickle.dumps(_RunsShell(), protocol=4)[2:])
    return [zip_format, legacy, inline]


def measure(path: Path) -> dict:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _CHECK, str(path)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=path.parent)
    seconds = time.perf_counter() - started
    peak = next(int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("PEAK"))
    report = json.loads(proc.stdout)
    return {"file": path.name, "mb": round(path.stat().st_size / 2**20), "seconds": round(seconds, 2),
            "peak_rss_mb": peak, "rules": sorted({f["rule"] for f in report["findings"]}),
            "errors": [e["kind"] for e in report["errors"]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=2048, help="tensor data per file, in MiB (default 2048)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="torchreview-pickle-bench-") as directory:
        for path in build(Path(directory), args.mb):
            print(json.dumps(measure(path)))
    print(json.dumps({"load_average": os.getloadavg()}))


if __name__ == "__main__":
    main()
