"""The App's review adds no noise of its own, end to end (webhook, Redis, a worker, the GitHub emulator): an
unchanged file's errors are not the PR's, a finding is the PR's only when the base, analyzed in the base's tree
with its pins, did not have it, and a coding cookie naming a codec we lack is read as UTF-8 with a note."""
from __future__ import annotations

from tests.conftest import completed_run, deliver, new_repo, pr_payload
from tests.test_review_noise import MODEL, RATIO, TRAIN


# TR402, TR413 and TR601 are preview rules: the repository opts in (their findings never fail the check)
PREVIEW = {".github/torchreview.yml": "preview: true\n"}


def reviewed(stack, base: dict, change: dict):
    state = stack["state"]
    repo, name = new_repo(state, {}, {**PREVIEW, **base})
    pr = state.open_pull_request(repo, change)
    assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
    run = completed_run(state, pr.head_sha)
    comments = [c for c in state.review_comments_for(pr) if c.user.login.endswith("[bot]")]
    return run, comments


def rules_reported(run, comments) -> set[tuple[str, str]]:
    return ({(a["path"], a["title"].split()[0]) for a in run.annotations}
            | {(c.path, rule) for c in comments for rule in ("TR402", "TR413", "TR601") if rule in c.body})


def test_an_unchanged_imported_file_with_a_syntax_error_is_not_the_prs(stack):
    run, comments = reviewed(stack, {"model.py": "import torch\ndef broken(:\n", "train.py": "import torch\n"},
                             {"train.py": "import torch\nfrom model import broken\nx = torch.zeros(3)\n"})
    assert run.conclusion == "success"
    assert "model.py" not in run.output_summary and "syntax" not in run.output_summary
    assert comments == []


def test_a_pinned_finding_of_an_edited_file_is_not_new(stack):
    run, comments = reviewed(stack, {"requirements.txt": "torch==1.6.0\n", "train.py": RATIO},
                             {"train.py": "# evaluation\n" + RATIO + "print(acc)\n"})
    assert rules_reported(run, comments) == set()
    assert "not reported" in run.output_summary  # the head has it (it reads the pins): the base had it too


def test_a_finding_the_prs_pin_change_causes_is_the_prs(stack):
    run, comments = reviewed(stack, {"requirements.txt": "torch>=1.8\n", "train.py": RATIO},
                             {"requirements.txt": "torch==1.6.0\n", "train.py": "# evaluation\n" + RATIO})
    assert rules_reported(run, comments) == {("train.py", "TR413")}
    assert "1.6.0 (requirements.txt)" in next(c.body for c in comments if "TR413" in c.body)


def test_a_finding_another_file_causes_is_the_prs_only_when_the_pr_makes_it(stack):
    run, comments = reviewed(stack, {"model.py": MODEL, "train.py": TRAIN}, {"train.py": "# training\n" + TRAIN})
    assert rules_reported(run, comments) == set()
    run, comments = reviewed(stack, {"model.py": MODEL.replace("self.sig(self.fc(x))", "self.fc(x)"), "train.py": TRAIN},
                             {"model.py": MODEL, "train.py": "# training\n" + TRAIN})
    assert rules_reported(run, comments) == {("train.py", "TR402")}


def test_a_coding_cookie_naming_a_codec_we_lack_is_read_as_utf8(stack):
    source = "# -*- coding: future_fstrings -*-\nimport torch\nname = 'café'\nstate = torch.load(f'{name}.pt')\n"
    run, comments = reviewed(stack, {}, {"train.py": source})
    assert rules_reported(run, comments) == {("train.py", "TR601")}
    assert "`train.py`" in run.output_summary and "read and analyzed as UTF-8" in run.output_summary


def test_a_cached_result_is_not_reused_under_other_pins(stack):
    state = stack["state"]
    repo, name = new_repo(state, {}, {**PREVIEW, "requirements.txt": "torch>=1.8\n", "train.py": RATIO})
    pr = state.open_pull_request(repo, {"train.py": "# evaluation\n" + RATIO})
    deliver(stack, "pull_request", pr_payload("opened", name, pr))
    run = completed_run(state, pr.head_sha)
    assert rules_reported(run, []) == set()
    head = state.push(pr, {"requirements.txt": "torch==1.6.0\n"})  # train.py's blob is the same: the pins are not
    deliver(stack, "pull_request", pr_payload("synchronize", name, pr))
    run = completed_run(state, head)
    assert rules_reported(run, []) == {("train.py", "TR413")}
