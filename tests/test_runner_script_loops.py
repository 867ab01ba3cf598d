"""Training loops written as scripts run unconfigured (issue 27, item 4): a loop at a script's module level that
trains on data the script builds itself, the same loop under ``if __name__ == "__main__":`` or in a ``main()``
that builds its own model. The runner runs the script's setup with its settings shrunk, then a few iterations of
the loop; the step checks hold on it (a planted bug fails at its line, identical code passes), and a setup that
needs what the sandbox lacks is skipped naming it."""
from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpu_runner.script_steps import script_part, shrunk_setting  # noqa: E402
from gpu_runner.steps import smoke_step  # noqa: E402
from gpu_runner.targets import find_step_targets  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (an autouse fixture)

# A character model trained on a string the script holds, its sizes those of a real run.
CHARACTERS = '''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    text = "the quick brown fox jumps over the lazy dog " * 40
    alphabet = sorted(set(text))
    data = torch.tensor([alphabet.index(c) for c in text])

    n_layer = 12
    n_head = 4
    n_embd = 512
    block_size = 256
    batch_size = 64
    max_iters = 5000
    learning_rate = 3e-3
    device = "cuda"


    class TinyLM(nn.Module):
        def __init__(self, vocab, width, depth, context):
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.position = nn.Embedding(context, width)
            self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Dropout(0.1))
                                          for _ in range(depth)])
            self.head = nn.Linear(width, vocab)

        def forward(self, tokens, targets=None):
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            logits = self.head(self.blocks(self.embed(tokens) + self.position(positions)))
            loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
            return logits, loss


    def get_batch():
        starts = torch.randint(len(data) - block_size - 1, (batch_size,))
        x = torch.stack([data[s:s + block_size] for s in starts])
        y = torch.stack([data[s + 1:s + 1 + block_size] for s in starts])
        return x.to(device), y.to(device)


    model = TinyLM(len(alphabet), n_embd, n_layer, block_size).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)

    for it in range(max_iters):
        xb, yb = get_batch()
        logits, loss = model(xb, yb)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if it % 500 == 0:
            print(it, loss.item())

    torch.save(model.state_dict(), "/no/such/folder/model.pt")
'''


def line_of(root: Path, path: str, text: str) -> int:
    return next(i for i, line in enumerate((root / path).read_text().splitlines(), 1) if text in line)


def run(root: Path, target: str) -> dict:
    return smoke_step(root, target, None, device="cpu")


def statuses(report: dict) -> dict:
    return {c["name"]: c["status"] for c in report["checks"]}


def test_a_module_level_training_loop_is_a_step_named_after_the_script():
    found = find_step_targets({"train.py": textwrap.dedent(CHARACTERS)}, {"train.py": None})
    assert [t.spec for t in found] == ["train.py:__main__"]
    script = textwrap.dedent(CHARACTERS)
    loop_line = next(i for i, line in enumerate(script.splitlines(), 1) if line.startswith("for it in"))
    assert found[0].line == loop_line
    # a loop that only calls a step function is not itself a step; neither is a loop without backward()
    calls = "def train(model, loader):\n    pass\n\nfor epoch in range(3):\n    train(None, None)\n"
    assert find_step_targets({"run.py": calls}, {"run.py": None}) == []


def test_the_script_part_runs_its_setup_then_stops_after_the_loop():
    tree = script_part(ast.parse(textwrap.dedent(CHARACTERS)))
    text = ast.unparse(tree)
    assert "torch.save" not in text  # after the loop: never run
    assert "class TinyLM" not in text and "import torch" not in text  # the definitions ran when it was imported
    assert "__torchreview_loop_starts__(globals(), locals())" in text
    assert "__torchreview_setting__('n_layer', 12" in text


def test_the_scripts_own_loop_runs_with_its_settings_shrunk(tmp_path):
    root = write_tree(tmp_path, {"train.py": CHARACTERS})
    report = run(root, "train.py:__main__")
    assert report["status"] == "passed", report
    assert statuses(report)["zero-grad"] == "pass" and statuses(report)["params-updated"] == "pass"
    assert statuses(report)["loss"] in ("pass", "warn")
    notes = " ".join(report["notes"])
    assert "n_layer = 2 (the script's 12)" in notes and "batch_size = 8" in notes and "block_size = 64" in notes
    assert "n_embd = 32" in notes  # 8 per head, the heads kept
    assert "device = 'cpu'" in notes
    assert "trains model (TinyLM" in notes
    assert "stopped after" in notes


