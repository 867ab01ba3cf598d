"""The program model (analyzers/program): the questions rules ask, answered on code shaped like real code."""
from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest

from analyzers.context import FileContext, code_children, dotted_name
from analyzers.engine import analyze_source
from analyzers.program import CheckpointWrites, Payload, call_site_values, in_compat_fallback, mutated_names
from analyzers.program.flow import assignment_before, stored_attributes, subtree
from analyzers.program.modules import ModuleFacts, RepositoryIndex, index_for, repository_root, summarize
from analyzers.program.values import constructor, model_class
from analyzers.rules import all_rules


def context(code: str, path: str = "example.py", repository=None) -> FileContext:
    """A file context after a full walk (parents known), as rules see it at end_file."""
    source = textwrap.dedent(code)
    module = cst.parse_module(source)
    ctx = FileContext(path, source, module)
    ctx.repository = repository
    from analyzers.engine import _Walker

    _Walker(ctx, [], lambda rule, exc: None).walk(module)
    return ctx


def first(ctx: FileContext, kind: type, predicate=lambda node: True):
    return next(node for node in subtree(ctx.module) if isinstance(node, kind) and predicate(node))


# ---- flow ------------------------------------------------------------------------------------------------

def test_mutations_and_stores_of_a_parameter():
    ctx = context("""
        def __init__(self, dims=[], cfg={}, names=[]):
            dims.append(3)
            cfg["k"] = 1
            self.names = names
            total = sum(names)
    """)
    fn = first(ctx, cst.FunctionDef)
    assert mutated_names(fn.body) == {"dims", "cfg"}
    assert stored_attributes(fn.body, {"names", "dims"}) == {"names": "self.names"}


def test_call_site_values_are_the_callers_arguments_and_unknown_with_star_args():
    ctx = context("""
        def train(model, loader, save_path):
            pass
        train(net, dl, "best.pt")
        train(model=other, loader=dl, save_path="last.pt")
        model.train()
    """)
    fn = first(ctx, cst.FunctionDef)
    values = call_site_values(ctx, fn, "save_path")
    assert [v.evaluated_value for v in values] == ["best.pt", "last.pt"]  # model.train() is not a call of it
    starred = context("def train(model):\n    pass\ntrain(*args)\n")
    assert call_site_values(starred, first(starred, cst.FunctionDef), "model") is None


def test_a_parameter_is_the_module_every_caller_passes():
    from analyzers.program.builds import passed_module

    code = """
        import torch.nn as nn
        class Scorer(nn.Module):
            pass
        def score(head, xs):
            return [head(x) for x in xs]
        def run(xs):
            head = Scorer().to("cpu")
            score(head, xs)
            score(Scorer().eval(), xs)
    """
    ctx = context(code)
    fn = first(ctx, cst.FunctionDef, lambda f: f.name.value == "score")
    use = first(ctx, cst.Call, lambda c: isinstance(c.func, cst.Name) and c.func.value == "head")
    built = passed_module(ctx, use.func, use)
    assert built is not None and built.model and not built.eval_mode  # one caller's is in training mode
    unknown = context(code + "    score(pick(), xs)\n")
    use = first(unknown, cst.Call, lambda c: isinstance(c.func, cst.Name) and c.func.value == "head")
    assert passed_module(unknown, use.func, use) is None  # a caller passes what the file does not show
    assert fn is not None


def test_items_of_a_list_filled_item_by_item():
    from analyzers.program.flow import item_values

    ctx = context("""
        class Feeds:
            def __init__(self, loaders):
                self.iters = []
                for loader in loaders:
                    self.iters.append(iter(loader))
            def refill(self, i, loader):
                self.iters[i] = iter(loader)
            def pull(self):
                for i, it in enumerate(self.iters):
                    it.next()
                return self.iters[0]
        other = make_list()
        for thing in other:
            thing.next()
    """)
    loop_read = first(ctx, cst.Call, lambda c: isinstance(c.func, cst.Attribute) and
                      isinstance(c.func.value, cst.Name) and c.func.value.value == "it")
    assert [cst.Module([]).code_for_node(v) for v in item_values(ctx, loop_read.func.value)] == \
        ["iter(loader)", "iter(loader)"]
    indexed = first(ctx, cst.Subscript, lambda s: isinstance(ctx.parent(s), cst.Return))
    assert len(item_values(ctx, indexed)) == 2
    unknown = first(ctx, cst.Call, lambda c: isinstance(c.func, cst.Attribute) and
                    isinstance(c.func.value, cst.Name) and c.func.value.value == "thing")
    assert item_values(ctx, unknown.func.value) is None  # a list built by a call: its items are not known


def test_a_global_read_inside_a_function_finds_the_module_assignment():
    ctx = context("""
        import torch.nn as nn
        model = nn.Linear(4, 2).to("cuda")
        def test():
            return model(x)
    """)
    use = first(ctx, cst.Call, lambda c: isinstance(c.func, cst.Name) and c.func.value == "model")
    value = assignment_before(ctx, use, "model")
    assert ctx.module.code_for_node(value) == 'nn.Linear(4, 2).to("cuda")'


# ---- values --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("code", [
    "model = Net()\nmodel = model.to(device)\nout = model(x)\n",                        # reassigned to itself
    "net = torch.compile(Net().cuda())\nout = net(x)\n",                               # wrappers
    "def train(model):\n    out = model(x)\ndef main():\n    m = Net().to(d)\n    train(m)\n",  # via a caller
])
def test_the_model_class_is_followed_through_the_idioms_people_write(code):
    ctx = context("import torch\n" + code)
    use = [c for c in subtree(ctx.module) if isinstance(c, cst.Call) and isinstance(c.func, cst.Name)
           and c.func.value in ("model", "net")][-1]
    assert model_class(ctx, use.func, use) == "Net"


def test_library_models_are_not_repository_classes():
    ctx = context("import torchvision\nmodel = torchvision.models.resnet18()\nout = model(x)\n")
    use = [c for c in subtree(ctx.module) if isinstance(c, cst.Call) and isinstance(c.func, cst.Name)][-1]
    assert model_class(ctx, use.func, use) is None
    ctx = context("import torch.nn as nn\nmodel = nn.Linear(4, 2).cuda()\nout = model(x)\n")
    use = [c for c in subtree(ctx.module) if isinstance(c, cst.Call) and isinstance(c.func, cst.Name)][-1]
    assert model_class(ctx, use.func, use) is None  # a torch.nn layer, not a class of the repository
    assert ctx.module.code_for_node(constructor(ctx, use.func, use).func) == "nn.Linear"


# ---- roles ---------------------------------------------------------------------------------------------

def test_compat_fallbacks():
    ctx = context("""
        try:
            s = torch.load(p, weights_only=True)
        except TypeError:
            s = torch.load(p)
    """)
    loads = [c for c in subtree(ctx.module) if isinstance(c, cst.Call)]
    assert [in_compat_fallback(ctx, c) for c in loads] == [False, True]


def test_checkpoint_payloads_say_whether_weights_only_can_load_them():
    ctx = context("""
        import torch
        torch.save({"model": model.state_dict(), "epoch": 3}, "a.pt")
        torch.save({"model": model.state_dict(), "args": args}, "b.pt")
        torch.save(model, "c.pt")
        ckpt = {"state": net.state_dict()}
        ckpt["config"] = cfg
        torch.save(ckpt, "d.pt")
        torch.save(features.numpy(), "e.npy")
    """)
    writes = ctx.facts(CheckpointWrites).writes
    assert [w.payloads for w in writes] == [{Payload.TENSORS}, {Payload.TENSORS, Payload.NAMESPACE},
                                           {Payload.MODULE}, {Payload.TENSORS, Payload.NAMESPACE}, {Payload.NUMPY}]



