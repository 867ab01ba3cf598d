"""What reaches the pull request: every bug the change causes, each said once (end to end, emulator)."""
from __future__ import annotations

import json
import re

from analyzers.config import Config
from analyzers.engine import analyze_text
from bot.review import parse_fingerprints
from tests.conftest import completed_run, deliver, new_repo, pr_payload

TRAIN = """\
import torch
import torch.nn.functional as F


def train(model, loader, optimizer):
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
"""

MODEL = """\
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(x)


model = Net()
criterion = nn.CrossEntropyLoss()
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
"""


def bot_comments(state, pr):
    return [c for c in state.review_comments_for(pr) if c.user.login.endswith("[bot]")]


def reviewed_pr(stack, changed: dict, base: dict | None = None):
    """A new repository (``base`` on its default branch), a PR changing ``changed``, its ``opened``
    delivery, and the completed torchreview run: (state, repository name, PR, run)."""
    state = stack["state"]
    # the whole catalog: most rules these tests are about are preview rules (reported, never failing the check)
    repo, name = new_repo(state, {}, {".github/torchreview.yml": "preview: true\n", **(base or {})})
    pr = state.open_pull_request(repo, changed)
    deliver(stack, "pull_request", pr_payload("opened", name, pr))
    return state, name, pr, completed_run(state, pr.head_sha)


def test_a_pr_that_deletes_zero_grad_is_told_on_the_line_it_changed(stack):
    without_zero_grad = TRAIN.replace("        optimizer.zero_grad()\n", "")
    state, _, pr, run = reviewed_pr(stack, {"train.py": without_zero_grad}, base={"train.py": TRAIN})
    assert run.conclusion == "success"  # TR101 is a preview rule: reported on what the PR removed, never failing
    (comment,) = bot_comments(state, pr)
    assert "`TR101`" in comment.body
    assert "removes `optimizer.zero_grad()`" in comment.body
    # placed on a line of the diff (the deletion's context), inside train()
    assert 5 <= comment.line <= 10


def test_a_pr_that_only_adds_a_softmax_to_forward_is_told_about_the_loss_it_feeds(stack):
    head = MODEL.replace("        return self.fc(x)\n", "        return F.softmax(self.fc(x), dim=-1)\n")
    state, _, pr, _ = reviewed_pr(stack, {"model.py": head}, base={"model.py": MODEL})
    comments = bot_comments(state, pr)
    assert [c.line for c in comments] == [12]  # the changed return, not the untouched loss call
    assert "`TR401`" in comments[0].body and "finding is at line 18" in comments[0].body


def test_findings_the_base_already_had_are_not_the_prs_business(stack):
    old = 'import torch\n\nstate = torch.load("old.pt")\n'
    state, _, pr, _ = reviewed_pr(stack, {"load.py": old + '\nnew = torch.load("new.pt")\n'}, base={"load.py": old})
    (comment,) = bot_comments(state, pr)
    assert comment.line == 5 and "new.pt" in comment.body  # old.pt's finding predates the PR


MODEL_PY = """\
import torch.nn as nn


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(784, 1), nn.Sigmoid())

    def forward(self, x):
        return self.main(x).view(-1)
"""

TRAIN_GAN = """\
import torch.nn as nn
from model import Discriminator

netD = Discriminator().to("cuda")
criterion = nn.BCELoss()
for real, label in loader:
    errD = criterion(netD(real), label)
    errD.backward()
"""


def test_the_model_defined_in_another_file_of_the_repository_is_known(stack):
    # model.py is not part of the PR
    state, _, pr, _ = reviewed_pr(stack, {"train.py": TRAIN_GAN}, base={"model.py": MODEL_PY})
    (comment,) = bot_comments(state, pr)
    assert "`TR402`" in comment.body and "Discriminator.forward returns sigmoid" in comment.body
    assert comment.line == 7


def suggestion_of(body: str) -> str:
    return re.search(r"```suggestion\n(.*?)```", body, re.S).group(1)


def applied(source: str, comment) -> str:
    """``source`` after committing the comment's suggestion (it replaces lines start_line..line)."""
    lines = source.splitlines(keepends=True)
    start = comment.start_line or comment.line
    return "".join(lines[:start - 1]) + suggestion_of(comment.body) + "".join(lines[comment.line:])


