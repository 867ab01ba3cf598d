"""The smoke runner on real models: how many it builds, why it skips the rest, and whether it cries wolf.

Every target is an unmodified class from a public repository, so a ``failed`` report is a false alarm
(there must be none) and ``error`` is the runner's own fault. The repositories are not part of this
checkout: extract each one at the commit below (``git archive`` of a clone, or only its ``.py`` files)
into ``--repos DIR`` as ``DIR/<name>``; a repository that is missing there is left out and reported.

    python bench/smoke_real.py --repos /tmp/smokereal [--steps 20] [--only nanoGPT,minGPT] [--json OUT]
                               [--no-sandbox]

Each repository's targets run as one job (one warm interpreter in one sandbox, as the runner does for
the targets of one revision). Time per target is what the harness measured for that target inside the
child (import of the target's module, build, checks), in wall-clock and in CPU time (the second hardly
depends on what else the machine runs); the job's wall time (which adds one interpreter start, ``import
torch`` and the first optimizer step's imports) is printed per repository.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (repository, commit, github name)
REPOSITORIES = {
    "nanoGPT": ("3adf61e154c3fe3fca428ad6bc3818b27a3b8291", "karpathy/nanoGPT"),
    "minGPT": ("37baab71b9abea1b76ab957409a1cc2fbfba8a26", "karpathy/minGPT"),
    "vit-pytorch": ("69d24fe9e3024c0d4b02761123b8583a24ebed1e", "lucidrains/vit-pytorch"),
    "Pytorch-UNet": ("21d7850f2af30a9695bbeea75f3136aa538cfc4a", "milesial/Pytorch-UNet"),
    "pytorch-cifar": ("49b7aa97b0c12fe0d4054e670403a16b6b834ddd", "kuangliu/pytorch-cifar"),
    "examples": ("77f55b912142e11fcfdf5b530231fb9c52f181e8", "pytorch/examples"),
    "mae": ("efb2a8062c206524e35e47d04501ed4f544c0ae8", "facebookresearch/mae"),
    "dino": ("7c446df5b9f45747937fb0d72314eb9f7b66930a", "facebookresearch/dino"),
}

# (repository, target, expected): "build" (it should build and pass), or "skip: why" when a skip is the
# right answer on a runner with only torch installed (a package it lacks, a script that trains when imported,
# a module without trainable parameters: an activation or a fixed encoding has nothing to train).
TARGETS: list[tuple[str, str, str]] = [
    ("nanoGPT", "model.py:LayerNorm", "build"),
    ("nanoGPT", "model.py:CausalSelfAttention", "build"),
    ("nanoGPT", "model.py:MLP", "build"),
    ("nanoGPT", "model.py:Block", "build"),
    ("nanoGPT", "model.py:GPT", "build"),
    ("minGPT", "mingpt/model.py:NewGELU", "skip: no trainable parameters"),
    ("minGPT", "mingpt/model.py:CausalSelfAttention", "build"),
    ("minGPT", "mingpt/model.py:Block", "build"),
    ("minGPT", "mingpt/model.py:GPT", "build"),
    # vit-pytorch needs einops (a pure-Python package; install it next to torch for this bench)
    ("vit-pytorch", "vit_pytorch/vit.py:ViT", "build"),
    ("vit-pytorch", "vit_pytorch/simple_vit.py:SimpleViT", "build"),
    ("vit-pytorch", "vit_pytorch/cait.py:CaiT", "build"),
    ("vit-pytorch", "vit_pytorch/cvt.py:CvT", "build"),
    ("vit-pytorch", "vit_pytorch/deepvit.py:DeepViT", "build"),
    ("vit-pytorch", "vit_pytorch/cct.py:CCT", "build"),
    ("vit-pytorch", "vit_pytorch/cross_vit.py:CrossViT", "build"),
    ("vit-pytorch", "vit_pytorch/levit.py:LeViT", "build"),
    ("vit-pytorch", "vit_pytorch/pit.py:PiT", "build"),
    ("vit-pytorch", "vit_pytorch/t2t.py:T2TViT", "build"),
    # upstream bug at this commit: its FeedForward applies LayerNorm(dim) to a [b, dim, h, w] map, which only
    # runs when the map's width h equals dim (the README's own example, 16x16 patches of dim 1024, raises too)
    ("vit-pytorch", "vit_pytorch/local_vit.py:LocalViT", "skip: LayerNorm(dim) on a [b, dim, h, w] map (upstream bug)"),
    ("vit-pytorch", "vit_pytorch/mobile_vit.py:MobileViT", "build"),
    ("vit-pytorch", "vit_pytorch/nest.py:NesT", "build"),
    ("vit-pytorch", "vit_pytorch/vit_1d.py:ViT", "build"),
    ("vit-pytorch", "vit_pytorch/simple_vit_1d.py:SimpleViT", "build"),
    ("vit-pytorch", "vit_pytorch/vit_for_small_dataset.py:ViT", "build"),
    ("vit-pytorch", "vit_pytorch/crossformer.py:CrossFormer", "build"),
    ("vit-pytorch", "vit_pytorch/twins_svt.py:TwinsSVT", "build"),
    ("Pytorch-UNet", "unet/unet_model.py:UNet", "build"),
    ("Pytorch-UNet", "unet/unet_parts.py:DoubleConv", "build"),
    ("Pytorch-UNet", "unet/unet_parts.py:Down", "build"),
    ("Pytorch-UNet", "unet/unet_parts.py:Up", "build"),
    ("Pytorch-UNet", "unet/unet_parts.py:OutConv", "build"),
    ("pytorch-cifar", "models/resnet.py:ResNet", "build"),
    ("pytorch-cifar", "models/vgg.py:VGG", "build"),
    ("pytorch-cifar", "models/lenet.py:LeNet", "build"),
    ("pytorch-cifar", "models/mobilenetv2.py:MobileNetV2", "build"),
    ("pytorch-cifar", "models/densenet.py:DenseNet", "build"),
    ("pytorch-cifar", "models/googlenet.py:GoogLeNet", "build"),
    ("pytorch-cifar", "models/preact_resnet.py:PreActResNet", "build"),
    ("pytorch-cifar", "models/shufflenetv2.py:ShuffleNetV2", "build"),
    ("examples", "mnist/main.py:Net", "build"),
    ("examples", "word_language_model/model.py:RNNModel", "build"),
    ("examples", "word_language_model/model.py:PositionalEncoding", "skip: no trainable parameters"),
    ("examples", "word_language_model/model.py:TransformerModel", "build"),
    ("examples", "gcn/main.py:GCN", "build"),
    ("examples", "gcn/main.py:GraphConv", "build"),
    ("examples", "gat/main.py:GAT", "build"),
    ("examples", "vae/main.py:VAE", "skip: imports torchvision"),
    ("examples", "dcgan/main.py:Generator", "skip: imports torchvision"),
    ("examples", "dcgan/main.py:Discriminator", "skip: imports torchvision"),
    ("examples", "super_resolution/model.py:Net", "build"),
    ("examples", "time_sequence_prediction/train.py:Sequence", "skip: imports matplotlib"),
    ("examples", "fast_neural_style/neural_style/transformer_net.py:TransformerNet", "build"),
    ("examples", "siamese_network/main.py:SiameseNetwork", "skip: imports torchvision"),
    ("mae", "models_mae.py:MaskedAutoencoderViT", "skip: imports timm"),
    ("mae", "models_vit.py:VisionTransformer", "skip: imports timm"),
    # its utils.py imports PIL, used only inside functions the models never call: a stand-in replaces it
    ("dino", "vision_transformer.py:VisionTransformer", "build"),
    ("dino", "vision_transformer.py:DINOHead", "build"),
]


def _reason_kind(report: dict) -> str:
    """A short category for a skip or an error."""
    reason = report.get("reason") or ""
    if "not installed" in reason:
        missing = reason.split("needs '", 1)[-1].split("'", 1)[0].split(".")[0]
        return f"missing package {missing}"
    for needle, kind in (("cannot guess constructor argument", "constructor argument"),
                         ("could not infer an input", "input not found"),
                         ("raised", "constructor rejected the guesses"),
                         ("importing", "import failed"),
                         ("timed out", "timeout"),
                         ("no trainable parameters", "no trainable parameters")):
        if needle in reason:
            return kind
    return reason[:60] or "?"


def _p90(values: list[float]) -> float:
    return values[min(len(values) - 1, round(0.9 * (len(values) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repos", type=Path, required=True, help="folder holding each repository as DIR/<name>")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per target")
    parser.add_argument("--only", default="", help="comma-separated repository names")
    parser.add_argument("--match", default="", help="comma-separated substrings: only targets containing one")
    parser.add_argument("--json", type=Path, help="write every report here")
    parser.add_argument("--no-sandbox", action="store_true", help="plain child processes (development only)")
    parser.add_argument("--verbose", "-v", action="store_true", help="print every failing check and reason")
    args = parser.parse_args()

    from bot.smoke import VERDICT_WORDS, static_claims, target_verdicts, with_claims
    from gpu_runner.runner import TargetRequest, smoke
    from gpu_runner.sandbox import SandboxLimits

    only = {name for name in args.only.split(",") if name}
    rows, reports, missing_repos = [], {}, []
    for repo in REPOSITORIES:
        if only and repo not in only:
            continue
        root = args.repos / repo
        patterns = [m for m in args.match.split(",") if m]
        targets = [(target, expected) for name, target, expected in TARGETS if name == repo
                   and (not patterns or any(m in target for m in patterns))]
        if not targets:
            continue
        if not root.is_dir():
            missing_repos.append(repo)
            continue
        # as the App does: the static findings of the targets' files that a run can decide go with them
        files = {t.split(":", 1)[0] for t, _ in targets}
        claims = static_claims({f: (root / f).read_text(errors="replace") for f in files if (root / f).is_file()},
                               root=root)
        requests_ = [TargetRequest(t) for t, _ in targets]
        with_claims(requests_, claims)
        started = time.perf_counter()
        run = smoke(root, requests_, steps=args.steps, device="cpu",
                    limits=SandboxLimits(timeout_s=args.timeout), sandbox=not args.no_sandbox)
        wall = time.perf_counter() - started
        if run.refused:
            print(f"{repo}: the sandbox refused: {run.refused}")
            return 2
        print(f"{repo}: {len(targets)} targets in {wall:.1f}s (one job); {sum(map(len, claims.values()))} static "
              "finding(s) a run can decide in their files", flush=True)
        for target, claim, verdict in target_verdicts(run.to_dict(), claims):
            print(f"  {VERDICT_WORDS[verdict['verdict']]}: {claim['rule']} at {claim['line']} on {target['target']}: "
                  f"{verdict['evidence']}")
        for (target, expected), outcome in zip(targets, run.outcomes):
            head = outcome.head
            reports[f"{repo}/{target}"] = head
            rows.append((repo, target, expected, head))

    print()
    print(f"| {'target':<58} | expected | status | checks (fail/warn/skip) | reason | s |")
    print(f"|{'-' * 60}|----------|--------|-------------------------|--------|---:|")
    for repo, target, expected, head in rows:
        checks = head.get("checks") or []
        counts = Counter(c["status"] for c in checks)
        seconds = head.get("seconds")
        reason = "" if head["status"] in ("passed", "failed") else _reason_kind(head)
        failing = [c["name"] for c in checks if c["status"] == "fail"]
        print(f"| {repo + '/' + target:<58} | {expected.split(':')[0]:<8} | {head['status']:<6} | "
              f"{counts['fail']}/{counts['warn']}/{counts['skip']} {','.join(failing)} | {reason} | "
              f"{seconds if seconds is None else round(seconds, 1)} |")
        if args.verbose:
            for check in checks:
                if check["status"] in ("fail", "warn"):
                    print(f"      {check['status']} {check['name']}: {check['message'][:300]}")
            if head.get("reason"):
                print(f"      reason: {head['reason'][:400]}")

    total = len(rows)
    built = [r for r in rows if r[3]["status"] in ("passed", "failed")]
    failed = [r for r in rows if r[3]["status"] == "failed"]
    errors = [r for r in rows if r[3]["status"] == "error"]
    expected_build = [r for r in rows if r[2] == "build"]
    skipped = Counter(_reason_kind(r[3]) for r in rows if r[3]["status"] == "skipped")
    times = sorted(r[3].get("seconds") or 0.0 for r in built)
    cpu_times = sorted(r[3].get("cpu_seconds") or 0.0 for r in built)
    skipped_times = sorted(r[3].get("seconds") or 0.0 for r in rows if r[3]["status"] == "skipped")
    print()
    if total:
        print(f"built {len(built)}/{total} ({100 * len(built) / total:.0f}%); of those expected to build "
              f"{sum(1 for r in expected_build if r[3]['status'] in ('passed', 'failed'))}/{len(expected_build)}")
        print(f"false FAILs (failed on an unmodified model): {len(failed)}"
              + (f" ({', '.join(r[0] + '/' + r[1] for r in failed)})" if failed else ""))
        print(f"runner errors: {len(errors)}" + (f" ({', '.join(r[0] + '/' + r[1] for r in errors)})" if errors else ""))
        unexpected = [f"{r[0]}/{r[1]} ({r[3]['status']}, expected {r[2].split(':')[0]})" for r in rows
                      if (r[2] == "build") != (r[3]["status"] in ("passed", "failed"))]
        print("not as expected: " + (", ".join(unexpected) or "none"))
        print("skipped: " + (", ".join(f"{kind} {n}" for kind, n in skipped.most_common()) or "none"))
    if times:
        print(f"time per built target: median {statistics.median(times):.1f}s, p90 {_p90(times):.1f}s "
              f"(CPU time: median {statistics.median(cpu_times):.1f}s, p90 {_p90(cpu_times):.1f}s)")
    if skipped_times:
        print(f"time per skipped target: median {statistics.median(skipped_times):.2f}s, "
              f"max {skipped_times[-1]:.2f}s")
    try:
        print(f"load average (1, 5, 15 min) at the end: {', '.join(f'{v:.1f}' for v in os.getloadavg())} "
              f"on {os.cpu_count()} cores")
    except OSError:
        pass
    if missing_repos:
        print(f"not found under {args.repos}: {', '.join(missing_repos)}")
    if args.json:
        args.json.write_text(json.dumps(reports, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