def test_a_module_built_by_a_constructor_and_saved_whole_is_a_module_payload():
    ctx = context("""
        import torch
        if args.resume_snapshot:
            model = torch.load(args.resume_snapshot)
        else:
            model = Classifier(config).to(device)
        torch.save(model, snapshot_path)
        encoder = Encoder(3)
        torch.save(encoder.state_dict(), "encoder.pt")
    """)
    assert [w.payloads for w in ctx.facts(CheckpointWrites).writes] == [{Payload.MODULE, Payload.TENSORS},
                                                                       {Payload.TENSORS}]


def test_save_on_master_writes_a_checkpoint():
    ctx = context("""
        import torch
        import utils
        to_save = {"model": model.state_dict(), "epoch": epoch}
        to_save["args"] = args
        utils.save_on_master(to_save, os.path.join(args.output_dir, "checkpoint.pth"))
    """)
    [write] = ctx.facts(CheckpointWrites).writes
    assert write.payloads == {Payload.TENSORS, Payload.NAMESPACE} and write.path_literals == {"checkpoint.pth"}


@pytest.mark.parametrize("code, refused", [
    ("import torch\ntorch.save({'model': model.state_dict(), 'args': args}, 'ckpt.pth')\n", {Payload.NAMESPACE}),
    ("import torch\nto_save = {'model': m.state_dict()}\nto_save['config'] = cfg\n"
     "misc.save_on_master(to_save, path)\n", {Payload.NAMESPACE}),
    ("import torch\ntorch.save(model, 'snapshot.pt')\n", {Payload.MODULE}),
    ("import numpy as np\nimport torch\ntorch.save(np.sin(x), open('traindata.pt', 'wb'))\n", {Payload.NUMPY}),
    ("import torch\ntorch.save({'model': model.state_dict(), 'epoch': 3}, 'ckpt.pth')\n", set()),
    ("import torch\ntorch.save(model.state_dict(), 'm.pt')\nimage.save('x.png')\n", set()),
    # names that sound like a config object or a model, assigned plain values: what they hold decides
    ("import torch\nconfig = {k: globals()[k] for k in keys}\nmodel_args = dict(n_layer=4)\n"
     "ckpt = {'model': m.state_dict(), 'model_args': model_args, 'config': config}\ntorch.save(ckpt, 'c.pt')\n", set()),
    ("import torch\nsettings = parser.parse_args()\ntorch.save({'m': m.state_dict(), 'settings': settings}, 'c.pt')\n",
     {Payload.NAMESPACE}),
])
def test_a_file_summary_knows_what_its_checkpoints_hold_that_weights_only_refuses(code, refused):
    assert summarize(code, "x.py").refused_payloads == refused


def test_checkpoints_saved_beside_a_file_or_by_a_module_it_imports(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "util").mkdir()
    (tmp_path / "util" / "misc.py").write_text("import torch\ndef save_model(args, model):\n"
                                               "    torch.save({'model': model.state_dict(), 'args': args}, 'c.pth')\n")
    (tmp_path / "pretrain.py").write_text("import torch\ntorch.save(model, 'whole.pt')\n")
    (tmp_path / "finetune.py").write_text("import util.misc as misc\nimport torch\nckpt = torch.load(args.finetune)\n")
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "convert.py").write_text("import torch\nsd = torch.load(args.weights)\n")
    index = RepositoryIndex(tmp_path)
    assert index.refused_payloads_near(tmp_path / "finetune.py") == {"util/misc.py": {Payload.NAMESPACE},
                                                                     "pretrain.py": {Payload.MODULE}}
    assert index.refused_payloads_near(tmp_path / "tools" / "convert.py") == {}



def test_a_neighbour_that_never_saves_is_read_for_the_question_of_what_it_saves_and_still_a_dependency(tmp_path):
    """``refused_payloads_near`` over a folder where one script saves a whole module and another never says ``save``:
    the answer names the saver only, and the results cache still depends on both files' bytes (an edit that adds a
    save to the other one must re-run the analysis)."""
    from analyzers.program.modules import recording

    (tmp_path / ".git").mkdir()
    (tmp_path / "pretrain.py").write_text("import torch\ntorch.save(model, 'whole.pt')\n")
    (tmp_path / "data.py").write_text("import torch\nclass Frames(torch.utils.data.Dataset):\n    pass\n")
    (tmp_path / "finetune.py").write_text("import torch\nckpt = torch.load(args.finetune)\n")
    index = RepositoryIndex(tmp_path)
    with recording() as deps:
        assert index.refused_payloads_near(tmp_path / "finetune.py") == {"pretrain.py": {Payload.MODULE}}
    assert {Path(path).name for path, digest in deps.files.items() if digest} >= {"pretrain.py", "data.py"}
    assert index.summary(tmp_path / "data.py").classes["Frames"].bases  # asked for itself, it is summarized
    (tmp_path / "data.py").write_text("import torch\ntorch.save(net, 'net.pt')\n")
    assert RepositoryIndex(tmp_path).refused_payloads_near(tmp_path / "finetune.py") == {
        "pretrain.py": {Payload.MODULE}, "data.py": {Payload.MODULE}}

RESUME_THEN_TRAIN = """
    import os
    import torch
    out_dir = "out"
    exec(open("configurator.py").read())  # any global may come from the command line
    {load}
    for step in range(100):
        torch.save(checkpoint, os.path.join(out_dir, "ckpt.pt"))
    {after}
"""


@pytest.mark.parametrize("load, after, self_written", [
    # a resume before the loop that writes the file: from an earlier run, wherever out_dir points
    ('checkpoint = torch.load(os.path.join(out_dir, "ckpt.pt"))', "", False),
    ('ckpt_path = os.path.join(out_dir, "ckpt.pt")\n    checkpoint = torch.load(ckpt_path)', "", False),
    # the best checkpoint reloaded after the loop saved it
    ("", 'model.load_state_dict(torch.load(os.path.join(out_dir, "ckpt.pt")))', True),
    # a cache: load it when it exists, else build and save it
    ('if os.path.exists(os.path.join(out_dir, "ckpt.pt")):\n        checkpoint = torch.load('
     'os.path.join(out_dir, "ckpt.pt"))\n    else:\n        torch.save(build(), os.path.join(out_dir, "ckpt.pt"))',
     "", True),
    # a helper: when it runs is not known here
    ('def resume():\n        return torch.load(os.path.join(out_dir, "ckpt.pt"))', "", True),
])
def test_a_checkpoint_counts_as_self_written_only_when_it_can_be_saved_before_the_load(load, after, self_written):
    ctx = context(RESUME_THEN_TRAIN.format(load=load, after=after))
    call = first(ctx, cst.Call, lambda node: ctx.call_name(node) == "torch.load")
    path = call.args[0].value
    assert ctx.facts(CheckpointWrites).written_before_loaded(path, ctx.origin(path)) is self_written


RESTORE_THEN_TRAIN = """
    import os
    import torch
    try:
        pair = torch.load({load})
    except FileNotFoundError:
        pair = fresh()
    for epoch in range(4):
        fit(pair)
        torch.save(pair, {save})
"""