VARIABLES = "import torch\nfrom torch.autograd import Variable\n\n" + "".join(
    f"x{n} = Variable(torch.zeros({n}))\n" for n in range(1, 101))


def test_a_file_with_100_variable_lines_gets_one_comment_that_lists_them_all(stack):
    state, _, pr, run = reviewed_pr(stack, {"tensors.py": VARIABLES})
    (comment,) = bot_comments(state, pr)
    assert "`TR803`" in comment.body and "100 findings in this file" in comment.body
    assert "lines 24, 25" in comment.body and "103" in comment.body  # past the listed messages: every line
    assert len(parse_fingerprints(comment.body)) == 100 and len(run.annotations) == 100
    # the first lines' fixes are one committable suggestion, the comment's range; the others name --fix
    assert (comment.start_line, comment.line) == (4, 15)
    fixed = applied(VARIABLES, comment)
    assert "x1 = torch.zeros(1)\n" in fixed and "x12 = torch.zeros(12)\n" in fixed
    assert "x13 = Variable(torch.zeros(13))" in fixed
    compile(fixed, "tensors.py", "exec")
    assert "`torchreview check --fix` applies all 100." in comment.body


DATALOADER = """\
import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

torch.manual_seed(0)
train_set = datasets.ImageFolder("data/train", transform=transforms.RandomResizedCrop(224))
loader = DataLoader(train_set, batch_size=64, shuffle=True)
model = torch.nn.Linear(3, 2).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    x, y = x.cuda(), y.cuda()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_a_dataloader_line_with_two_findings_gets_one_comment(stack):
    state, _, pr, _ = reviewed_pr(stack, {"train.py": DATALOADER})
    (comment,) = bot_comments(state, pr)
    assert comment.line == 7 and "`TR702`" in comment.body and "`TR703`" in comment.body
    assert len(parse_fingerprints(comment.body)) == 2


LOADS = "import argparse\n\nimport torch\n\nargs = argparse.ArgumentParser().parse_args()\n" + "".join(
    f"features{n} = torch.load(args.features{n})\n" for n in range(1, 5)) + "\nprint(features1)\n"


def test_four_loads_in_a_row_are_one_comment_whose_suggestion_fixes_all_and_resolves_it(stack):
    state, name, pr, _ = reviewed_pr(stack, {"eval.py": LOADS})
    (comment,) = bot_comments(state, pr)
    assert (comment.start_line, comment.line) == (6, 9) and "lines 6, 7, 8, 9" in comment.body
    fixed = applied(LOADS, comment)
    assert fixed.count("weights_only=True") == 4
    compile(fixed, "eval.py", "exec")

    head = state.push(pr, {"eval.py": fixed}, message="Apply suggestion from torchreview")
    deliver(stack, "pull_request", pr_payload("synchronize", name, pr))
    assert completed_run(state, head).conclusion == "success"
    assert len(bot_comments(state, pr)) == 1  # nothing new to say
    (thread,) = state.threads_for(pr)
    assert thread.is_resolved  # every finding the comment covered is gone


SEEDLESS = """\
import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