def test_a_planted_missing_zero_grad_fails_at_the_scripts_step_line(tmp_path):
    root = write_tree(tmp_path, {"train.py": CHARACTERS.replace("        optimizer.zero_grad(set_to_none=True)\n", "")})
    report = run(root, "train.py:__main__")
    assert report["status"] == "failed", report
    zero_grad = next(c for c in report["checks"] if c["name"] == "zero-grad")
    assert zero_grad["status"] == "fail"
    assert zero_grad["details"]["line"] == line_of(root, "train.py", "optimizer.step()")
    assert {c["name"] for c in report["checks"] if c["status"] == "fail"} == {"zero-grad"}


def test_a_non_finite_loss_fails_the_loss_check(tmp_path):
    root = write_tree(tmp_path, {"train.py": CHARACTERS.replace("loss.backward()", "(loss / 0.0).backward()")})
    report = run(root, "train.py:__main__")
    loss = next(c for c in report["checks"] if c["name"] == "loss")
    assert loss["status"] == "fail" and "NaN/Inf" in loss["message"]
    assert loss["details"]["line"] == line_of(root, "train.py", "(loss / 0.0).backward()")


MAIN = '''
    import argparse
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class Regressor(nn.Module):
        def __init__(self, features, hidden_dim):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(features, hidden_dim), nn.ReLU(), nn.BatchNorm1d(hidden_dim),
                                     nn.Linear(hidden_dim, 1))

        def forward(self, x):
            return self.net(x).squeeze(-1)


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--batch-size", type=int, default=512)
        parser.add_argument("--hidden-dim", type=int, default=1024)
        parser.add_argument("--epochs", type=int, default=100)
        parser.add_argument("--workers", type=int, default=4)
        args = parser.parse_args()
        features = torch.randn(256, 6)
        targets = features @ torch.arange(6.0)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(features, targets),
                                             batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
        model = Regressor(6, args.hidden_dim)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        for epoch in range(args.epochs):
            model.train()
            for x, y in loader:
                optimizer.zero_grad()
                F.mse_loss(model(x), y).backward()
                optimizer.step()
        torch.save(model, "regressor.pt")


    if __name__ == "__main__":
        main()
'''


def test_a_main_function_that_builds_its_own_model_runs_on_its_argparse_defaults(tmp_path):
    found = find_step_targets({"fit.py": textwrap.dedent(MAIN)}, {"fit.py": None})
    assert [t.spec for t in found] == ["fit.py:main"]
    root = write_tree(tmp_path, {"fit.py": MAIN})
    report = run(root, "fit.py:main")
    assert report["status"] == "passed", report
    notes = " ".join(report["notes"])
    assert "batch_size = 8 (the script's 512)" in notes and "hidden_dim = 96" in notes and "workers = 0" in notes
    broken = write_tree(tmp_path / "broken", {"fit.py": MAIN.replace("                optimizer.zero_grad()\n", "")})
    failed = run(broken, "fit.py:main")
    assert failed["status"] == "failed"
    assert statuses(failed)["zero-grad"] == "fail"


def test_the_same_loop_under_a_main_guard_is_found_and_run(tmp_path):
    guarded = CHARACTERS.replace("\n    model = TinyLM", "\n    if __name__ == \"__main__\":\n        model = TinyLM")
    lines, inside = [], False
    for line in textwrap.dedent(guarded).splitlines():
        if line.startswith('if __name__'):
            inside = True
            lines.append(line)
            continue
        lines.append(("    " + line if line.strip() else line) if inside and not line.startswith("    model =")
                     else line)
    source = "\n".join(lines) + "\n"
    root = write_tree(tmp_path, {"train.py": source})
    assert [t.spec for t in find_step_targets({"train.py": source}, {"train.py": None})] == ["train.py:__main__"]
    report = run(root, "train.py:__main__")
    assert report["status"] == "passed", report


GAN = '''
    import torch
    import torch.nn as nn

    latent = 8
    real = torch.randn(512, 4) * 0.5 + 2.0
    generator = nn.Sequential(nn.Linear(latent, 32), nn.ReLU(), nn.Linear(32, 4))
    discriminator = nn.Sequential(nn.Linear(4, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    optimizer_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
    optimizer_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3)
    bce = nn.BCEWithLogitsLoss()

    for step in range(10000):
        batch = real[torch.randint(0, len(real), (32,))]
        fake = generator(torch.randn(32, latent))
        discriminator.zero_grad()
        loss_d = bce(discriminator(batch), torch.ones(32, 1)) + bce(discriminator(fake.detach()), torch.zeros(32, 1))
        loss_d.backward()
        optimizer_d.step()
        generator.zero_grad()
        loss_g = bce(discriminator(fake), torch.ones(32, 1))  # also reaches the discriminator's gradients
        loss_g.backward()
        optimizer_g.step()
'''


