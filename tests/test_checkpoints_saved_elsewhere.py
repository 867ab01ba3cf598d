"""A checkpoint one module of a repository loads and another one saves: what the repository index records about
``torch.save`` (analyzers/program/saves.py), the question ``CheckpointWrites.saved_elsewhere`` asks of it, and how
TR601 weighs a load of the repository's own file."""
from __future__ import annotations

import ast
from pathlib import Path

import libcst as cst
import pytest

from analyzers.config import Config
from analyzers.engine import analyze_source
from analyzers.model import Severity
from analyzers.program import CheckpointWrites, Payload
from analyzers.program.modules import RepositoryIndex, _walk, summarize
from analyzers.program.saves import checkpoint_saves
from analyzers.rules import all_rules

TENSORS = frozenset({Payload.TENSORS})


def saves(code: str):
    return [(set(s.files), set(s.keys), s.kinds) for s in checkpoint_saves(_walk(ast.parse(code)))]


@pytest.mark.parametrize("code, expected", [
    # state dicts and numbers in a dict built first, saved under an option's folder
    ("import os, torch\ndef run(args):\n    state = {'net': net.state_dict(), 'epoch': epoch}\n"
     "    torch.save(state, os.path.join(args.out_dir, 'last.ckpt'))\n",
     [({"last.ckpt"}, {"out_dir"}, TENSORS)]),
    # a saving helper: what its callers in the file hand it, the run's options among them
    ("import torch\ndef keep(obj, where):\n    torch.save(obj, where)\n"
     "keep({'net': net.state_dict(), 'opts': opts}, cfg['snapshot'])\n",
     [(set(), {"snapshot"}, frozenset({Payload.NAMESPACE, Payload.TENSORS}))]),
    # a whole module, into a file named by an f-string
    ("import torch\ntorch.save(encoder, f'{opts.run}/enc.bin')\n", [({"enc.bin"}, {"run"}, frozenset({Payload.MODULE}))]),
    # an unknown call's result: what it holds is not known
    ("import torch\ntorch.save(bundle(net), 'b.pt')\n", [({"b.pt"}, set(), None)]),
    # a helper no call in the file uses: its callers choose the file, nothing recorded
    ("import torch\ndef keep(obj, where):\n    torch.save(obj, where)\n", []),
])
def test_a_file_summary_records_each_checkpoint_by_its_path_and_what_it_holds(code, expected):
    assert saves(code) == expected
    assert [(set(s.files), set(s.keys), s.kinds) for s in summarize(code, "x.py").checkpoint_saves] == expected


def _repo(tmp_path, saver: str, loader: str, loader_path: str = "tools/score.py"):
    (tmp_path / ".git").mkdir()
    (tmp_path / "fit.py").write_text(saver)
    target = tmp_path / loader_path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(loader)
    return target


SAVER = ("import os, torch\ndef fit(opts):\n    snap = {'net': net.state_dict(), 'step': step}\n"
         "    torch.save(snap, os.path.join(opts.run_dir, 'top.ckpt'))\n")


@pytest.mark.parametrize("loader, expected", [
    # the same parts: the option's folder and the file name
    ("import os, torch\ndef score(opts):\n    snap = torch.load(os.path.join(opts.run_dir, 'top.ckpt'))\n",
     {"fit.py": TENSORS}),
    # through a name assigned first
    ("import os, torch\ndef score(opts):\n    where = os.path.join(opts.run_dir, 'top.ckpt')\n"
     "    snap = torch.load(where)\n", {"fit.py": TENSORS}),
    # the same file name in a folder from another option: someone else's
    ("import os, torch\ndef score(opts):\n    snap = torch.load(os.path.join(opts.import_dir, 'top.ckpt'))\n", {}),
    # another file name
    ("import os, torch\ndef score(opts):\n    snap = torch.load(os.path.join(opts.run_dir, 'other.ckpt'))\n", {}),
    # a helper's parameter that no call in the file fills: its callers pick the file
    ("import torch\ndef restore(where):\n    return torch.load(where)\n", {}),
])
def test_a_load_asks_which_other_module_saves_its_file(tmp_path, loader, expected):
    target = _repo(tmp_path, SAVER, loader)
    from tests.test_program_model import context, first

    ctx = context(loader, path=str(target), repository=RepositoryIndex(tmp_path))
    call = first(ctx, cst.Call, lambda node: ctx.call_name(node) == "torch.load")
    assert ctx.facts(CheckpointWrites).saved_elsewhere(call.args[0].value, call) == expected


def _tr601(tmp_path, saver: str, loader: str):
    target = _repo(tmp_path, saver, loader)
    rules = [rule for rule in all_rules() if rule.id == "TR601"]
    config = Config(preview=True, measured_severities=False)  # the rule's own severities, as the benches measure
    found = analyze_source(loader, str(target), config=config, rules=rules,
                           repository=RepositoryIndex(tmp_path)).findings
    assert len(found) == 1
    return found[0]


LOADER = ("import os, torch\ndef score(opts):\n    snap = torch.load(os.path.join(opts.run_dir, 'top.ckpt'))\n"
          "    net.load_state_dict(snap['net'])\n")


def test_the_repositorys_own_checkpoint_of_tensors_is_said_quietly_with_the_fix(tmp_path):
    finding = _tr601(tmp_path, SAVER, LOADER)
    assert finding.severity is Severity.LOW
    assert "`fit.py` in this repository saves this file with tensors and plain values only" in finding.message
    assert finding.fix is not None


