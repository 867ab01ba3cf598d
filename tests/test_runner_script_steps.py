"""Training steps written as scripts run unconfigured (issue 27, item 4): an epoch function that reads the file's
module-level model, optimizer and loader instead of taking them; a script whose module level loads data and loops
over epochs (imported as its definitions only); a step written for a GPU (``.cuda()``) on a CPU runner; ``opt``
options beside an ``optimizer``, read by a helper; the model found through a package's re-export. A planted bug in
such a step still fails at its line; what the runner cannot provide is skipped, never failed."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpu_runner.steps import _script_definitions, role_of, smoke_step  # noqa: E402
from gpu_runner.targets import find_step_targets, global_reads  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (an autouse fixture)

NETWORK = '''
    import torch.nn as nn


    class Classifier(nn.Module):
        def __init__(self, width=12, classes=3):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(width, 24), nn.ReLU(), nn.Dropout(0.2))
            self.out = nn.Linear(24, classes)

        def forward(self, x):
            return self.out(self.body(x))
'''

# A script: data read from disk, the model and optimizer made at module level, then the epochs. The epoch function
# takes only the epoch number.
GLOBAL_SCRIPT = '''
    import argparse
    import torch
    import torch.nn as nn
    from network import Classifier

    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--report_every", type=int, default=5)
    args = parser.parse_args()

    samples = torch.load("/no/such/folder/samples.pt")
    train_loader = torch.utils.data.DataLoader(samples, batch_size=16)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    net = Classifier().to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr)


    def train(epoch):
        net.train()
        for index, (features, labels) in enumerate(train_loader):
            features, labels = features.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = criterion(net(features), labels)
            loss.backward()
            optimizer.step()
            if index % args.report_every == 0:
                print(epoch, index, loss.item())


    for epoch in range(100):
        train(epoch)
'''

GPU_STEP = '''
    import argparse
    import torch.nn.functional as F
    from network import Classifier


    def parse_options():
        parser = argparse.ArgumentParser()
        parser.add_argument("--warm", action="store_true")
        parser.add_argument("--warm_epochs", type=int, default=3)
        parser.add_argument("--learning_rate", type=float, default=0.01)
        return parser.parse_args()


    def warm_up(settings, epoch, optimizer):
        if settings.warm and epoch <= settings.warm_epochs:
            for group in optimizer.param_groups:
                group["lr"] = settings.learning_rate * epoch / settings.warm_epochs


    def train(train_loader, model, optimizer, epoch, opt):
        model.train()
        for images, labels in train_loader:
            images = images.cuda(non_blocking=True)
            labels = labels.cuda(non_blocking=True)
            warm_up(opt, epoch, optimizer)
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


    def main():
        opt = parse_options()
        model = Classifier().cuda()
'''


def line_of(root: Path, path: str, text: str) -> int:
    return next(i for i, line in enumerate((root / path).read_text().splitlines(), 1) if text in line)


def run(root: Path, target: str) -> dict:
    return smoke_step(root, target, None, device="cpu")


def statuses(report: dict) -> dict:
    return {c["name"]: c["status"] for c in report["checks"]}


def test_an_epoch_function_reading_module_globals_is_a_step():
    sources = {"network.py": textwrap.dedent(NETWORK), "main.py": textwrap.dedent(GLOBAL_SCRIPT),
               "report.py": "model = None\n\ndef train(epoch):\n    print(epoch)\n"}
    found = find_step_targets(sources, {path: None for path in sources})
    assert [t.spec for t in found] == ["main.py:train"]
    import ast

    function = next(n for n in ast.parse(sources["main.py"]).body if getattr(n, "name", "") == "train")
    assert {"net", "optimizer", "train_loader", "criterion", "device", "args"} <= global_reads(function)
    assert not {"index", "features", "labels", "loss"} & global_reads(function)


def test_a_script_step_runs_on_the_runners_globals(tmp_path):
    root = write_tree(tmp_path, {"network.py": NETWORK, "main.py": GLOBAL_SCRIPT})
    report = run(root, "main.py:train")
    assert report["status"] == "passed", report
    assert statuses(report)["zero-grad"] == "pass"
    assert statuses(report)["loss"] != "fail"
    notes = " ".join(report["notes"])
    assert "definitions only" in notes and "the model: network.py:Classifier" in notes
    assert "net" in notes and "optimizer" in notes  # the globals the runner provided


def test_a_script_step_without_zero_grad_fails_at_its_line(tmp_path):
    root = write_tree(tmp_path, {"network.py": NETWORK,
                                 "main.py": GLOBAL_SCRIPT.replace("            optimizer.zero_grad()\n", "")})
    report = run(root, "main.py:train")
    assert report["status"] == "failed", report
    zero_grad = next(c for c in report["checks"] if c["name"] == "zero-grad")
    assert zero_grad["status"] == "fail"
    assert zero_grad["details"]["line"] == line_of(root, "main.py", "optimizer.step()")


def test_a_global_the_runner_cannot_provide_is_a_skip(tmp_path):
    script = GLOBAL_SCRIPT.replace("criterion(net(features), labels)",
                                   "criterion(net(features * class_weights), labels)")
    root = write_tree(tmp_path, {"network.py": NETWORK, "main.py": script})
    report = run(root, "main.py:train")
    assert report["status"] == "skipped"
    assert "class_weights" in report["reason"]


def test_definitions_only_leaves_out_the_script_part():
    import ast

    tree = _script_definitions(ast.parse(textwrap.dedent(GLOBAL_SCRIPT)))
    text = ast.unparse(tree)
    assert "def train(epoch)" in text and "from network import Classifier" in text
    assert "for epoch in range(100)" not in text  # the training loop
    assert "parse_args" not in text and "net = " not in text and "optimizer = " not in text  # the runner's own
    assert "torch.load" in text  # data loading stays, guarded: a failure leaves the name unset


def test_a_gpu_step_runs_on_a_cpu_runner_with_options_beside_its_optimizer(tmp_path):
    root = write_tree(tmp_path, {"network.py": NETWORK, "train.py": GPU_STEP})
    report = run(root, "train.py:train")
    assert report["status"] == "passed", report
    assert any(".cuda()" in note for note in report["notes"])
    assert torch.Tensor.cuda.__name__ == "cuda"  # put back after the step


def test_a_gpu_step_without_zero_grad_still_fails(tmp_path):
    root = write_tree(tmp_path, {"network.py": NETWORK,
                                 "train.py": GPU_STEP.replace("            optimizer.zero_grad()\n", "")})
    report = run(root, "train.py:train")
    assert report["status"] == "failed"
    assert statuses(report)["zero-grad"] == "fail"


def test_the_model_is_found_through_a_packages_re_export(tmp_path):
    files = {"nets/__init__.py": "from .classifier import Classifier\n", "nets/classifier.py": NETWORK,
             "fit.py": '''
                import torch
                import torch.nn.functional as F
                from nets import Classifier


                def train_model(model, device, epochs=1):
                    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
                    model.train()
                    x, y = torch.randn(16, 12), torch.randint(0, 3, (16,))
                    for _ in range(4):
                        optimizer.zero_grad()
                        F.cross_entropy(model(x.to(device)), y.to(device)).backward()
                        optimizer.step()


                if __name__ == "__main__":
                    model = Classifier(width=12).to("cpu")
                    train_model(model, "cpu")
             '''}
    root = write_tree(tmp_path, files)
    report = run(root, "fit.py:train_model")
    assert report["status"] == "passed", report
    assert "the model: nets/classifier.py:Classifier" in report["notes"]


def test_compound_names_take_their_last_words_role_except_the_model():
    assert role_of("cifar_training_loader") == "loader"
    assert role_of("warmup_scheduler") == "scheduler"
    assert role_of("linear_classifier") is None  # a second module beside the model, not the model


def test_a_parameter_the_step_never_reads_needs_no_value(tmp_path):
    step = GPU_STEP.replace("def train(train_loader, model, optimizer, epoch, opt):",
                            "def train(n, train_loader, model, optimizer, epoch, opt):")
    root = write_tree(tmp_path, {"network.py": NETWORK, "train.py": step})
    assert run(root, "train.py:train")["status"] == "passed"
    read = step.replace("model.train()\n", "model.train()\n        assert n > 0\n", 1)
    root = write_tree(tmp_path / "read", {"network.py": NETWORK, "train.py": read})
    report = run(root, "train.py:train")
    assert report["status"] == "skipped" and "'n'" in report["reason"]


# A full-graph step: the node features, adjacency, labels and the training rows are the step's own parameters.
GRAPH = '''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class GraphNet(nn.Module):
        def __init__(self, features=10, hidden=16, classes=3):
            super().__init__()
            self.lift = nn.Linear(features, hidden)
            self.out = nn.Linear(hidden, classes)

        def forward(self, nodes, adjacency):
            hidden = F.relu(adjacency @ self.lift(nodes))
            return F.log_softmax(self.out(adjacency @ hidden), dim=1)


    def score(model, nodes, adjacency, classes, rows):
        model.eval()
        with torch.no_grad():
            prediction = model(nodes, adjacency)
            return (prediction[rows].argmax(1) == classes[rows]).float().mean()


    def train_epoch(epoch, model, optimizer, nodes, adjacency, classes, train_rows, held_out_rows):
        model.train()
        optimizer.zero_grad()
        prediction = model(nodes, adjacency)
        loss = F.nll_loss(prediction[train_rows], classes[train_rows])
        loss.backward()
        optimizer.step()
        return loss.item(), score(model, nodes, adjacency, classes, held_out_rows)
'''


def test_a_full_graph_step_gets_its_data_by_what_it_does_with_it(tmp_path):
    root = write_tree(tmp_path, {"graph.py": GRAPH})
    assert [t.spec for t in find_step_targets({"graph.py": textwrap.dedent(GRAPH)}, {"graph.py": None})] \
        == ["graph.py:train_epoch"]
    report = run(root, "graph.py:train_epoch")
    assert report["status"] == "passed", report
    assert statuses(report)["zero-grad"] == "pass"  # called once per iteration: several optimizer steps
    note = next(n for n in report["notes"] if "takes its data directly" in n)
    assert all(name in note for name in ("nodes", "adjacency", "classes", "train_rows", "held_out_rows"))


def test_a_full_graph_step_without_zero_grad_fails_at_its_line(tmp_path):
    root = write_tree(tmp_path, {"graph.py": GRAPH.replace("        optimizer.zero_grad()\n", "")})
    report = run(root, "graph.py:train_epoch")
    assert report["status"] == "failed"
    zero_grad = next(c for c in report["checks"] if c["name"] == "zero-grad")
    assert zero_grad["status"] == "fail" and zero_grad["details"]["line"] == line_of(root, "graph.py",
                                                                                     "optimizer.step()")


def test_data_the_step_uses_otherwise_is_not_made_up(tmp_path):
    step = GRAPH.replace("loss.backward()", "(loss * weights.sum()).backward()").replace(
        "held_out_rows):", "held_out_rows, weights):")
    root = write_tree(tmp_path, {"graph.py": step})
    report = run(root, "graph.py:train_epoch")
    assert report["status"] == "skipped" and "'weights'" in report["reason"]


def test_a_script_in_a_folder_imports_its_siblings_as_it_does_when_run(tmp_path):
    step = '''
        import torch
        import torch.nn.functional as F
        from model import Classifier

        model = Classifier()


        def train(epoch):
            model.train()
            for x, y in loader:
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
    '''
    other = NETWORK.replace("class Classifier", "class Unrelated")
    root = write_tree(tmp_path, {"first/model.py": other, "first/main.py": step.replace("Classifier", "Unrelated"),
                                 "second/model.py": NETWORK, "second/main.py": step})
    first = run(root, "first/main.py:train")
    second = run(root, "second/main.py:train")  # the same worker: first/model.py must not answer `import model`
    assert first["status"] == "passed", first
    assert second["status"] == "passed", second
    assert "the model: second/model.py:Classifier" in second["notes"]


def test_the_model_comes_from_the_file_that_imports_the_step(tmp_path):
    files = {"loop.py": '''
                 import torch.nn.functional as F


                 def train_epoch(epoch, args, model, data_loader, optimizer):
                     model.train()
                     for x, y in data_loader:
                         optimizer.zero_grad()
                         F.cross_entropy(model(x), y).backward()
                         optimizer.step()
             ''',
             "run.py": NETWORK + '''

    from loop import train_epoch
    '''}
    root = write_tree(tmp_path, files)
    report = run(root, "loop.py:train_epoch")
    assert report["status"] == "passed", report
    assert "the model: run.py:Classifier" in report["notes"]
    alone = write_tree(tmp_path / "alone", {"loop.py": files["loop.py"], "run.py": NETWORK})
    assert "found no model" in run(alone, "loop.py:train_epoch")["reason"]  # a model file that never uses the step


COACH = '''
    import torch.nn.functional as F
    from network import Classifier


    class Coach:
        def __init__(self, model, loader, optimizer):
            self.model, self.loader, self.optimizer = model, loader, optimizer
            self.updates = 0

        def run(self):
            self.model.train()
            while True:  # until interrupted: the runner's bound stops it
                for x, y in self.loader:
                    self.optimizer.zero_grad()
                    F.cross_entropy(self.model(x), y).backward()
                    self.optimizer.step()
                    self.updates += 1


    def main():
        Coach(Classifier(), [], None).run()
'''


def test_a_trainers_endless_loop_under_any_name_is_found_and_bounded(tmp_path):
    sources = {"network.py": textwrap.dedent(NETWORK), "coach.py": textwrap.dedent(COACH)}
    assert [t.spec for t in find_step_targets(sources, {"coach.py": None})] == ["coach.py:Coach.run"]
    root = write_tree(tmp_path, {"network.py": NETWORK, "coach.py": COACH})
    report = run(root, "coach.py:Coach.run")
    assert report["status"] == "passed", report
    assert any("stopped after" in note for note in report["notes"])
    broken = write_tree(tmp_path / "broken", {"network.py": NETWORK,
                                              "coach.py": COACH.replace("self.optimizer.zero_grad()\n", "pass\n")})
    assert statuses(run(broken, "coach.py:Coach.run"))["zero-grad"] == "fail"


def test_a_package_only_the_script_part_uses_does_not_stop_the_step_in_the_worker(tmp_path):
    from gpu_runner.runner import TargetRequest, smoke

    script = GLOBAL_SCRIPT.replace("import argparse\n", "import argparse\n    import a_package_nobody_has\n").replace(
        "samples = torch.load(", "samples = a_package_nobody_has.fetch(")
    root = write_tree(tmp_path, {"network.py": NETWORK, "main.py": script})
    run_ = smoke(root, [TargetRequest("main.py:train", kind="step")], steps=3, sandbox=False)
    head = run_.outcomes[0].head
    assert head["status"] == "passed", head


def test_definitions_only_keeps_what_runs_and_leaves_unset_what_fails():
    import ast

    source = textwrap.dedent('''
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--lr", type=float, default=0.1)
        args = parser.parse_args()
        ratio = 1 / 0


        def schedule(lr=args.lr):
            return lr


        def train(epoch):
            return epoch


        while True:
            pass
    ''')
    namespace: dict = {"__name__": "script"}
    exec(compile(ast.fix_missing_locations(_script_definitions(ast.parse(source))), "script.py", "exec"), namespace)
    assert namespace["train"](3) == 3 and "parser" in namespace
    assert "args" not in namespace and "ratio" not in namespace and "schedule" not in namespace


def test_a_loss_that_trains_a_module_built_inside_the_loop_is_undecided_not_a_detached_loss(tmp_path):
    # the module in scope when the loop starts is frozen inside the one the loop builds and trains: the loss
    # reaches parameters, only not those of the model the runner took, so no check about that model applies
    script = '''
        import torch
        import torch.nn as nn


        class Backbone(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = nn.Linear(8, 8)

            def forward(self, x):
                return self.proj(x)


        class Head(nn.Module):
            def __init__(self, backbone, classes):
                super().__init__()
                self.backbone = backbone
                self.out = nn.Linear(8, classes)

            def forward(self, x):
                with torch.no_grad():
                    features = self.backbone(x)
                return self.out(features)


        if __name__ == "__main__":
            backbone = Backbone()
            for classes in (2, 3):
                head = Head(backbone, classes)
                loss = head(torch.randn(4, 8)).pow(2).mean()
                loss.backward()
    '''
    root = write_tree(tmp_path, {"train.py": script})
    report = run(root, "train.py:__main__")
    assert report["status"] == "skipped", report
    assert "trains parameters outside the model the runner took" in report["reason"]
    assert f"train.py:{line_of(root, 'train.py', 'loss.backward()')}" in report["reason"]