def test_two_models_trained_in_turn_pass_and_a_missing_zero_grad_of_one_fails(tmp_path):
    root = write_tree(tmp_path, {"gan.py": GAN})
    report = run(root, "gan.py:__main__")
    assert report["status"] == "passed", report  # the generator's loss leaves gradients the next zero_grad clears
    assert "generator" in " ".join(report["notes"]) and "discriminator" in " ".join(report["notes"])
    broken = write_tree(tmp_path / "broken", {"gan.py": GAN.replace("        discriminator.zero_grad()\n", "")})
    failed = run(broken, "gan.py:__main__")
    assert statuses(failed)["zero-grad"] == "fail"
    assert next(c for c in failed["checks"] if c["name"] == "zero-grad")["details"]["line"] \
        == line_of(broken, "gan.py", "optimizer_d.step()")


def test_a_loop_that_updates_by_hand_is_bounded_by_its_backward_calls(tmp_path):
    source = '''
        import itertools
        import torch

        weights = torch.randn(4, 1)
        layer = torch.nn.Linear(4, 1)
        for index in itertools.count(1):
            x = torch.randn(32, 4)
            loss = torch.nn.functional.mse_loss(layer(x), x @ weights)
            layer.zero_grad()
            loss.backward()
            for parameter in layer.parameters():
                parameter.data.add_(-0.1 * parameter.grad)
            if loss.item() < 1e-12:
                break
    '''
    report = run(write_tree(tmp_path, {"fit.py": source}), "fit.py:__main__")
    assert report["status"] == "passed", report
    assert statuses(report)["loss"] in ("pass", "warn") and statuses(report)["zero-grad"] == "skip"
    assert any("stopped after" in note for note in report["notes"])


@pytest.mark.parametrize("setup, reason", [
    ('tokens = torch.load("data/train.bin")\n', "needs the file 'data/train.bin'"),
    ("import a_package_nobody_has\nvocabulary = a_package_nobody_has.load()\n", "needs 'a_package_nobody_has'"),
    ('import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument("data_dir")\n'
     "options = parser.parse_args()\n", "needs command-line arguments (data_dir)"),
])
def test_a_setup_that_needs_what_the_sandbox_lacks_is_skipped_naming_it(tmp_path, setup, reason):
    source = CHARACTERS.replace("    model = TinyLM", textwrap.indent(setup, "    ") + "    model = TinyLM")
    report = run(write_tree(tmp_path, {"train.py": source}), "train.py:__main__")
    assert report["status"] == "skipped", report
    assert reason in report["reason"], report["reason"]
    assert "before its training loop" in report["reason"]


def test_the_loops_own_code_raising_is_a_skip_not_a_failure(tmp_path):
    source = CHARACTERS.replace("        logits, loss = model(xb, yb)\n",
                                "        logits, loss = model(xb, yb)\n        assert xb.shape[1] == 256\n")
    report = run(write_tree(tmp_path, {"train.py": source}), "train.py:__main__")
    assert report["status"] == "skipped" and "AssertionError" in report["reason"], report


def test_settings_shrink_as_the_runner_shrinks_models():
    notes: list = []
    assert shrunk_setting("n_layer", 12, {}, "cpu", notes) == 2
    assert shrunk_setting("n_embd", 768, {"n_head": 12}, "cpu", notes) == 96
    assert shrunk_setting("train_batch_size", 256, {}, "cpu", notes) == 8
    assert shrunk_setting("eval_iters", 200, {}, "cpu", notes) == 2
    assert shrunk_setting("gradient_accumulation_steps", 40, {}, "cpu", notes) == 2
    assert shrunk_setting("learning_rate", 3e-4, {}, "cpu", notes) == 3e-4
    assert shrunk_setting("max_iters", 600000, {}, "cpu", notes) == 600000  # the runner's bound stops the loop
    assert shrunk_setting("num_classes", 1000, {}, "cpu", notes) == 1000


# A trainer that takes a data set and makes its own loader, with a config whose defaults the class gives.
COACH = '''
    import types

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader


    class Classifier(nn.Module):
        def __init__(self, width=12, classes=3):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(width, 24), nn.ReLU(), nn.Linear(24, classes))

        def forward(self, x):
            return self.body(x)


    class Coach:
        @staticmethod
        def get_default_config():
            return types.SimpleNamespace(momentum=0.9, step_size=0.05, batch_size=64, num_workers=4)

        def __init__(self, config, model, train_dataset):
            self.config, self.model, self.train_dataset = config, model, train_dataset

        def run(self):
            config = self.config
            optimizer = torch.optim.SGD(self.model.parameters(), lr=config.step_size, momentum=config.momentum)
            loader = DataLoader(self.train_dataset, batch_size=config.batch_size, shuffle=True,
                                num_workers=config.num_workers)
            while True:
                for x, y in loader:
                    optimizer.zero_grad()
                    F.cross_entropy(self.model(x), y).backward()
                    optimizer.step()
'''


