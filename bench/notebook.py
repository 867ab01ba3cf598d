"""Checking a big notebook: a synthetic .ipynb of ~20 MB, nearly all of it PNG plots in the outputs
of a training notebook (~40 code cells, magics and shell escapes included).

Prints the notebook's size, its code's size, and for ``torchreview check --format json`` on it, run
as a fresh process: wall seconds, peak memory (max RSS), findings and errors.

    python bench/notebook.py               # ~20 MB
    python bench/notebook.py --mb 50
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TRAIN_CELLS = [
    "%matplotlib inline\n%load_ext autoreload\n%autoreload 2\n!pip install -q timm",
    "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\ngpus = !nvidia-smi -L",
    "%%writefile requirements.txt\ntorch>=2.0\ntimm\n",
    "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(784, 10)\n\n"
    "    def forward(self, x):\n        return F.softmax(self.fc(x), dim=1)\n",
    "model = Net()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\ncriterion = nn.CrossEntropyLoss()\n",
    "%%time\nfor epoch in range(3):\n    for x, y in loader:\n        loss = criterion(model(x), y)\n"
    "        loss.backward()\n        optimizer.step()\n",
    "state = torch.load(checkpoint_path)\n",
]


def png_output(size: int) -> dict:
    data = base64.b64encode(os.urandom(size * 3 // 4)).decode()
    return {"data": {"image/png": data, "text/plain": ["<Figure size 640x480 with 1 Axes>"]},
            "metadata": {}, "output_type": "display_data"}


def build(target_bytes: int) -> dict:
    cells = []
    for i in range(40):
        source = TRAIN_CELLS[i % len(TRAIN_CELLS)] if i < len(TRAIN_CELLS) else f"plt.plot(losses[{i}])\nplt.show()\n"
        cells.append({"cell_type": "code", "execution_count": i + 1, "id": f"c{i}", "metadata": {},
                      "outputs": [], "source": source.splitlines(keepends=True)})
    plot_cells = cells[len(TRAIN_CELLS):]
    per_plot = target_bytes // len(plot_cells)
    for cell in plot_cells:
        cell["outputs"].append(png_output(per_plot))
    return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=20.0)
    parser.add_argument("--write", help=argparse.SUPPRESS)  # internal: write the notebook there and exit
    args = parser.parse_args()
    if args.write:
        nb = build(int(args.mb * 1_000_000))
        Path(args.write).write_text(json.dumps(nb, indent=1, sort_keys=True) + "\n")
        print(sum(len("".join(c["source"]).encode()) for c in nb["cells"]))
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.ipynb"
        # written by a child: a check forked from a process holding the notebook would count its pages
        code = subprocess.run([sys.executable, __file__, "--mb", str(args.mb), "--write", str(path)],
                              capture_output=True, text=True, check=True).stdout.strip()
        print(f"notebook: {path.stat().st_size / 1e6:.1f} MB, code cells: {code} bytes")
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        out_path = Path(tmp) / "out.json"
        started = time.perf_counter()
        with out_path.open("w") as stdout:
            proc = subprocess.Popen([sys.executable, "-m", "bot.cli", "check", "--format", "json", str(path)],
                                    stdout=stdout, stderr=subprocess.DEVNULL, env=env)
            _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak, not the benchmark's
        seconds = time.perf_counter() - started
        out = json.loads(out_path.read_text())
        print(f"torchreview check: {seconds:.2f} s wall, peak RSS {usage.ru_maxrss / 1024:.0f} MiB, "
              f"exit {os.waitstatus_to_exitcode(status)}")
        print(f"findings: {[(f['rule'], f.get('cell'), f['line']) for f in out['findings']]}")
        print(f"errors: {[(e['kind'], e['message']) for e in out['errors']]}")


if __name__ == "__main__":
    main()