@pytest.mark.parametrize("load, save, fixed", [
    # the same file spelled whole on both sides: what an earlier run of this program left there
    ("'./state/pair.bin'", "'state/pair.bin'", True),
    ("os.path.join('state', 'pair.bin')", "'state/pair.bin'", True),
    # a different fixed file: nothing of this program writes it
    ("'state/other.bin'", "'state/pair.bin'", False),
    # a folder or a file the run's settings choose: wherever they point, not this program's own file
    ("os.path.join(folder, 'pair.bin')", "os.path.join(folder, 'pair.bin')", False),
    ("opts.resume", "'state/pair.bin'", False),
    ("f'state/{tag}.bin'", "f'state/{tag}.bin'", False),
    # an f-string with nothing to fill in is spelled whole too
    ("'state/pair.bin'", "f'./state/pair.bin'", True),
    ("f'state/{{pair}}.bin'", "'state/{pair}.bin'", False),
])
def test_a_fixed_file_the_program_saves_to_is_its_own_whatever_the_order(load, save, fixed):
    ctx = context(RESTORE_THEN_TRAIN.format(load=load, save=save))
    call = first(ctx, cst.Call, lambda node: ctx.call_name(node) == "torch.load")
    assert ctx.facts(CheckpointWrites).writes_fixed_path(call.args[0].value) is fixed


def test_a_load_in_the_loop_that_saves_reads_the_previous_iterations_file():
    ctx = context("""
        import torch
        for epoch in range(3):
            if epoch:
                model.load_state_dict(torch.load("last.pt"))
            torch.save(model.state_dict(), "last.pt")
    """)
    call = first(ctx, cst.Call, lambda node: ctx.call_name(node) == "torch.load")
    assert ctx.facts(CheckpointWrites).written_before_loaded(call.args[0].value, None)


TWO_HELPERS = """
    import os
    import torch
    def keep_best(opts, net):
        FILE = "weights.bin"
        folder = os.path.join(opts.out, "top")
        target = os.path.join(folder, FILE)
        torch.save(net.state_dict(), target)
    def restore_best(opts, net):
        FILE = "weights.bin"
        top = os.path.join(opts.out, {sub})
        source = os.path.join(top, FILE)
        net.load_state_dict(torch.load(source))
"""


@pytest.mark.parametrize("sub, own", [
    ('"top"', True),  # built from the same parts under other local names: the file the other helper saves
    ('"final"', False),  # another folder: a file nothing here writes
    ("opts.folder", False),
])
def test_a_path_two_helpers_build_from_the_same_parts_is_the_programs_own(sub, own):
    ctx = context(TWO_HELPERS.format(sub=sub))
    call = first(ctx, cst.Call, lambda node: ctx.call_name(node) == "torch.load")
    assert ctx.facts(CheckpointWrites).written_before_loaded(call.args[0].value, None) is own


def test_a_folder_a_loading_function_is_handed_may_hold_anyones_file():
    ctx = context("""
        import torch
        def write_parts(parts, folder):
            for key, part in parts.items():
                target = (folder / key).with_suffix(".pt")
                torch.save(part, target)
        def read_part(key, folder):
            source = (folder / key).with_suffix(".pt")
            return torch.load(source)
    """)
    call = first(ctx, cst.Call, lambda node: ctx.call_name(node) == "torch.load")
    assert not ctx.facts(CheckpointWrites).written_before_loaded(call.args[0].value, None)


@pytest.mark.parametrize("load, own", [
    ("'snap_30_%s.pt' % device", True),  # one epoch's file of the template the loop saves
    ("'snap_%d_%s.pt' % (last, device)", True),
    ("'other_30_%s.pt' % device", False),
    ("'snap_30.pt'", False),  # no slot: not one of the template's files by its spelling
])
def test_a_template_with_a_slot_filled_in_the_text_reads_a_file_the_loop_saved(load, own):
    ctx = context(f"""
        import torch
        for epoch in range(40):
            fit(net)
            torch.save(net.state_dict(), 'snap_%d_%s.pt' % (epoch, device))
        net.load_state_dict(torch.load({load}))
    """)
    call = first(ctx, cst.Call, lambda node: ctx.call_name(node) == "torch.load")
    assert ctx.facts(CheckpointWrites).written_before_loaded(call.args[0].value, None) is own


@pytest.mark.parametrize("keyword, own", [
    ("checkpoint_save_file", True),  # the imported helper's parameter says it saves there
    ("init_from", False),  # a file handed to the helper to read: another run's, wherever it came from
])
def test_a_file_handed_to_an_imported_helper_by_a_saving_keyword_is_the_programs_own(keyword, own):
    ctx = context(f"""
        import torch
        from trainers import fit_epochs
        fit_epochs(net, loaders, {keyword}='top-scorer.bin')
        net.load_state_dict(torch.load('top-scorer.bin'))
    """)
    call = first(ctx, cst.Call, lambda node: ctx.call_name(node) == "torch.load")
    assert ctx.facts(CheckpointWrites).written_before_loaded(call.args[0].value, None) is own


# ---- the repository index ------------------------------------------------------------------------------

MODEL = """\
import torch.nn as nn
from .blocks import Head


class Net(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.rnn = nn.LSTM(8, 8)
        self.head = Head(8, vocab_size)
        self.sig = nn.Sigmoid()

    def forward(self, x, h):
        out, h = self.rnn(x, h)
        out = self.sig(self.head(out))
        out = out[:, -1]
        return out, h
"""
BLOCKS = """\
import torch.nn as nn


class Head(nn.Module):
    def __init__(self, d, vocab_size):
        super().__init__()
        self.drop = nn.Dropout(0.1)
        self.fc = nn.Linear(d, vocab_size)
"""


@pytest.fixture
def repo(tmp_path):
    (tmp_path / ".git").mkdir()
    package = tmp_path / "models"
    package.mkdir()
    (package / "__init__.py").write_text("from .net import Net\n")  # a re-export
    (package / "net.py").write_text(MODEL)
    (package / "blocks.py").write_text(BLOCKS)
    (tmp_path / "train.py").write_text("from models import Net\nnet = Net(100)\n")
    return tmp_path


def test_classes_are_found_through_imports_and_re_exports(repo):
    index = RepositoryIndex(repo)
    net = index.find_class(repo / "train.py", "Net")
    assert net is not None and net.path.endswith("net.py")
    assert index.forward_activation(net) == "sigmoid"  # through a tuple return, a subscript, a reassignment
    assert index.features(net) >= {"recurrent", "dropout", "vocab-output"}  # Head's layers, in another file
    assert index_for(repo / "train.py").root == repo.resolve() == repository_root(repo / "models" / "net.py")


def test_a_module_named_setup_inside_a_package_is_not_the_project_root(tmp_path):
    # a copy without .git: the project's README marks the root; ``setup.py`` beside ``__init__.py`` is one of the
    # package's modules (it sets the evaluation up), so the package's classes are found from its other modules
    (tmp_path / "README.md").write_text("a project\n")
    package = tmp_path / "proj" / "evaluate"
    package.mkdir(parents=True)
    (tmp_path / "proj" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "setup.py").write_text("def prepare():\n    return None\n")
    (package / "wrappers.py").write_text("import torch.nn as nn\nclass Frozen(nn.Module):\n"
                                         "    def __init__(self, inner):\n        super().__init__()\n"
                                         "        self.inner = inner\n        self.inner.eval()\n")
    (package / "probe.py").write_text("from proj.evaluate.wrappers import Frozen\n")
    assert repository_root(package / "probe.py") == tmp_path.resolve()
    found = RepositoryIndex(tmp_path).find_class(package / "probe.py", "Frozen")
    assert found is not None and found.init_evaluates
    # a folder that is no package keeps its setup.py as the marker of a project of its own
    tool = tmp_path / "tools" / "exporter"
    tool.mkdir(parents=True)
    (tool / "setup.py").write_text("from setuptools import setup\nsetup(name='exporter')\n")
    (tool / "export.py").write_text("")
    assert repository_root(tool / "export.py") == tool.resolve()