def test_a_trainer_gets_a_data_set_and_its_classs_default_config(tmp_path):
    root = write_tree(tmp_path, {"coach.py": COACH})
    report = run(root, "coach.py:Coach.run")
    assert report["status"] == "passed", report
    broken = write_tree(tmp_path / "broken", {"coach.py": COACH.replace("optimizer.zero_grad()", "pass")})
    assert statuses(run(broken, "coach.py:Coach.run"))["zero-grad"] == "fail"


def test_an_unset_global_from_a_failed_import_names_what_the_import_needs(tmp_path):
    files = {"helpers/__init__.py": "import a_package_nobody_has\n\nSCALE = a_package_nobody_has.scale()\n\n\ndef meter(value):\n    return value\n",
             "network.py": COACH.split("class Coach")[0],
             "main.py": '''
                 import torch
                 import torch.nn.functional as F
                 from helpers import meter
                 from network import Classifier

                 net = Classifier()


                 def train(epoch):
                     net.train()
                     for x, y in trainloader:
                         optimizer.zero_grad()
                         loss = F.cross_entropy(net(x), y)
                         loss.backward()
                         optimizer.step()
                         running = meter(loss.item())  # its result used: no stand-in
             '''}
    report = run(write_tree(tmp_path, files), "main.py:train")
    assert report["status"] == "skipped"
    assert "`from helpers import meter` (line 4)" in report["reason"] and "a_package_nobody_has" in report["reason"]


def test_the_static_no_zero_grad_finding_on_a_script_loop_is_confirmed_by_running_it(tmp_path):
    from bot.smoke import RUNNER_CLAIM_KEYS, static_claims
    from gpu_runner.confirm import confirm_step

    broken = CHARACTERS.replace("        optimizer.zero_grad(set_to_none=True)\n", "")
    root = write_tree(tmp_path, {"train.py": broken})
    claims = [{k: c[k] for k in RUNNER_CLAIM_KEYS if k in c}
              for c in static_claims({"train.py": (root / "train.py").read_text()}).get("train.py", [])]
    assert any(c["rule"] == "TR101" for c in claims)
    report = confirm_step(lambda: run(root, "train.py:__main__"), str(root), "train.py:__main__", claims)
    verdicts = {f["rule"]: f["verdict"] for f in report.get("findings", [])}
    assert verdicts.get("TR101") == "confirmed", report.get("findings")


def test_eval_mode_set_inside_the_loop_and_never_undone_fails_and_set_before_it_only_warns(tmp_path):
    validating = CHARACTERS.replace("        if it % 500 == 0:\n",
                                    "        if it % 2 == 0:\n            model.eval()\n")
    report = run(write_tree(tmp_path, {"train.py": validating}), "train.py:__main__")
    assert statuses(report)["train-mode"] == "fail", report
    frozen = CHARACTERS.replace("    optimizer = torch.optim.AdamW", "    model.eval()\n    optimizer = torch.optim.AdamW")
    report = run(write_tree(tmp_path / "frozen", {"train.py": frozen}), "train.py:__main__")
    assert statuses(report)["train-mode"] == "warn" and report["status"] == "passed", report


def test_a_statement_that_only_calls_a_missing_package_is_skipped_not_the_step(tmp_path):
    logged = CHARACTERS.replace("import torch\n", "import torch\n    import a_tracker_nobody_has as tracker\n", 1) \
        .replace("    model = TinyLM", "    tracker.init(project=\"chars\")\n    model = TinyLM") \
        .replace("        if it % 500 == 0:\n", "        tracker.log({\"loss\": loss.item()})\n        if it % 500 == 0:\n")
    report = run(write_tree(tmp_path, {"train.py": logged}), "train.py:__main__")
    assert report["status"] == "passed", report
    assert any("only call 'a_tracker_nobody_has'" in note for note in report["notes"])
    used = logged.replace("    model = TinyLM", "    run_name = tracker.name()\n    model = TinyLM")
    report = run(write_tree(tmp_path / "used", {"train.py": used}), "train.py:__main__")
    assert report["status"] == "skipped" and "needs 'a_tracker_nobody_has'" in report["reason"], report


def test_what_a_script_sets_for_its_process_is_put_back_after_it(tmp_path):
    import os

    settings = CHARACTERS.replace("    model = TinyLM", "    torch.backends.cudnn.benchmark = True\n"
                                  "    import os\n    os.environ[\"TORCHREVIEW_TEST_LEFTOVER\"] = \"1\"\n"
                                  "    model = TinyLM")
    before = (torch.get_default_dtype(), torch.backends.cudnn.benchmark)
    report = run(write_tree(tmp_path, {"train.py": settings}), "train.py:__main__")
    assert report["status"] == "passed", report
    assert (torch.get_default_dtype(), torch.backends.cudnn.benchmark) == before
    assert "TORCHREVIEW_TEST_LEFTOVER" not in os.environ