data = datasets.MNIST("data", train=True, download=True, transform=transforms.ToTensor())
model = torch.nn.Linear(784, 10)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in DataLoader(data, batch_size=8, shuffle=True, num_workers=2):
    loss = torch.nn.functional.cross_entropy(model(x.flatten(1)), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_the_same_finding_in_three_files_is_one_comment_whose_thread_resolves_when_all_are_fixed(stack):
    copies = {f"lesson{n}/train.py": SEEDLESS for n in (1, 2, 3)}
    state, name, pr, run = reviewed_pr(stack, copies)
    (comment,) = bot_comments(state, pr)
    assert comment.path == "lesson1/train.py" and comment.line == 11 and "`TR901`" in comment.body
    assert "`lesson2/train.py`: line 11; `lesson3/train.py`: line 11 (3 in this pull request)" in comment.body
    assert sorted(a["path"] for a in run.annotations if a["title"].startswith("TR901")) == sorted(copies)
    seeded = SEEDLESS.replace("import torch\n", "import torch\ntorch.manual_seed(0)\n", 1)
    # fixing two of the three leaves the comment open: it still says something true
    head = state.push(pr, {"lesson1/train.py": seeded, "lesson2/train.py": seeded})
    deliver(stack, "pull_request", pr_payload("synchronize", name, pr))
    completed_run(state, head)
    (thread,) = state.threads_for(pr)
    assert not thread.is_resolved and len(bot_comments(state, pr)) == 1
    head = state.push(pr, {"lesson3/train.py": seeded})
    deliver(stack, "pull_request", pr_payload("synchronize", name, pr))
    completed_run(state, head)
    (thread,) = state.threads_for(pr)
    assert thread.is_resolved and len(bot_comments(state, pr)) == 1


SAVES_ARGS = """\
import os
import torch


def save(args, student, epoch):
    save_dict = {"student": student.state_dict(), "epoch": epoch, "args": args}
    torch.save(save_dict, os.path.join(args.output_dir, "checkpoint.pth"))
"""


def test_a_load_of_checkpoints_that_hold_the_runs_args_gets_no_suggestion_and_names_who_saves_them(stack):
    visualize = "import torch\n\nstate = torch.load(args.pretrained_weights)\n"
    state, _, pr, _ = reviewed_pr(stack, {"visualize.py": visualize}, base={"main_train.py": SAVES_ARGS})
    (comment,) = bot_comments(state, pr)
    assert "`TR601`" in comment.body and "```suggestion" not in comment.body
    assert "`main_train.py` in this repository saves an argparse.Namespace" in comment.body
    assert "add\\_safe\\_globals" in comment.body or "add_safe_globals" in comment.body


def notebook_json(*cells: str) -> str:
    """A notebook as nbformat writes it (one source line per JSON line); each cell's code, with its output."""
    return json.dumps({"cells": [{"cell_type": "code", "execution_count": 1, "metadata": {},
                                  "outputs": [{"name": "stdout", "output_type": "stream", "text": ["ok\n"]}],
                                  "source": cell.splitlines(keepends=True)} for cell in cells],
                       "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, indent=1, sort_keys=True) + "\n"


def test_a_notebook_in_ipython_syntax_is_commented_on_the_json_lines_of_its_bugs(stack):
    notebook = notebook_json(
        "%%writefile requirements.txt\ntorch\nstate = torch.load(p)\n",  # a file's text, not Python: skipped
        "import torch\ngpu = !nvidia-smi\nif gpu:\n    !pip install timm\n    %load_ext autoreload\n"
        "for epoch in range(2):\n    !echo {epoch}\n    ckpt = torch.load(path)\n",
        " dataiter = iter(loader)\n images, labels = dataiter.next()\n",  # every line indented by one space
    )
    state, _, pr, run = reviewed_pr(stack, {"explore.ipynb": notebook})
    lines = notebook.split("\n")
    json_line = {text.strip(): n for n, text in enumerate(lines, 1)}
    placed = sorted((c.line, re.search(r"`(TR\d+)`", c.body).group(1)) for c in bot_comments(state, pr))
    assert placed == sorted([(json_line['"    ckpt = torch.load(path)\\n"'], "TR601"),
                             (json_line['" images, labels = dataiter.next()\\n"'], "TR815")])
    assert "not (fully) analyzed" not in run.output_summary  # no syntax error, no file left out
    assert "state = torch.load(p)" not in run.output_summary
    # the suggestion is JSON strings of the cell: committed, the notebook still reads and the finding is gone
    load, next_call = sorted(bot_comments(state, pr), key=lambda c: c.line)
    fixed = applied(notebook, load)
    assert json.loads(fixed)["cells"][1]["source"][-1] == "    ckpt = torch.load(path, weights_only=True)\n"
    assert [f.rule for f in analyze_text(fixed, "explore.ipynb", Config()).findings] == ["TR815"]
    # a dedented cell's fix would lose the cell's indent: said, but not offered as a suggestion
    assert "```suggestion" not in next_call.body and "next(dataiter)" in next_call.body