def test_submodule_classes_named_in_lower_case_are_resolved_through_star_imports(tmp_path):
    # a model assembled from blocks whose class names are lower case (``conv_block``), defined in a module the
    # model's file star-imports: what eval() changes in it is known, not taken for "nothing"
    (tmp_path / ".git").mkdir()
    (tmp_path / "parts.py").write_text(textwrap.dedent("""
        import torch.nn as nn
        class conv_block(nn.Module):
            def __init__(self, c):
                super().__init__()
                self.body = nn.Sequential(nn.Conv2d(c, c, 3), nn.BatchNorm2d(c), nn.ReLU())
        def make_head(c):
            return nn.Conv2d(c, 1, 1)
    """))
    (tmp_path / "model.py").write_text(textwrap.dedent("""
        import torch.nn as nn
        from parts import *
        class Segmenter(nn.Module):
            def __init__(self):
                super().__init__()
                self.enc = conv_block(8)
                self.head = make_head(8)
                self.size = int(8)
    """))
    index = RepositoryIndex(tmp_path)
    segmenter = index.find_class(tmp_path / "model.py", "Segmenter")
    assert index.features(segmenter) == {"batchnorm"}  # a helper function and a builtin add nothing
    ctx = context("import torch.nn as nn\nnet = nn.Sequential(nn.Linear(2, 2), block(2))\n")
    call = first(ctx, cst.Call)
    from analyzers.program.modules import torch_layer_features
    assert torch_layer_features(ctx, call) is None  # holds something not from torch.nn: unknown
    ctx = context("import torch.nn as nn\nnet = nn.Sequential(nn.Linear(2, 2), nn.ReLU())\n")
    assert torch_layer_features(ctx, first(ctx, cst.Call)) == set()


def test_a_prediction_helper_of_a_model_built_from_lower_case_blocks_is_told_to_call_eval(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "blocks.py").write_text(textwrap.dedent("""
        import torch.nn as nn
        class down(nn.Module):
            def __init__(self, c):
                super().__init__()
                self.conv = nn.Sequential(nn.Conv2d(c, c, 3), nn.BatchNorm2d(c))
    """))
    (tmp_path / "unet.py").write_text(textwrap.dedent("""
        import torch.nn as nn
        from blocks import *
        class UNet(nn.Module):
            def __init__(self):
                super().__init__()
                self.down1 = down(3)
    """))
    text = textwrap.dedent("""
        import torch
        from unet import UNet
        def predict_mask(net, image):
            with torch.no_grad():
                return net(image) > 0.5
        if __name__ == "__main__":
            net = UNet()
            net.load_state_dict(torch.load("unet.pth", weights_only=True))
            predict_mask(net, torch.zeros(1, 3, 8, 8))
    """)
    (tmp_path / "predict.py").write_text(text)
    rules = [r for r in all_rules() if r.id == "TR201"]
    found = analyze_source(text, str(tmp_path / "predict.py"), rules=rules, repository=RepositoryIndex(tmp_path))
    assert [(f.rule, f.line) for f in found.findings] == [("TR201", 6)]


def _package_calls(tmp_path, modules: dict[str, str], text: str):
    """Write ``modules`` and ``calc.py`` (``text``) into a package of a repository; the qualified name of every
    call of ``calc.py``, by its source."""
    (tmp_path / ".git").mkdir()
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, source in modules.items():
        (package / name).write_text(source)
    (package / "calc.py").write_text(text)
    ctx = context(text, path=str(package / "calc.py"), repository=RepositoryIndex(tmp_path))
    return {ctx.module.code_for_node(n): ctx.qualified_name(n.func) for n in subtree(ctx.module)
            if isinstance(n, cst.Call)}


def test_names_brought_by_star_imports_of_repository_modules_resolve_to_their_library(tmp_path):
    # ``from .utils import *`` where utils star-imports a module that does ``import numpy as np``: ``np`` is
    # numpy in the importing file; a class the repository defines is no library name
    text = "import torch\nfrom .utils import *\nx = np.asarray(v, dtype=np.float)\ny = Variable(t)\nz = Tensor()\nw = other()\n"
    names = _package_calls(tmp_path, {"base.py": "import numpy as np\nfrom torch.autograd import Variable\n",
                                      "utils.py": "from .base import *\nclass Tensor:\n    pass\n"}, text)
    assert names == {"np.asarray(v, dtype=np.float)": "numpy.asarray", "Variable(t)": "torch.autograd.Variable",
                     "Tensor()": None, "other()": None}
    path = str(tmp_path / "pkg" / "calc.py")
    rules = [r for r in all_rules() if r.id in ("TR817", "TR803")]
    found = analyze_source(text, path, rules=rules, repository=RepositoryIndex(tmp_path))
    assert sorted((f.rule, f.line) for f in found.findings) == [("TR803", 4), ("TR817", 3)]
    alone = analyze_source(text, path, rules=rules)
    assert alone.findings == []  # without the repository nothing says what the names are


def test_a_later_star_import_shadows_an_earlier_one_and_a_repository_class_shadows_a_deeper_library_name(tmp_path):
    names = _package_calls(tmp_path, {"old.py": "import numpy as np\nfrom torch.autograd import Variable\n",
                                      "new.py": "import jax.numpy as np\n",
                                      "own.py": "from .deep import *\n",
                                      "deep.py": "class Variable:\n    pass\n"},
                           "from .old import *\nfrom .new import *\nfrom .own import *\na = np.zeros(2)\nb = Variable(a)\n")
    assert names == {"np.zeros(2)": "jax.numpy.zeros", "Variable(a)": None}


def test_summaries_are_cached_by_content(repo):
    index = RepositoryIndex(repo)
    first_summary = index.summary(repo / "models" / "net.py")
    assert index.summary(repo / "models" / "net.py") is first_summary
    (repo / "models" / "net.py").write_text(MODEL.replace("nn.Sigmoid()", "nn.Identity()"))
    changed = index.summary(repo / "models" / "net.py")
    assert changed is not first_summary and changed.classes["Net"].forward_activation is None


def test_a_repository_relative_path_resolves_under_the_index_root(repo):
    index = RepositoryIndex(repo)
    ctx = context("from models import Net\nmodel = Net(3)\n", path="train.py", repository=index)
    assert ctx.facts(ModuleFacts).find_class("Net").name == "Net"


def test_sequential_appended_in_a_branch_and_a_file_that_does_not_parse():
    summary = summarize(textwrap.dedent("""
        import torch.nn as nn
        class D(nn.Module):
            def __init__(self, sigmoid=True):
                super().__init__()
                layers = [nn.Linear(4, 1)]
                if sigmoid:
                    layers.append(nn.Sigmoid())
                self.main = nn.Sequential(*layers)
            def forward(self, x):
                return self.main(x).squeeze(1)
    """), "d.py")
    assert summary.classes["D"].forward_activation == "sigmoid"
    assert summarize("def broken(:\n", "x.py").classes == {}