def test_the_repositorys_own_checkpoint_holding_a_pickled_object_keeps_its_weight_and_says_who_saves_it(tmp_path):
    saver = SAVER.replace("'step': step", "'opts': opts")
    finding = _tr601(tmp_path, saver, LOADER)
    # as for any checkpoint known to need full unpickling, read from a folder the function's callers pick
    assert finding.severity is Severity.HIGH
    assert "`fit.py` in this repository saves an argparse.Namespace" in finding.message
    assert finding.fix is None


def test_a_file_no_module_of_the_repository_saves_keeps_its_severity(tmp_path):
    loader = LOADER.replace("opts.run_dir", "opts.import_dir")
    finding = _tr601(tmp_path, SAVER, loader)
    assert finding.severity is Severity.HIGH
    assert "in this repository" not in finding.message


def test_what_the_saver_holds_unknown_says_nothing_new(tmp_path):
    saver = SAVER.replace("torch.save(snap,", "torch.save(bundle(snap),")
    finding = _tr601(tmp_path, saver, LOADER)
    assert finding.severity is Severity.HIGH and "in this repository" not in finding.message


def test_the_scripts_of_the_folders_above_are_read_and_noted_for_the_results_cache(tmp_path):
    """A script one folder down reads the saves of the scripts above it; the results cache depends on those folders'
    listings and on each file read (one that never says ``save`` is read, not parsed)."""
    from analyzers.program.modules import recording

    target = _repo(tmp_path, SAVER, LOADER)
    (tmp_path / "data.py").write_text("import torch\nclass Frames(torch.utils.data.Dataset):\n    pass\n")
    with recording() as deps:
        near = RepositoryIndex(tmp_path).checkpoint_saves_near(target)
    assert list(near) == ["fit.py"]
    assert {Path(path).name for path, digest in deps.files.items() if digest} >= {"fit.py", "data.py"}
    assert any(Path(path).parent == tmp_path for path in deps.listings)


@pytest.mark.parametrize("own, other, expected", [
    # both hold tensors and numbers: the other module's save confirms the format
    ("{'net': net.state_dict()}", "'step': step", {"fit.py": TENSORS}),
    # the other module's save of that shape holds the run's options: the two disagree, judged by this file's saves
    ("{'net': net.state_dict()}", "'opts': opts", {}),
    # this file's own save holds a whole module: judged by this file's saves
    ("net", "'step': step", {}),
])
def test_a_script_that_writes_the_file_itself_asks_the_other_modules_only_when_they_agree(tmp_path, own, other,
                                                                                          expected):
    loader = LOADER + f"    torch.save({own}, os.path.join(opts.run_dir, 'top.ckpt'))\n"
    target = _repo(tmp_path, SAVER.replace("'step': step", other), loader)
    from tests.test_program_model import context, first

    ctx = context(loader, path=str(target), repository=RepositoryIndex(tmp_path))
    call = first(ctx, cst.Call, lambda node: ctx.call_name(node) == "torch.load")
    assert ctx.facts(CheckpointWrites).saved_elsewhere(call.args[0].value, call) == expected


def test_what_a_name_was_assigned_decides_before_what_it_is_called():
    """``config = {k: globals()[k] ...}`` and ``model_args = dict(...)`` hold plain values whatever their names say;
    the parsed arguments are a Namespace whatever theirs."""
    code = ("import torch\nconfig = {k: globals()[k] for k in keys}\nmodel_args = dict(n_layer=n_layer)\n"
            "settings = parser.parse_args()\n"
            "torch.save({'model': raw.state_dict(), 'model_args': model_args, 'config': config}, 'a.pt')\n"
            "torch.save({'model': raw.state_dict(), 'settings': settings}, 'b.pt')\n")
    assert [kinds for _, _, kinds in saves(code)] == [TENSORS, frozenset({Payload.TENSORS, Payload.NAMESPACE})]


def _tr601_alone(code: str):
    rules = [rule for rule in all_rules() if rule.id == "TR601"]
    config = Config(preview=True, measured_severities=False)
    return analyze_source(code, "fit.py", config=config, rules=rules).findings


RESUME = ("import os, torch\nif opts.resume:\n    state = torch.load(os.path.join(opts.run_dir, 'last.ckpt'))\n"
          "    net.load_state_dict(state['net'])\nfor epoch in range(opts.epochs):\n"
          "    torch.save({SAVED}, os.path.join(opts.run_dir, 'last.ckpt'))\n")


def test_a_resume_of_the_scripts_own_checkpoint_of_tensors_is_said_quietly_with_the_fix():
    # the script writes that file itself, with a state dict and a number: the program's own checkpoint
    found = _tr601_alone(RESUME.replace("{SAVED}", "{'net': net.state_dict(), 'epoch': epoch}"))
    assert [f.severity for f in found] == [Severity.LOW]
    assert "this file saves it with tensors and plain values only" in found[0].message
    assert found[0].fix is not None


@pytest.mark.parametrize("saved", [
    "{'net': net.state_dict(), 'opts': opts}",  # the run's options: a Namespace weights_only=True refuses
    "state",  # what the loaded checkpoint held, which nothing here shows
])
def test_a_resume_of_a_checkpoint_the_script_saves_with_more_than_tensors_keeps_its_weight(saved):
    found = _tr601_alone(RESUME.replace("{SAVED}", saved))
    assert len(found) == 1 and found[0].severity is not Severity.LOW
    assert "this file saves it with tensors" not in found[0].message