def test_cross_file_findings_in_the_engine(repo):
    (repo / "gan.py").write_text(textwrap.dedent("""
        import torch.nn as nn
        from models import Net
        net = Net(10)
        criterion = nn.BCELoss()
        for x, y in loader:
            out, h = net(x, h)
            loss = criterion(out.squeeze(), y)
    """))
    rules = [r for r in all_rules() if r.id == "TR402"]
    text = (repo / "gan.py").read_text()
    alone = analyze_source(text, str(repo / "gan.py"), rules=rules)
    with_repo = analyze_source(text, str(repo / "gan.py"), rules=rules, repository=RepositoryIndex(repo))
    assert alone.findings == [] and [f.rule for f in with_repo.findings] == ["TR402"]
    assert Path(with_repo.findings[0].path).name == "gan.py"


def test_the_weights_only_fix_is_offered_only_when_no_checkpoint_of_the_repository_holds_what_it_refuses(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "main_train.py").write_text(textwrap.dedent("""
        import torch
        import utils
        save_dict = {"student": student.state_dict(), "epoch": epoch + 1, "args": args}
        utils.save_on_master(save_dict, os.path.join(args.output_dir, "checkpoint.pth"))
    """))
    (tmp_path / "visualize.py").write_text("import torch\nstate = torch.load(args.pretrained_weights)\n")
    (tmp_path / "knn.py").write_text(textwrap.dedent("""
        import torch
        if args.dump_features:
            torch.save(train_features.cpu(), os.path.join(args.dump_features, "trainfeat.pth"))
        if args.load_features:
            train_features = torch.load(os.path.join(args.load_features, "trainfeat.pth"))
    """))
    rules = [r for r in all_rules() if r.id == "TR601"]
    index = RepositoryIndex(tmp_path)

    def finding(name):
        [found] = analyze_source((tmp_path / name).read_text(), str(tmp_path / name), rules=rules,
                                 repository=index).findings
        return found

    refused = finding("visualize.py")
    assert refused.fix is None  # the DINO checkpoint holds the run's args: weights_only=True would refuse it
    assert "`main_train.py` in this repository saves an argparse.Namespace" in refused.message
    assert "add_safe_globals" in refused.message
    own = finding("knn.py")  # features this script dumps itself: tensors only, the fix is safe
    assert own.fix is not None and "weights_only=True" in own.fix.replacement
    # without the script that saves the args, nothing says the fix is unsafe
    (tmp_path / "main_train.py").unlink()
    assert finding("visualize.py").fix is not None


def test_module_nodes_list_the_whole_file_once_in_source_order():
    """``ModuleNodes``: the code nodes a walk of ``subtree(ctx.module)`` yields (every node but whitespace and
    punctuation), in its order, each one's parent, and the nodes of given kinds as ``isinstance`` picks them, for
    any question asked over the whole file."""
    from analyzers.program.flow import ModuleNodes

    ctx = context("""
        import torch
        def train(model, path="a.pt", *, save=lambda m: torch.save(m, "b.pt")):
            out = [torch.save(x, p) for x, p in pairs if x] if model else torch.save(model, path)
            state = {"k": 1}
            state["m"] = model
            return out
    """)
    facts = ctx.facts(ModuleNodes)
    code, stack = set(), [ctx.module]
    while stack:
        node = stack.pop()
        code.add(id(node))
        stack.extend(code_children(node))
    walked = [node for node in subtree(ctx.module) if id(node) in code]
    assert facts.nodes == walked
    assert any(isinstance(node, cst.IfExp) for node in walked)  # written body first, run test first
    assert not any(isinstance(node, (cst.Comma, cst.SimpleWhitespace, cst.LeftParen)) for node in facts.nodes)
    for node in facts.nodes:
        for child in code_children(node):
            assert facts.parents[id(child)] is node
    for kinds in [(cst.Call,), (cst.Assign, cst.Param), (cst.BaseExpression,), (cst.BaseSmallStatement, cst.Arg)]:
        assert facts.of_type(*kinds) == [node for node in subtree(ctx.module) if isinstance(node, kinds)]
    assert [ctx.module.code_for_node(call.func) for call in facts.of_type(cst.Call)] == \
        ["torch.save", "torch.save", "torch.save"]


def test_assigned_values_list_every_assignment_of_a_name_in_every_kind_of_block():
    """``assigned_values``: each ``name = value`` in the scope, whichever block holds it (branches, loops, ``with``,
    ``try`` / ``except`` / ``finally``, ``match``, one-line suites, a nested function), in source order; never
    an augmented, annotated or unpacking assignment, nor a walrus."""
    from analyzers.program.flow import assigned_values

    ctx = context("""
        def step(batch, flag):
            out = 1
            if flag: out = 2
            else:
                for x in batch:
                    with ctx():
                        out = x
            while flag:
                try:
                    out = a = 3
                except ValueError:
                    out = 4
                finally:
                    out += 5
            match flag:
                case 1:
                    out = 6
            def helper():
                out = 7
            out: int = 8
            out, other = 9, 10
            if (out := 11):
                pass
            total = out = [12 for out in batch]
            return out
    """)
    fn = first(ctx, cst.FunctionDef)
    assert [ctx.module.code_for_node(v) for v in assigned_values(ctx, fn, "out")] == \
        ["1", "2", "x", "3", "4", "6", "7", "[12 for out in batch]"]
    assert [ctx.module.code_for_node(v) for v in assigned_values(ctx, fn, "a")] == ["3"]
    assert assigned_values(ctx, first(ctx, cst.FunctionDef, lambda f: f.name.value == "helper"), "out")[0] is \
        assigned_values(ctx, fn, "out")[6]


def test_pin_file_listing_is_kept_until_the_folder_changes(tmp_path):
    """A folder's requirement files are listed once while the folder stays as it was (many files ask the same
    folders), listed again when a file is added to it or to its requirements/, and never kept while the folder
    changed too recently for its clock to show the next change."""
    import os
    import time

    from analyzers.program import versions

    (tmp_path / "requirements.txt").write_text("torch==1.8\n")
    assert [p.name for p in versions._pin_files(tmp_path)] == ["requirements.txt"]
    assert tmp_path not in versions._LISTINGS  # just written: not yet trusted
    past = time.time() - 60
    os.utime(tmp_path, (past, past))
    assert [p.name for p in versions._pin_files(tmp_path)] == ["requirements.txt"]
    assert tmp_path in versions._LISTINGS
    (tmp_path / "requirements").mkdir()  # changes the folder's time: listed again
    (tmp_path / "requirements" / "dev.txt").write_text("numpy\n")
    assert [p.name for p in versions._pin_files(tmp_path)] == ["requirements.txt", "dev.txt"]
    os.utime(tmp_path, (past, past))
    os.utime(tmp_path / "requirements", (past, past))
    assert len(versions._pin_files(tmp_path)) == 2
    (tmp_path / "requirements" / "gpu.txt").write_text("torch==2.1\n")  # only the subfolder changes
    assert [p.name for p in versions._pin_files(tmp_path)] == ["requirements.txt", "dev.txt", "gpu.txt"]


def test_an_explicit_forward_is_the_call_of_its_object():
    from analyzers.program.graphs import is_criterion_call
    from analyzers.program.values import called_object

    ctx = context("""
        import torch.nn as nn
        loss = nn.MSELoss()
        a = loss.forward(fx, y)
        b = net.forward(x)
        c = criterion(fx, y)
    """)
    calls = {ctx.module.code_for_node(n): n for n in subtree(ctx.module)
             if isinstance(n, cst.Call) and not ctx.module.code_for_node(n).startswith("nn.")}
    assert {text: is_criterion_call(call, ctx) for text, call in calls.items()} == {
        "loss.forward(fx, y)": True, "net.forward(x)": False, "criterion(fx, y)": True}
    assert ctx.module.code_for_node(called_object(calls["net.forward(x)"].func)) == "net"
    assert called_object(calls["criterion(fx, y)"].func) is calls["criterion(fx, y)"].func


def test_a_no_grad_context_entered_by_hand_turns_autograd_off():
    from analyzers.program.state import enters_grad_off

    ctx = context("""
        import torch
        torch.no_grad().__enter__()
        torch.enable_grad().__enter__()
        ctx = torch.inference_mode().__enter__()
        open(path).__enter__()
    """)
    calls = [n for n in subtree(ctx.module) if isinstance(n, cst.Call) and ctx.module.code_for_node(n).endswith("__enter__()")]
    assert [enters_grad_off(call, ctx) for call in calls] == [True, False, False, False]


def test_a_function_of_another_file_that_leaves_its_argument_in_eval_mode(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "evaluation.py").write_text(textwrap.dedent("""
        import torch
        def eval_net(net, loader):
            net.eval()
            with torch.no_grad():
                return sum(float(net(x).mean()) for x in loader)
        def eval_restoring(net, loader):
            was_training = net.training
            net.eval()
            score = sum(float(net(x).mean()) for x in loader)
            net.train(was_training)
            return score
        def eval_copy(net, loader):
            other = make_copy(net)
            other.eval()
    """))
    summary = summarize((tmp_path / "evaluation.py").read_text(), "evaluation.py")
    assert summary.eval_helpers == {"eval_net": (["net", "loader"], ["net"])}
    text = textwrap.dedent("""
        import torch
        from evaluation import eval_net, eval_restoring
        def train_net(net, train_loader, val_loader, optimizer):
            for epoch in range(10):
                for x, y in train_loader:
                    loss = torch.nn.functional.mse_loss(net(x), y)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                eval_restoring(net, val_loader)
                print(eval_net(net, val_loader))
    """)
    (tmp_path / "train.py").write_text(text)
    rules = [r for r in all_rules() if r.id == "TR108"]
    found = analyze_source(text, str(tmp_path / "train.py"), rules=rules, repository=RepositoryIndex(tmp_path))
    assert [(f.rule, f.line) for f in found.findings] == [("TR108", 12)]


# ---- graphs and tensor kinds -------------------------------------------------------------------------------

def test_values_read_off_the_autograd_graph_are_graph_free_and_tensors_are_not():
    from analyzers.program.graphs import graph_free

    ctx = context("""
        import torch
        steps = 50
        def step(x, y):
            loss = criterion(model(x), y)
            loss.backward()
            return model(x), loss.data[0] / steps

        def fit(x, y):
            loss = criterion(model(x), y)
            return loss

        out, number = step(a, b)
        logits, tensor = fit(a, b)
        old_style = loss.data[0]
        running = 0.5
        running += old_style * 2
        scalar = float(loss) + loss.item() / loss.size(0)
        host = loss.detach().cpu().numpy()
        attached = loss * 2
    """)
    names = {n.value: n for n in subtree(ctx.module) if isinstance(n, cst.Name)}
    free = {name: graph_free(names[name], ctx) for name in
            ("number", "old_style", "running", "scalar", "host", "attached", "out", "tensor", "logits")}
    assert free == {"number": True, "old_style": True, "running": True, "scalar": True, "host": True,
                    "attached": False, "out": False, "tensor": False, "logits": False}


def test_only_torch_calls_forward_passes_and_passing_builtins_are_known_to_return_tensors_of_their_arguments():
    from analyzers.program.values import returns_tensor_of_args

    ctx = context("""
        import numpy as np
        import torch
        import torch.nn.functional as F
        criterion = torch.nn.MSELoss()
        a = F.relu(x)
        b = criterion(x, y)
        c = sum(losses)
        d = replay_buffer.sample(batch_size)
        e = np.exp(x)
        f = load_batch(x)
    """)
    calls = {t.targets[0].target.value: t.value for t in subtree(ctx.module) if isinstance(t, cst.Assign)}
    known = {name: returns_tensor_of_args(call, ctx) for name, call in calls.items() if name != "criterion"}
    assert known == {"a": True, "b": True, "c": True, "d": False, "e": False, "f": False}


def _evaluation_findings(code: str) -> list[tuple[str, int]]:
    rules = [r for r in all_rules() if r.id in ("TR201", "TR202")]
    result = analyze_source(textwrap.dedent(code), "example.py", rules=rules)
    return sorted((f.rule, f.line) for f in result.findings)


def test_what_runs_on_an_evaluation_path_is_a_module_only_on_evidence():
    # a method of the class, a class picked from a registry we cannot see, a parameter that every caller
    # fills with a plain function: none of them is a module with a mode
    assert _evaluation_findings("""
        import torch
        from registry import factories
        class Runner:
            def reload_model(self, step):
                self.step = step
            def test(self, loader):
                with torch.no_grad():
                    for x in loader:
                        self.reload_model(x)
        def affine(X):
            return X @ W + b
        def evaluate_accuracy(loader, net):
            with torch.no_grad():
                return sum((net(x).argmax(1) == y).sum() for x, y in loader)
        def fit(net, loader):
            return evaluate_accuracy(loader, net)
        fit(affine, val_loader)
        import helpers
        def validate(loader):
            net = helpers.linreg
            with torch.no_grad():
                for x in loader:
                    net(x)
        def evaluate(opt, loader):
            Detector = factories[opt.kind]
            with torch.no_grad():
                detector = Detector(opt)
    """) == []
    # the same parameter given a module by one caller is a model again
    found = _evaluation_findings("""
        import torch
        import torch.nn as nn
        def affine(X):
            return X
        def evaluate_accuracy(loader, net):
            with torch.no_grad():
                return sum((net(x).argmax(1) == y).sum() for x, y in loader)
        evaluate_accuracy(val_loader, affine)
        evaluate_accuracy(val_loader, nn.Sequential(nn.Linear(2, 2), nn.Dropout()))
    """)
    assert ("TR201", 8) in found


def test_an_eval_chained_on_construction_holds_against_train_on_another_functions_binding():
    code = """
        import torch
        def train(loader):
            model = Net()
            model.train()
        def test(loader):
            model = make_net().eval()
            with torch.no_grad():
                for x in loader:
                    model(x)
    """
    assert _evaluation_findings(code) == []
    # train() in the same function does undo it
    assert ("TR201", 11) in _evaluation_findings(code.replace("model = make_net().eval()",
                                                             "model = make_net().eval()\n            model.train()"))


def test_a_tuple_item_a_loader_returns_in_eval_mode_keeps_its_mode_where_it_is_unpacked():
    code = """
        import torch
        from transformers import AutoModel, AutoTokenizer
        def load_pair(name):
            encoder = AutoModel.from_pretrained(name)
            decoder = Decoder()
            return AutoTokenizer.from_pretrained(name), encoder, decoder
        def evaluate(texts):
            tokenizer, encoder, decoder = load_pair("m")
            with torch.no_grad():
                for text in texts:
                    encoder(**tokenizer(text))
                    decoder(text)
    """
    # the pretrained encoder comes back in eval mode; the decoder, built by a class we cannot see, may not
    assert _evaluation_findings(code) == [("TR201", 13)]


def test_a_wrapper_whose_constructor_puts_the_wrapped_module_in_eval_mode_is_built_in_eval_mode(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "wrappers.py").write_text(textwrap.dedent("""
        import torch.nn as nn
        class FrozenFeatures(nn.Module):
            def __init__(self, backbone):
                super().__init__()
                self.backbone = backbone
                self.drop = nn.Dropout(0.1)
                self.backbone.eval()
        class TrainableFeatures(nn.Module):
            def __init__(self, backbone):
                super().__init__()
                self.backbone = backbone
                self.drop = nn.Dropout(0.1)
                self.backbone.eval()
                self.backbone.train()
    """))
    script = tmp_path / "probe.py"
    code = textwrap.dedent("""
        import torch
        from wrappers import FrozenFeatures, TrainableFeatures
        def evaluate(backbone, loader):
            frozen_model = FrozenFeatures(backbone)
            trainable_model = TrainableFeatures(backbone)
            with torch.no_grad():
                for x in loader:
                    frozen_model(x)
                    trainable_model(x)
    """)
    script.write_text(code)
    rules = [r for r in all_rules() if r.id == "TR201"]
    result = analyze_source(code, str(script), rules=rules, repository=index_for(script))
    assert [(f.rule, f.line) for f in result.findings] == [("TR201", 10)]


# ---- activations: which layer a module ends with -----------------------------------------------------------

def test_a_sequential_ends_with_the_last_layer_added_after_it_is_built():
    from analyzers.program.activations import module_kind, sequential_last_layer

    ctx = context("""
        import torch.nn as nn
        grown = nn.Sequential(nn.Linear(3, 3))
        grown.add_module("out", nn.Linear(3, 2))
        grown.append(nn.LogSoftmax(dim=1))
        branched = nn.Sequential()
        for width in widths:
            branched.append(nn.Softmax(dim=1))
        rebuilt = nn.Sequential(nn.Sigmoid())
        rebuilt = nn.Sequential(nn.Tanh())
        rebuilt.append(nn.Linear(2, 2))
    """)
    sequentials = [node for node in subtree(ctx.module) if isinstance(node, cst.Call)
                   and getattr(node.func, "attr", None) is not None and node.func.attr.value == "Sequential"]
    grown, branched, first_rebuilt, _ = sequentials
    assert module_kind(grown, ctx) == ("log_softmax", None)
    assert sequential_last_layer(branched, ctx) is None  # added in a loop: which layer ends it is unknown here
    assert module_kind(first_rebuilt, ctx) == ("sigmoid", None)  # the name is bound again before anything is added


def test_a_builder_functions_module_and_a_parameter_every_caller_fills_alike():
    from analyzers.program.activations import module_passed_to

    ctx = context("""
        import torch.nn as nn
        def build(k):
            body = nn.Sequential(nn.Linear(k, k))
            body.add_module("probs", nn.Softmax(dim=-1))
            return body
        def score(body, x):
            return body(x)
        def main():
            body = build(4)
            score(body, x)
        score(build(8), y)
    """)
    score = next(node for node in ctx.module.body if isinstance(node, cst.FunctionDef) and node.name.value == "score")
    assert module_passed_to(score, "body", ctx) == ("softmax", None)


def _notebook(*cells: str) -> str:
    import json

    return json.dumps({"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "source": cell.splitlines(True)}
                                 for cell in cells] + [{"cell_type": "markdown", "metadata": {},
                                                        "source": ["torch.save(x, 'prose.pt')"]}],
                      "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def test_a_notebook_beside_a_script_counts_among_the_savers_of_its_folder(tmp_path):
    """A folder where a notebook trains and saves ``net.pt`` and a script loads it: the notebook's code cells say
    which files the folder's programs write (a markdown cell says nothing; a cell that does not parse is skipped,
    the others still read), and an edit of the notebook is a dependency of the answer."""
    from analyzers.program.modules import recording

    (tmp_path / ".git").mkdir()
    (tmp_path / "train.ipynb").write_text(_notebook("import torch\nnet = make()", "def broken(:\n  torch.save(a, 'x.pt')",
                                                    "torch.save(net.state_dict(), 'out/net.pt')"))
    (tmp_path / "show.py").write_text("import torch\nstate = torch.load('out/net.pt')\n")
    index = RepositoryIndex(tmp_path)
    with recording() as deps:
        assert index.saved_beside(tmp_path / "show.py") == {"net.pt"}
    assert any(Path(path).name == "train.ipynb" and digest for path, digest in deps.files.items())
    assert deps.unchanged(tmp_path)
    (tmp_path / "other.ipynb").write_text(_notebook("print(1)"))
    assert not deps.unchanged(tmp_path)  # a notebook added beside it: asked again
    assert index.saved_beside(tmp_path / "train.ipynb") == set()  # its own saves are its own program's


def test_a_script_loading_what_its_notebook_saved_is_judged_as_reloading_its_own_checkpoint(tmp_path):
    """The TR601 finding on a script that loads a fixed file is the same whether the file is written by a script
    or by a notebook of its folder."""
    load = "import torch\nckpt = torch.load('weights/model.pt')\nprint(ckpt['epoch'])\n"
    save = "import torch\ntorch.save({'epoch': 3}, 'weights/model.pt')\n"

    def tr601(folder: Path) -> list:
        rules = [rule for rule in all_rules() if rule.id == "TR601"]
        found = analyze_source(load, str(folder / "show.py"), rules=rules, repository=RepositoryIndex(folder)).findings
        return [(f.severity, f.message) for f in found]

    by_script, by_notebook, by_nothing = (tmp_path / "a", tmp_path / "b", tmp_path / "c")
    for folder in (by_script, by_notebook, by_nothing):
        folder.mkdir()
        (folder / ".git").mkdir()
        (folder / "show.py").write_text(load)
    (by_script / "train.py").write_text(save)
    (by_notebook / "train.ipynb").write_text(_notebook(save))
    assert tr601(by_notebook) == tr601(by_script) != tr601(by_nothing)


@pytest.mark.parametrize("forward, kept", [
    # the state the previous call stored is read, then replaced by a submodule's output
    ("    def forward(self, x):\n        if self.h is None:\n            self.h = self.init(x)\n"
     "        _, self.h = self.rnn(x, self.h)\n        return self.h\n", True),
    # detached before it is stored: nothing of the graph is kept
    ("    def forward(self, x):\n        self.h = self.rnn(x, self.h).detach()\n        return self.h\n", False),
    # set first, read after, in the same call: a value of this call only
    ("    def forward(self, x):\n        self.last = self.rnn(x)\n        return self.last * 2\n", False),
    # kept under no_grad
    ("    @torch.no_grad()\n    def forward(self, x):\n        self.h = self.rnn(x, self.h)\n        return self.h\n",
     False),
    # computed by a method of the class, not a submodule: no layer's parameters in it
    ("    def forward(self, x):\n        self.h = self.init(self.h)\n        return x + self.h\n"
     "    def init(self, h):\n        return h\n", False),
])
def test_a_module_keeping_a_tensor_with_its_graph_from_one_call_to_the_next(forward, kept):
    code = "import torch\nimport torch.nn as nn\nclass Cell(nn.Module):\n" + forward
    assert ("carries-state" in summarize(code, "x.py").classes["Cell"].features) is kept


@pytest.mark.parametrize("code, forwards", [
    # the function's own **kwargs, handed on: its callers choose the keywords
    ("def load(f, **kwargs):\n    return torch.load(f, **kwargs)\n", True),
    # a dict the function builds: the keywords are in view, not its callers'
    ("def load(f, **kwargs):\n    opts = dict(kwargs)\n    return torch.load(f, **opts)\n", False),
    ("def load(f, **kwargs):\n    kwargs = {'map_location': 'cpu'}\n    return torch.load(f, **kwargs)\n", False),
    ("def load(f, opts):\n    return torch.load(f, **opts)\n", False),
    ("def load(f, **kwargs):\n    return torch.load(f)\n", False),
])
def test_a_call_forwards_its_callers_keywords_only_through_its_own_double_star_parameter(code, forwards):
    from analyzers.program.values import forwards_callers_keywords

    ctx = context("import torch\n" + code)
    call = first(ctx, cst.Call, lambda node: ctx.call_name(node) == "torch.load")
    assert forwards_callers_keywords(ctx, call) is forwards


SAVER = ("import torch\nclass KeepBest:\n    def __init__(self, patience):\n        self.best = None\n"
         "    def __call__(self, score, net, folder):\n        if self.best is None or score < self.best:\n"
         "            self.best = score\n            self.store(net, folder)\n"
         "    def store(self, net, folder):\n        torch.save(net.state_dict(), folder + '/top.pth')\n")


@pytest.mark.parametrize("fit, self_written", [
    # the helper, handed the run's folder in the loop, saves top.pth there: reloaded after training
    ("keeper = KeepBest(3)\n    for epoch in range(9):\n        keeper(step(net), net, folder)\n"
     "    best = folder + '/' + 'top.pth'\n    net.load_state_dict(torch.load(best))\n", True),
    ("for epoch in range(9):\n        dump(step(net), net, folder)\n"
     "    net.load_state_dict(torch.load(os.path.join(folder, 'top.pth')))\n", True),
    # another file name than the one the helper writes
    ("keeper = KeepBest(3)\n    for epoch in range(9):\n        keeper(step(net), net, folder)\n"
     "    net.load_state_dict(torch.load(folder + '/other.pth'))\n", False),
    # the folder is never handed to the helper: whoever runs it chose where to read
    ("keeper = KeepBest(3)\n    for epoch in range(9):\n        keeper(step(net), net, out)\n"
     "    net.load_state_dict(torch.load(folder + '/top.pth'))\n", False),
    # a resume before the helper is ever called: the file comes from an earlier run
    ("net.load_state_dict(torch.load(folder + '/top.pth'))\n    keeper = KeepBest(3)\n"
     "    keeper(step(net), net, folder)\n", False),
])
def test_a_file_a_repository_helper_saves_into_a_folder_it_is_handed_is_the_programs_own(tmp_path, fit,
                                                                                         self_written):
    (tmp_path / ".git").mkdir()
    (tmp_path / "helpers.py").write_text(SAVER + "def dump(score, net, where):\n"
                                         "    torch.save(net.state_dict(), os.path.join(where, 'top.pth'))\n")
    code = "import os\nimport torch\nfrom helpers import KeepBest, dump\ndef train(net, folder):\n    " + fit
    (tmp_path / "run.py").write_text(code)
    ctx = context(code, path=str(tmp_path / "run.py"), repository=RepositoryIndex(tmp_path))
    call = first(ctx, cst.Call, lambda node: ctx.call_name(node) == "torch.load")
    path = call.args[0].value
    assert ctx.facts(CheckpointWrites).written_before_loaded(path, ctx.origin(path)) is self_written


# ---- passes a count picks (gradient accumulation) ---------------------------------------------------------

def _step_and_loop(code: str):
    ctx = context(code)
    step = first(ctx, cst.Call, lambda call: isinstance(call.func, cst.Attribute) and call.func.attr.value == "step")
    loop = first(ctx, (cst.For, cst.While))
    return ctx, step, loop


@pytest.mark.parametrize("code, counted", [
    # a remainder of the pass index
    ("for k, item in enumerate(items):\n    work(item)\n    if (k + 1) % every == 0:\n        opt.step()\n", True),
    # a count-down the loop advances, whose branch skips the rest of the pass
    ("left = n\nwhile feed():\n    work()\n    if left > 1:\n        left -= 1\n        continue\n    opt.step()\n"
     "    left = n\n", True),
    # a counter the loop advances, compared
    ("seen = 0\nfor item in items:\n    work(item)\n    seen += 1\n    if seen == every:\n        opt.step()\n"
     "        seen = 0\n", True),
    # the pass index compared picks the passes from some point on, not every few
    ("for k in range(total):\n    work(k)\n    if k >= warmup:\n        opt.step()\n", False),
    # what a pass computed picks the pass, not a count
    ("for item in items:\n    value = work(item)\n    if value < limit:\n        opt.step()\n", False),
    # an identity test on an item of the pass counts nothing
    ("for k, item in enumerate(items):\n    if item is None:\n        continue\n    opt.step()\n", False),
    # a skip whose branch does not end the pass
    ("for k, item in enumerate(items):\n    if k % 2:\n        log(k)\n    opt.step()\n", False),
    # every pass
    ("for item in items:\n    work(item)\n    opt.step()\n", False),
])
def test_a_call_that_runs_only_on_the_passes_a_count_picks(code, counted):
    from analyzers.program.loops import counted_guard

    ctx, step, loop = _step_and_loop(code)
    assert (counted_guard(step, loop, ctx) is not None) is counted


def test_a_counted_guard_stops_at_a_nested_loop():
    from analyzers.program.loops import counted_guard, counts_passes

    ctx = context("for k, item in enumerate(items):\n    if k % 4 == 0:\n        for o in opts:\n            o.step()\n")
    step = first(ctx, cst.Call, lambda call: isinstance(call.func, cst.Attribute) and call.func.attr.value == "step")
    outer = first(ctx, cst.For)
    assert counted_guard(step, outer, ctx) is None  # the nested loop decides how often it runs
    assert counts_passes(cst.parse_expression("k % 4 == 0"), outer)


@pytest.mark.parametrize("code, count", [
    # a counter the loop advances reaches the count
    ("seen = 0\nfor item in items:\n    seen += 1\n    if seen == cfg.accum:\n        opt.step()\n", "cfg.accum"),
    ("seen = 0\nfor item in items:\n    seen += 1\n    if every <= seen:\n        opt.step()\n", "every"),
    # the passes before the count are not the pass that reaches it
    ("seen = 0\nfor item in items:\n    seen += 1\n    if seen < every:\n        opt.step()\n", None),
    # two counters compared: no count to read
    ("a = b = 0\nfor item in items:\n    a += 1\n    b += 2\n    if a == b:\n        opt.step()\n", None),
    # the pass index is not a counter the loop advances
    ("for k in range(total):\n    if k >= warmup:\n        opt.step()\n", None),
])
def test_the_count_a_counter_of_passes_reaches(code, count):
    from analyzers.program.loops import counted_divisor

    ctx, step, loop = _step_and_loop(code)
    test = first(ctx, cst.If).test
    found = counted_divisor(test, loop)
    assert (dotted_name(found) if found is not None else None) == count


# ---- values that keep or drop the autograd graph -----------------------------------------------------------

@pytest.mark.parametrize("expr, kind", [
    # tensor -> tensor methods keep the graph of their receiver: a copy to the CPU, a reduction, a cast
    ("criterion(out, y).cpu().mean()", "loss"),
    ("criterion(out, y).to('cpu')", "loss"),
    ("criterion(out, y).float().sum()", "loss"),
    ("model(x).mean()", "model"),
    # what is read off the graph drops it, whatever comes after
    ("criterion(out, y).item()", None),
    ("criterion(out, y).detach().cpu().mean()", None),
    ("criterion(out, y).detach().numpy()", None),
    ("criterion(out, y).tolist()", None),
    ("float(criterion(out, y))", None),
])
def test_which_values_keep_the_autograd_graph(expr, kind):
    from analyzers.program.graphs import graph_free, graph_kind

    ctx = context(f"import torch\nvalue = {expr}\n")
    value = first(ctx, cst.Assign).value
    assert graph_kind(value, ctx) == kind
    assert graph_free(value, ctx) is (kind is None)
