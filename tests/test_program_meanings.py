"""One copy of each meaning: names, kinds of values, test code, and the library table the rules consult."""
from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from analyzers.context import FileContext
from analyzers.engine import _Walker
from analyzers.model import Category
from analyzers.program import library
from analyzers.program.flow import attribute_values, subtree
from analyzers.program.library import Does
from analyzers.program.loops import training_step_loop
from analyzers.program.names import (name_is_model_like, name_is_optimizer_like, name_says_not_a_model, name_words,
                                     parenthesized)
from analyzers.program.roles import is_test_code
from analyzers.program.state import in_no_grad_block
from analyzers.program.values import (changes_in_eval, constructor, is_backward, is_optimizer, is_optimizer_step,
                                      is_scheduler, wrapped_module)

RULES = Path(__file__).resolve().parents[1] / "analyzers" / "rules"
# every module of the catalog's category folders: the rules (one each) and the helpers a folder's rules share
RULE_FILES = sorted(p for p in RULES.glob("*/*.py") if p.name != "__init__.py")


def context(code: str, path: str = "example.py") -> FileContext:
    source = textwrap.dedent(code)
    module = cst.parse_module(source)
    ctx = FileContext(path, source, module)
    _Walker(ctx, [], lambda rule, exc: None).walk(module)
    return ctx


def calls(ctx: FileContext) -> list[cst.Call]:
    return [n for n in subtree(ctx.module) if isinstance(n, cst.Call)]


# ---- names --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["model", "self.net", "netG", "teacher_model", "resnet", "vae", "self.backbone",
                                  "student", "ddp_model", "discriminator"])
def test_names_that_hold_a_model(name):
    assert name_is_model_like(name)


@pytest.mark.parametrize("name", ["model_path", "build_model", "model_state", "loss_fn", "model_name", "get_net",
                                  "model_cfg", "net_loss", "args", "optimizer"])
def test_names_about_a_model_are_not_one(name):
    assert not name_is_model_like(name)


@pytest.mark.parametrize("name,expected", [("opt", True), ("optimizer_d", True), ("optG", True), ("g_opt", True),
                                           ("self.optim", True), ("myoptimizer", True), ("options", False),
                                           ("opts", False), ("optuna", False), ("adopt", False)])
def test_optimizer_names(name, expected):
    assert name_is_optimizer_like(name) is expected


def test_words_of_camel_and_snake_names_agree():
    assert name_words("valLoader") == name_words("val_loader") == ["val", "loader"]


def test_parenthesized_only_when_an_operator_could_bind_tighter():
    assert cst.Module([]).code_for_node(parenthesized(cst.parse_expression("a * b"))) == "(a * b)"
    assert cst.Module([]).code_for_node(parenthesized(cst.parse_expression("f(a)"))) == "f(a)"


# ---- kinds of values ----------------------------------------------------------------------------------------

def test_optimizer_is_known_by_what_built_it_before_its_name():
    ctx = context("""
        import torch
        trainer_state = torch.optim.Adam(params)
        options = parse()
        sched = torch.optim.lr_scheduler.StepLR(trainer_state, 1)
        trainer_state.step()
        options.step()
        sched.step()
    """)
    steps = [c for c in calls(ctx) if isinstance(c.func, cst.Attribute) and c.func.attr.value == "step"]
    assert [is_optimizer_step(c, ctx) for c in steps] == [True, False, False]
    assert is_scheduler(steps[2].func.value, ctx) and not is_optimizer(steps[2].func.value, ctx)


def test_backward_is_a_method_call_of_any_receiver():
    ctx = context("""
        loss.backward()
        scaler.scale(loss).backward()
        self.manual_backward(loss)
        backward(loss)
    """)
    outermost = [ctx.module.code_for_node(c) for c in calls(ctx) if is_backward(c)]
    assert outermost == ["loss.backward()", "scaler.scale(loss).backward()", "self.manual_backward(loss)"]


def test_wrappers_and_moves_return_the_module_they_are_given():
    ctx = context("""
        import torch, copy
        from torch.nn.parallel import DistributedDataParallel as DDP
        net = Net()
        a = net.to("cuda").eval()
        b = DDP(net, device_ids=[0])
        c = torch.compile(model=net)
        d = copy.deepcopy(net)
        e = torch.nn.utils.weight_norm(net)
        f = net.forward(x)
    """)
    built = {n.targets[0].target.value: n.value for n in subtree(ctx.module) if isinstance(n, cst.Assign)}
    for name in "abcde":
        origin = constructor(ctx, built[name], built[name])
        assert origin is not None and ctx.module.code_for_node(origin) == "Net()", name
    assert wrapped_module(built["f"], ctx) is None  # runs the module: its outputs are no module



def test_a_module_holds_batchnorm_by_its_library_builder_its_layer_or_its_class():
    from analyzers.program.values import batchnorm_evidence
    ctx = context("""
        import timm, torch
        from torch import nn
        from torchvision import models
        from torch.nn.parallel import DistributedDataParallel as DDP
        class Stem(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
                self.head = nn.Linear(8, 2)
        class Plain(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 2)
        wide = models.wide_resnet50_2(weights=None).to("cuda")
        wrapped = DDP(timm.create_model("efficientnet_b0", pretrained=True))
        vit = timm.create_model("vit_base_patch16_224")
        boxes = models.detection.fasterrcnn_resnet50_fpn()
        norm = nn.BatchNorm1d(16)
        stem = Stem()
        plain = Plain()
        a = wide.layer3
        b = wide.fc
        c = stem.body
        d = stem.head
    """)
    assigned = {n.targets[0].target.value: n for n in subtree(ctx.module)
                if isinstance(n, cst.Assign) and isinstance(n.targets[0].target, cst.Name)}
    # a name, through what it was assigned; an attribute (``wide.layer3.parameters()``), as written
    evidence = {name: batchnorm_evidence(n.value if isinstance(n.value, cst.Attribute) else n.targets[0].target, ctx)
                for name, n in assigned.items()}
    assert evidence["wide"] == "a wide_resnet50_2, which holds BatchNorm"  # through .to(): the builder
    assert evidence["wrapped"] == "an efficientnet_b0, which holds BatchNorm"  # through the wrapper
    assert evidence["norm"] == "its BatchNorm layers"
    assert evidence["stem"] == "`Stem`, which builds BatchNorm"
    assert evidence["a"] == "`layer3` of a wide_resnet50_2, which holds BatchNorm"
    assert evidence["c"] == "`body` of `Stem`, which builds BatchNorm"
    # a transformer, a detection model (FrozenBatchNorm2d), a classifier head, a class without BatchNorm
    assert {name for name, said in evidence.items() if said is None} >= {"vit", "boxes", "b", "d", "plain"}


def test_library_builders_name_the_architectures_that_hold_batchnorm():
    assert library.library_architecture_with_batchnorm("torchvision.models.densenet121") == "densenet121"
    assert library.library_architecture_with_batchnorm("timm.create_model", "resnet18") == "resnet18"
    assert library.library_architecture_with_batchnorm("torchvision.models.vgg16") is None  # VGG without _bn
    assert library.library_architecture_with_batchnorm("timm.create_model", None) is None  # the name is not known
    assert library.library_architecture_with_batchnorm("models.resnet50") is None  # the repository's own builder


def test_a_copy_taken_off_the_graph_either_comes_back_into_the_result_or_leaves_on_purpose():
    from analyzers.program.graphs import detached_side_output, flows_back_into_result, taken_off_graph
    ctx = context("""
        import numpy as np, torch
        def forward(self, x):
            h = self.body(x)
            smooth = torch.from_numpy(np.tanh(h.detach().numpy()))
            weights = h.detach().cpu().numpy()
            stats = {"mean": h.data.numpy()}
            return h * smooth, stats
    """)
    found = {ctx.module.code_for_node(c): c for c in calls(ctx) if ctx.module.code_for_node(c).endswith(".numpy()")}
    back = found["h.detach().numpy()"]
    assert taken_off_graph(back) and flows_back_into_result(back, ctx)  # wrapped into a tensor again
    kept = found["h.detach().cpu().numpy()"]
    assert taken_off_graph(kept) and not flows_back_into_result(kept, ctx)  # assigned, never read back
    side = found["h.data.numpy()"]
    assert detached_side_output(side, ctx)  # a second output next to the result, inside a dict
    assert not taken_off_graph(next(c for c in calls(ctx) if ctx.module.code_for_node(c) == "self.body(x)"))


def test_what_a_value_is_computed_from_and_what_a_return_hands_back():
    from analyzers.program.flow import names_computed_from, returned_names
    ctx = context("""
        import torch
        aux = torch.stack(parts).mean()
        main = criterion(batch)
        loss = main + 0.1 * aux
        total = loss.detach()
        handed_back = (loss if batch else total), {"aux": aux}
    """)  # module level: the walk has ended there, with every assignment visible
    assigned = {n.targets[0].target.value: n.value for n in subtree(ctx.module) if isinstance(n, cst.Assign)}
    # through the names' assignments, a few levels back
    assert {"main", "aux", "parts", "batch", "criterion"} <= names_computed_from(assigned["loss"], ctx)
    # the names whose values a ``return`` of this expression hands back as they are (both branches, the dict's value)
    assert {"loss", "total", "aux", "main"} <= returned_names(assigned["handed_back"], ctx)


def test_the_call_that_writes_a_value_out_and_the_ones_that_compute_with_it():
    from analyzers.program.flow import logging_call_consuming
    ctx = context("""
        import math
        import numpy as np
        print(f"loss {loss.item():.3f}")
        bar.set_postfix(loss=loss.item())
        log(loss.item())
        total = math.log(loss.item())
        spread = np.log(loss.item())
        best = max(best, loss.item()) if loss.item() < best else best
    """)
    said = [logging_call_consuming(c, ctx) for c in calls(ctx) if ctx.module.code_for_node(c) == "loss.item()"]
    assert [found[0] if found else None for found in said] == ["print", "bar.set_postfix", "log", None, None, None, None]


def test_why_what_backward_is_called_on_is_no_scalar():
    from analyzers.program.graphs import non_scalar_origin
    ctx = context("""
        import torch
        import torch.nn.functional as F
        from torch import nn
        per_item = nn.MSELoss(reduction="none")
        mean = nn.MSELoss()
        net = Net()
        a = F.cross_entropy(y, t, reduction="none")
        b = per_item(y, t) * weights
        c = mean(y, t)
        d = net(x)
        e = F.l1_loss(y, t)
    """)
    assigned = {n.targets[0].target.value: n.value for n in subtree(ctx.module) if isinstance(n, cst.Assign)}
    assert {name: non_scalar_origin(assigned[name], ctx) for name in "abcde"} == {
        "a": "none", "b": "none", "c": None, "d": "model", "e": None}

# ---- roles: test code ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["conftest.py", "pkg/test_model.py", "pkg/model_test.py", "tests/helpers.py",
                                  "test/nn/util.py", "torch/testing/_internal/common.py"])
def test_test_code_by_name_or_folder(path):
    assert is_test_code(context("import torch\n", path))


def test_test_code_by_what_the_file_holds():
    assert is_test_code(context("import pytest\nimport torch\n", "check_shapes.py"))
    assert is_test_code(context("import unittest\nclass Shapes(unittest.TestCase):\n    pass\n", "shapes.py"))
    # a quick self-check next to real code does not make a script a test: pytest would not collect it
    assert not is_test_code(context("import torch\ndef test_shape():\n    pass\ndef train():\n    pass\n",
                                    "train.py"))
    assert not is_test_code(context("import torch\n", "src/latest.py"))


# ---- the library table --------------------------------------------------------------------------------------

def test_every_entry_cites_documentation():
    for name, doc in {**library.OPTIMIZER_CLASSES, **library.ITERATION_WRAPPERS}.items():
        assert doc.startswith("https://"), name
    for name, api in {**library.APIS, **library.METHODS, **library.MODULE_METHODS,
                      **library.TRAINING_LIBRARIES}.items():
        assert "https://" in api.doc, name
        assert api.does, name
        if api.does & {Does.WRAPS_MODULE, Does.RETURNS_SAME_MODULE} and name in library.APIS:
            assert api.module_argument is not None, f"{name}: which argument is the module?"


def test_table_answers_the_rules_questions():
    assert library.method_returns_same_module("requires_grad_")
    assert not library.method_returns_same_module("forward")
    assert library.wrapped_module_argument("torch.compile") == (0, "model")
    assert library.is_ddp("torch.nn.parallel.DistributedDataParallel")
    assert not library.is_ddp("torch.nn.DataParallel") and library.is_data_parallel("torch.nn.DataParallel")
    assert library.does("torch.utils.data.distributed.DistributedSampler", Does.SHARDS_DATA)
    assert library.method_does("from_pretrained", Does.RETURNS_EVAL_MODEL)
    assert library.method_does("named_parameters", Does.RETURNS_ITERATOR)  # a generator: next(it), never it.next()
    assert not library.method_does("state_dict", Does.RETURNS_ITERATOR)
    assert library.does("torch.save", Does.WRITES_TORCH_CHECKPOINT)
    assert library.does("pytorch_lightning.callbacks.ModelCheckpoint", Does.REPORTS_WRITTEN_CHECKPOINTS)
    assert library.does("lightning.pytorch.Trainer", Does.REPORTS_WRITTEN_CHECKPOINTS)
    assert not library.does("torch.utils.data.DataLoader", Does.REPORTS_WRITTEN_CHECKPOINTS)
    assert library.is_library("collections.OrderedDict") and library.is_library("timm.create_model")
    assert library.does("torch.set_default_device", Does.SETS_DEFAULT_DEVICE)
    assert not library.does("torch.cuda.set_device", Does.SETS_DEFAULT_DEVICE)  # selects a GPU; factories stay on CPU
    assert not library.is_library("models.resnet.ResNet")


def _name_collections(tree: ast.Module):
    """Literal sets, tuples and lists of strings anywhere in a rule file (its word lists), with their line."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Set, ast.Tuple, ast.List)) and len(node.elts) >= 2 and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            yield node.lineno, {e.value for e in node.elts}


# The questions the table owns: rule files ask it instead of keeping their own lists.
_OWNED = frozenset(name for name, api in library.APIS.items()
                   if api.does & {Does.WRAPS_MODULE, Does.RETURNS_SAME_MODULE, Does.RETURNS_EVAL_MODEL,
                                  Does.REPLICATES_PER_DEVICE, Does.REPLICATES_PER_PROCESS, Does.SHARDS_DATA,
                                  Does.WRITES_TORCH_CHECKPOINT, Does.READS_TORCH_CHECKPOINT})


@pytest.mark.parametrize("path", [p for p in RULE_FILES if p.parent.name != Category.DEPRECATION.package],
                         ids=lambda p: p.name)  # the deprecations' TorchFix parity tables: another owner
def test_rule_files_keep_no_list_of_what_the_table_knows(path):
    for line, names in _name_collections(ast.parse(path.read_text())):
        where = f"{path.name}:{line}"
        assert not names & _OWNED, f"{where} lists library APIs the table describes: {sorted(names & _OWNED)}"
        assert len(names & set(library.TRAINING_LIBRARIES)) < 2, f"{where} lists training libraries: ask the table"
        assert not (len(names & set(library.MODULE_METHODS)) >= 4 and {"eval", "train"} <= names), \
            f"{where} keeps its own list of the methods that return the module"



# Third-party libraries whose behaviour the table describes: a rule file asks the table, never names their APIs.
_TABLED_LIBRARIES = ("torchvision", "timm", "transformers", "diffusers", "accelerate", "peft", "lightning",
                     "pytorch_lightning", "sklearn", "xgboost", "lightgbm", "catboost")
# names not moved yet ("file:name"); the test fails on a new one, and on one moved but still listed
LIBRARY_NAMES_LEFT = frozenset({
    "data_pipeline/random_augmentation_on_eval_data.py:torchvision.datasets.ImageFolder",
    "data_pipeline/random_augmentation_on_eval_data.py:torchvision.datasets.DatasetFolder",
    "data_pipeline/random_augmentation_on_eval_data.py:torchvision.datasets.folder.ImageFolder",
    "device_performance/batch_not_moved_to_device.py:torchvision.",
    "training_loop/optimizer_built_before_layer_replaced.py:torchvision.",
    "training_loop/optimizer_built_before_layer_replaced.py:timm.",
})


def _library_api_names(source: str):
    """String constants of a rule's code (docs and examples aside) that name a tabled library's API."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and not any(c.isspace() for c in node.value) \
                and node.value.split(".", 1)[0] in _TABLED_LIBRARIES and "." in node.value:
            yield node.value


def test_rule_files_name_no_api_of_a_library_the_table_describes():
    found = {f"{p.parent.name}/{p.name}:{name}" for p in RULE_FILES if p.parent.name != Category.DEPRECATION.package
             for name in _library_api_names(p.read_text())}
    assert not found - LIBRARY_NAMES_LEFT, f"ask analyzers/program/library.py instead: {sorted(found - LIBRARY_NAMES_LEFT)}"
    assert not LIBRARY_NAMES_LEFT - found, f"moved to the table: drop {sorted(LIBRARY_NAMES_LEFT - found)}"


def test_the_table_knows_what_fitting_a_scikit_learn_object_learns():
    assert library.fitted_transformer("sklearn.preprocessing.StandardScaler") == "StandardScaler"
    assert library.fitted_transformer("sklearn.preprocessing.Normalizer") is None  # stateless: learns nothing
    assert library.learns_from_rows("sklearn.preprocessing.Normalizer")  # still a transformer, not a model
    assert library.is_estimator_class("xgboost.XGBClassifier") and not library.is_estimator_class("sklearn.utils.shuffle")
    assert library.is_meta_estimator("sklearn.model_selection.GridSearchCV")
    assert library.is_metric("sklearn.metrics.accuracy_score") and not library.is_metric("sklearn.svm.SVC")
    assert "sklearn.model_selection.train_test_split" in library.TRAIN_TEST_SPLITTERS
    assert library.builds_library_model("timm.create_model") and library.builds_library_model("torchvision.models.vgg11")
    assert not library.builds_library_model("models.build_model")

# ---- rules do not import rules ------------------------------------------------------------------------------

def _imports_of(tree: ast.Module):
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module, [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            yield node.lineno, "." * node.level + (node.module or ""), [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []


_ALLOWED = {"analyzers.rules.base", "analyzers.rules"}  # the rule base class and the registry


def _shared_by_its_folder(path: Path, module: str) -> bool:
    """A ``_`` module of the importing module's own category folder: what the folder's rules share."""
    folder, _, name = module.removeprefix("analyzers.rules.").partition(".")
    return folder == path.parent.name and name.startswith("_") and "." not in name


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_rule_modules_import_no_other_rule_module(path):
    problems = []
    for line, module, names in _imports_of(ast.parse(path.read_text())):
        if module.startswith("."):
            problems.append(f"line {line}: relative import {module}")
        elif module == "analyzers.rules" and any(n not in ("REGISTRY", "all_rules") for n in names):
            problems.append(f"line {line}: {names} from the rules package")
        elif module.startswith("analyzers.rules.") and module not in _ALLOWED and \
                not (_shared_by_its_folder(path, module) and not path.name.startswith("_")):
            problems.append(f"line {line}: {module} {names}")
        if module.startswith("analyzers.rules") and any(n.startswith("_") for n in names):
            problems.append(f"line {line}: private {[n for n in names if n.startswith('_')]} from {module}")
    assert not problems, f"{path.name} imports another rule module; move the shared meaning to analyzers/program: " \
                         f"{problems}"


# ---- one way to cache facts ---------------------------------------------------------------------------------

@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_rules_keep_facts_only_through_ctx_facts(path):
    """Facts a file's rules share live in ``ctx.facts(Kind)``, never in attributes a rule sets on the context."""
    stashed = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "getattr") \
                and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "ctx":
            stashed.append(node.lineno)
        targets = node.targets if isinstance(node, ast.Assign) else []
        stashed += [t.lineno for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                    and t.value.id == "ctx"]
    assert not stashed, f"{path.name} keeps facts on the context at lines {stashed}: use ctx.facts(Kind)"


def test_every_kind_of_behaviour_in_the_table_is_asked_by_the_analyzers():
    """An entry nobody consults is a claim nobody checks: each kind is asked outside the table, directly
    (``Does.X``) or through a query of the table that the analyzers call."""
    source = Path(library.__file__)
    others = "\n".join(p.read_text() for p in source.parents[1].rglob("*.py") if p != source)
    asked = {kind.name for kind in Does if f"Does.{kind.name}" in others}
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.FunctionDef) and f"{node.name}(" in others:
            asked |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
                      and isinstance(n.value, ast.Name) and n.value.id == "Does"}
    assert asked >= {kind.name for kind in Does}, sorted({kind.name for kind in Does} - asked)


def test_eval_changes_a_model_only_through_dropout_or_batchnorm():
    ctx = context("""
        import torch.nn as nn
        class Plain(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(2, 2)
        class Dropping(nn.Module):
            def __init__(self):
                super().__init__()
                self.drop = nn.Dropout(0.1)
        def run(plain, dropping, other):
            plain(x); dropping(x); other(x)
        plain = Plain()
        plain = plain.cuda()
        dropping = Dropping().to("cuda")
        run(plain, dropping, load())
    """)
    uses = {c.func.value: c for c in calls(ctx) if isinstance(c.func, cst.Name) and c.func.value in (
        "plain", "dropping", "other")}
    assert not changes_in_eval(ctx, cst.Name("plain"), uses["plain"])  # through ``plain = plain.cuda()``
    assert changes_in_eval(ctx, cst.Name("dropping"), uses["dropping"])
    assert changes_in_eval(ctx, cst.Name("other"), uses["other"])  # unknown: assume it does


# ---- state at a point ---------------------------------------------------------------------------------------

def test_no_grad_blocks_hold_in_their_own_function_only():
    ctx = context("""
        import torch
        with torch.no_grad():
            a = model(x)
            def later():
                b = model(x)
        with torch.set_grad_enabled(True):
            c = model(x)
        with torch.inference_mode(False):
            d = model(x)
        with torch.set_grad_enabled(False), open(p) as f:
            e = model(x)
    """)
    assigned = {n.targets[0].target.value: n for n in subtree(ctx.module) if isinstance(n, cst.Assign)}
    assert {name for name, node in assigned.items() if in_no_grad_block(ctx, node)} == {"a", "e"}


# ---- a folder's ``_`` modules share presentation, never meaning ---------------------------------------------

SHARED_MODULES = [p for p in RULE_FILES if p.name.startswith("_")]


def _takes_context(fn: ast.AST) -> bool:
    arguments = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
    return any(a.arg == "ctx" or (a.annotation is not None and "FileContext" in ast.unparse(a.annotation))
               for a in arguments)


def _builds_syntax(fn: ast.AST) -> bool:
    """A fix builder: it rewrites the call it is given into the libcst node a replacement writes (a function that
    returns the node some other expression stands for is a question about values, not a fix)."""
    arguments = fn.args.posonlyargs + fn.args.args
    return fn.returns is not None and "cst." in ast.unparse(fn.returns) and bool(arguments) and \
        arguments[0].annotation is not None and ast.unparse(arguments[0].annotation) == "cst.Call"


def _is_rule_class(node: ast.ClassDef) -> bool:
    """``class X(Rule)``, or a rule of a folder's shared base class (``class Y(AmpRule)`` with its own ``id``)."""
    return any(isinstance(b, ast.Name) and b.id == "Rule" for b in node.bases) or any(
        isinstance(item, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "id" for t in item.targets)
        for item in node.body)


def semantic_queries(source: str) -> list[str]:
    """What a ``_`` module asks the file's context outside a rule class: a function that reads the context and
    answers something other than a fix's syntax, or a class (facts, states) whose methods read the context.
    Those are questions about the program, and belong in ``analyzers/program``."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _takes_context(node) and \
                not _builds_syntax(node):
            found.append(f"{node.name} (line {node.lineno})")
        elif isinstance(node, ast.ClassDef) and not _is_rule_class(node):
            if any(isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and _takes_context(m) for m in node.body):
                found.append(f"class {node.name} (line {node.lineno})")
    return found


def test_the_check_finds_a_query_and_spares_rules_and_fixes():
    source = textwrap.dedent('''
        def names_a_gpu(expr, ctx: FileContext) -> bool:
            return True
        class LoopFacts:
            def __init__(self, ctx):
                pass
        def fix_rename(call: cst.Call, ctx, callee) -> Optional[cst.BaseExpression]:
            return None
        def unwrapped(expr: cst.BaseExpression, ctx) -> cst.BaseExpression:
            return expr
        def is_one(expr) -> bool:
            return True
        class SharedBase(Rule):
            def visit_Call(self, node, ctx):
                pass
        class OneRule(SharedBase):
            id = "TR999"
            def visit_Call(self, node, ctx):
                pass
    ''')
    assert semantic_queries(source) == ["names_a_gpu (line 2)", "class LoopFacts (line 4)", "unwrapped (line 9)"]


@pytest.mark.parametrize("path", SHARED_MODULES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shared_rule_modules_define_no_semantic_query(path):
    found = semantic_queries(path.read_text())
    assert not found, f"{path.name} answers questions about the program; move them to analyzers/program: {found}"


def test_rule_files_define_no_semantic_query():
    """A rule file answers no question about the program at module level (a helper that reads the context): that
    belongs in analyzers/program, where every rule can ask it."""
    found = {f"{p.parent.name}/{p.name}:{query.split(' (')[0]}" for p in RULE_FILES if not p.name.startswith("_")
             for query in semantic_queries(p.read_text())}
    assert not found, f"rule files answer questions about the program; ask analyzers/program: {sorted(found)}"


def test_an_if_guards_its_branches_but_its_own_test_runs_on_every_pass():
    from analyzers.program.loops import guard_between, in_inner_loop
    ctx = context("""
        for batch in loader:
            if loss.item() > limit:
                print(loss.detach())
            value = a.cpu() if ready() else None
            for part in batch:
                part.sum()
    """)
    loop = next(n for n in subtree(ctx.module) if isinstance(n, cst.For))
    by_text = {ctx.module.code_for_node(c): c for c in calls(ctx)}
    guarded = {text for text, call in by_text.items() if guard_between(call, loop, ctx)}
    assert guarded == {"print(loss.detach())", "loss.detach()", "a.cpu()"}
    assert {text for text, call in by_text.items() if in_inner_loop(call, loop, ctx)} == {"part.sum()"}


# ---- order of execution ---------------------------------------------------------------------------------------

def test_a_statement_written_after_a_loop_in_the_same_scope_cannot_run_before_it():
    from analyzers.program.flow import may_run_before

    ctx = context("""
        for item in items:
            use(item)
        prepare()
        def helper():
            for item in items:
                use(item)
            settle()
        for epoch in range(3):
            for item in items:
                use(item)
            adjust()
    """)
    loops = [n for n in subtree(ctx.module) if isinstance(n, cst.For)]
    named = {c.func.value: c for c in calls(ctx) if isinstance(c.func, cst.Name) and c.func.value != "use"}
    assert not may_run_before(ctx, named["prepare"], loops[0])  # below the loop, at the same level
    assert not may_run_before(ctx, named["settle"], loops[1])  # likewise inside one function
    assert may_run_before(ctx, named["adjust"], loops[3])  # the outer loop's next pass runs it first
    assert may_run_before(ctx, named["settle"], loops[0])  # another scope: which runs first is not known
    assert may_run_before(ctx, named["prepare"], loops[2])  # written before the loop


@pytest.mark.parametrize("name, about", [("model_fn", True), ("self.net_path", True), ("build_model", True),
                                         ("encoder_cfg", True), ("model", False), ("self.backbone", False),
                                         ("teacher", False)])
def test_names_that_say_they_hold_something_about_a_model(name, about):
    assert name_says_not_a_model(name) is about


def test_the_values_a_class_gives_an_attribute():
    ctx = context("""
        class Holder:
            def __init__(self, step_fn):
                self.model = step_fn
            def swap(self, other):
                self.model: object = other
                self.other = 1
    """)
    cls = next(n for n in subtree(ctx.module) if isinstance(n, cst.ClassDef))
    assert [ctx.module.code_for_node(v) for v in attribute_values(cls, "model")] == ["step_fn", "other"]


@pytest.mark.parametrize("code, step", [
    # sub-steps nested in a batch loop: the batch loop's pass is the step
    ("for epoch in range(3):\n    for x in batches:\n        for _ in range(2):\n            g(x).backward()\n"
     "        d(x).backward()\n", 1),
    # the batch loop nested in an epoch loop: the batch loop
    ("for epoch in range(3):\n    for x in batches:\n        f(x).backward()\n", 1),
    # nothing handles a batch: no step
    ("for a in range(3):\n    for b in range(4):\n        print(a, b)\n", None),
])
def test_the_loop_whose_pass_is_the_training_step(code, step):
    ctx = context("import torch\n" + code)
    stack = tuple(n for n in subtree(ctx.module) if isinstance(n, cst.For))  # each nests the next, outermost first
    found = training_step_loop(stack, ctx)
    assert (stack.index(found) if found is not None else None) == step


@pytest.mark.parametrize("code,source", [
    ("x = float('nan')", "float"), ("import math\nx = math.nan", "math"), ("import numpy as np\nx = np.NaN", "numpy"),
    ("import torch\nx = torch.nan", "torch"), ("x = float('inf')", None), ("def float(v):\n    return v\nx = float('nan')", None),
])
def test_nan_constants_by_the_library_that_defines_them(code, source):
    from analyzers.program.values import nan_constant_source

    ctx = context(code)
    value = next(node.value for node in subtree(ctx.module) if isinstance(node, cst.Assign)
                 and isinstance(node.targets[0].target, cst.Name) and node.targets[0].target.value == "x")
    assert nan_constant_source(value, ctx) == source


# ---- what the program does, not the words in its text ------------------------------------------------------------

def test_the_default_device_is_set_by_a_call_not_by_its_name_in_a_comment():
    from analyzers.program.devices import sets_default_device
    assert sets_default_device(context("import torch\ntorch.set_default_device('cuda')\n"))
    assert sets_default_device(context("from torch import set_default_device as use\nuse(dev)\n"))
    assert not sets_default_device(context("import torch\n# torch.set_default_device('cuda') later\n"
                                           "print('set_default_device')\ntorch.cuda.set_device(0)\n"))


@pytest.mark.parametrize("code,busy", [
    ("import torch\nnet = torch.compile(net, mode='max-autotune')\n", True),  # a compiled module
    ("import torch\n@torch.compile\ndef step(x):\n    return x * 2\n", True),  # a compiled function
    ("from torch import compile as fuse\nnet = fuse(net)\n", True),  # under another name
    ("import torch\ng = torch.cuda.CUDAGraph()\nwith torch.cuda.graph(g):\n    y = net(x)\n", True),
    ("import torch\nnet = net.cuda()\n# torch.compile(net) later\nprint('compile')\n", False),  # words only
    ("import re\npattern = re.compile('a+')\n", False),  # another library's compile
])
def test_a_program_keeps_the_gpu_busy_by_compiling_or_capturing_not_by_saying_so(code, busy):
    from analyzers.program.devices import keeps_gpu_busy
    assert keeps_gpu_busy(context(code)) is busy


@pytest.mark.parametrize("code,kept", [
    # replaced at the top of the file, under another name for the module
    ("import builtins as b\nb.print = lambda *a, **k: None\n", True),
    # replaced in a function the file calls through another of its functions
    ("import builtins\ndef mute(main):\n    if not main:\n        builtins.print = lambda *a, **k: None\n"
     "def launch(rank):\n    mute(rank == 0)\nlaunch(0)\n", True),
    ("import builtins\ndef quiet():\n    setattr(builtins, 'print', lambda *a, **k: None)\nquiet()\n", True),
    # defined but never called; a local variable that shadows print; only words
    ("import builtins\ndef mute():\n    builtins.print = None\n", False),
    ("def report():\n    print = logger.info\n    print('x')\nreport()\n", False),
    ("# builtins.print is replaced by setup_for_distributed\ninit_distributed_mode(args)\n", False),
])
def test_print_is_kept_to_one_process_when_the_program_replaces_the_builtin(code, kept):
    from analyzers.program.ranks import print_kept_to_one_process
    assert print_kept_to_one_process(context(code)) is kept


@pytest.mark.parametrize("code,handles", [
    ("x = x.to(device)\n", True),
    ("model.cuda()\n", True),
    ("import torch\nif torch.cuda.is_available():\n    pass\n", True),
    ("import torch\nt = torch.zeros(3, device=dev)\n", True),
    ("from torch.nn.parallel import DistributedDataParallel as D\nm = D(m)\n", True),
    # a dtype conversion; words in comments and strings
    ("import torch\nx = x.to(torch.float16)\n# move to the cuda device later\nprint('device')\n", False),
])
def test_a_file_handles_devices_when_its_code_does(code, handles):
    from analyzers.program.devices import file_handles_devices
    assert file_handles_devices(context(code)) is handles


@pytest.mark.parametrize("code,host", [
    # a data set class that builds tensors, through torch, NumPy or its transform
    ("import torch\nclass Rows:\n    def __getitem__(self, i):\n        return torch.as_tensor(self.rows[i])\n", True),
    ("import numpy as np\nclass Rows:\n    def __getitem__(self, i):\n        return np.load(self.files[i])\n", True),
    ("class Images:\n    def __getitem__(self, i):\n        return self.transform(read(self.paths[i]))\n", True),
    # a docstring or a comment that names the device moves nothing
    ("import torch\nclass Rows:\n    'the loop moves the rows to the device'\n    def __getitem__(self, i):\n"
     "        return torch.as_tensor(self.rows[i])  # .cuda() in the loop\n", True),
    # a dtype conversion is not a move
    ("import torch\nclass Rows:\n    def __getitem__(self, i):\n        return self.rows[i].to(torch.float32)\n", True),
    # it places its items: a move, a device argument, a device it keeps
    ("import torch\nclass Rows:\n    def __getitem__(self, i):\n        return torch.as_tensor(self.rows[i]).cuda()\n",
     False),
    ("import torch\nclass Rows:\n    def __getitem__(self, i):\n        return torch.zeros(3, device=self.where)\n", False),
    ("import torch\nclass Rows:\n    def __init__(self, device):\n        self.device = device\n"
     "    def __getitem__(self, i):\n        return torch.as_tensor(self.rows[i], self.device)\n", False),
    # raw text a model tokenizes and moves itself
    ("import torch\nclass Sentences(torch.utils.data.Dataset):\n    def __getitem__(self, i):\n"
     "        return self.lines[i]\n", False),
])
def test_a_data_set_yields_host_tensors_when_its_code_makes_them_and_places_none(code, host):
    from analyzers.program.devices import yields_host_tensors
    ctx = context(code)
    cls = next(n for n in subtree(ctx.module) if isinstance(n, cst.ClassDef))
    assert yields_host_tensors(cls, ctx) is host


def test_a_name_is_used_by_code_not_spelled_in_a_string():
    from analyzers.context import uses_name
    assert uses_name(cst.parse_expression("[p for p in ps if p.requires_grad]"), "requires_grad")
    assert uses_name(cst.parse_expression("x if isinstance(x, T) else y"), "isinstance")
    assert not uses_name(cst.parse_expression("getattr(p, 'requires_grad')"), "requires_grad")
    assert not uses_name(cst.parse_expression("x if kind == 'isinstance' else y"), "isinstance")


@pytest.mark.parametrize("code,hands", [
    ("loader = DataLoader(ds, collate_fn=pad)\n", True),
    ("options = dict(batch_size=8, collate_fn=pad)\n", True),
    ("options = {'batch_size': 8, 'collate_fn': pad}\n", True),
    ("options['collate_fn'] = pad\n", True),
    # a function named for it, a comment, a string
    ("def my_collate(batch):\n    return batch\n# no collate_fn: the default stacks\nprint('collate_fn')\n", False),
])
def test_a_collate_function_is_handed_over_by_code_not_named_in_text(code, hands):
    from analyzers.program.data import hands_a_collate_function
    assert hands_a_collate_function(context(code)) is hands


@pytest.mark.parametrize("code,half", [
    ("import torch\nmodel = model.to(torch.bfloat16)\n", True),
    ("from torch import float16 as f16\nx = x.to(f16)\n", True),
    ("import torch\nwith torch.autocast('cuda'):\n    y = f(x)\n", True),
    ("model = model.half()\n", True),
    ("m = AutoModel.from_pretrained(name, torch_dtype='bfloat16')\n", True),
    ("acc = Accelerator(mixed_precision='fp16')\n", True),
    ("trainer = Trainer(precision=16)\n", True),
    # words only; a float32 option; an unrelated method named half with arguments
    ("# float16 and autocast would help\nprint('half precision')\n", False),
    ("trainer = Trainer(precision='32-true')\nsplit = data.half(0.5)\n", False),
])
def test_half_precision_is_what_the_code_computes_in(code, half):
    from analyzers.program.devices import computes_in_half_precision
    assert computes_in_half_precision(context(code)) is half


@pytest.mark.parametrize("code,overlaps", [
    ("import torch\nside = torch.cuda.Stream()\n", True),
    ("import torch\nwith torch.cuda.stream(side):\n    y = f(x)\n", True),
    ("x.record_stream(s)\n", True),
    ("host = logits.cpu(non_blocking=True)\n", True),
    ("host = logits.to('cpu', non_blocking=True)\n", True),
    # a copy to the GPU that does not wait is not one to the host; words only
    ("x = x.cuda(non_blocking=True)\n# torch.cuda.Stream() would overlap this\nprint('Event(')\n", False),
])
def test_work_overlaps_asynchronously_when_the_code_uses_streams(code, overlaps):
    from analyzers.program.devices import overlaps_work_asynchronously
    assert overlaps_work_asynchronously(context(code)) is overlaps


@pytest.mark.parametrize("code,splits", [
    ("from accelerate import Accelerator\n", True),
    ("import lightning as L\n", True),
    ("from torch.utils.data import IterableDataset\nclass S(IterableDataset):\n    pass\n", True),
    ("from datasets.distributed import split_dataset_by_node\nds = split_dataset_by_node(ds, r, n)\n", True),
    ("import torch.distributed as dist\nmine = files[dist.get_rank()::dist.get_world_size()]\n", True),
    # words; slicing by a count that is not the rank
    ("# accelerate or an IterableDataset would shard this\nprint('shard')\nhead = files[:n]\n", False),
])
def test_data_splits_itself_when_the_code_shards_it(code, splits):
    from analyzers.program.data import data_splits_itself
    assert data_splits_itself(context(code)) is splits


@pytest.mark.parametrize("code,freezes", [
    ("for p in model.backbone.parameters():\n    p.requires_grad = False\n", True),
    ("for p in model.parameters():\n    p.requires_grad = not args.finetune_head_only\n", True),
    ("model.encoder.requires_grad_(False)\n", True),
    # unfreezing; a comment and a name
    ("model.requires_grad_()\nfor p in model.parameters():\n    p.requires_grad = True\n", False),
    ("# freeze the backbone first\ndef freeze_backbone(m):\n    m.eval()\nfreeze_backbone(model)\n", False),
])
def test_the_program_freezes_parameters_when_its_code_does(code, freezes):
    from analyzers.program.freezing import program_freezes
    assert program_freezes(context(code)) is freezes


@pytest.mark.parametrize("code,fixed", [
    ("import torch.nn as nn\ndef set_bn_eval(m):\n    if isinstance(m, nn.BatchNorm2d):\n        m.eval()\n", True),
    ("import torch.nn as nn\nmodel.apply(lambda m: m.eval() if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)) "
     "else None)\n", True),
    ("import torch.nn as nn\nbn = nn.BatchNorm2d(64, track_running_stats=False)\n", True),
    ("import torch.nn as nn\nbn = nn.BatchNorm2d(64, momentum=0)\n", True),
    ("backbone = dict(type='ResNet', depth=50, norm_eval=True)\n", True),
    ("from torchvision.ops import FrozenBatchNorm2d\nnet = resnet50(norm_layer=FrozenBatchNorm2d)\n", True),
    # names and comments; eval() of the whole model; an isinstance test that does not evaluate
    ("# fix_bn / freeze_bn: keep BatchNorm in eval\ndef freeze_bn(m):\n    m.train()\nmodel.eval()\n"
     "n = sum(isinstance(m, nn.BatchNorm2d) for m in model.modules())\nbn = nn.BatchNorm2d(8, momentum=0.1)\n", False),
])
def test_batchnorm_statistics_are_fixed_when_the_code_fixes_them(code, fixed):
    from analyzers.program.freezing import program_fixes_batchnorm_statistics
    assert program_fixes_batchnorm_statistics(context(code)) is fixed


def test_no_rule_decides_from_the_files_text():
    """A rule reads what the code does through the context and the program model; the file's whole text (where a
    comment or a string says anything) only gates whether the rule runs at all (``source_hint``)."""
    found = []
    for path in RULE_FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "source" and (
                    isinstance(node.value, ast.Name) and node.value.id == "ctx" or
                    isinstance(node.value, ast.Attribute) and node.value.attr == "ctx"):
                found.append(f"{path.parent.name}/{path.name}:{node.lineno}")
    assert not found, f"rules read the file's text to decide; ask analyzers/program what the code does: {found}"


def _is_code_text(expr: ast.expr, text_names: set[str]) -> bool:
    """``ctx.module.code_for_node(x)`` (and ``.strip()`` / ``.lower()`` of it), or a variable that holds it."""
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
        return expr.func.attr == "code_for_node" or (
            expr.func.attr in ("strip", "lower") and _is_code_text(expr.func.value, text_names))
    return isinstance(expr, ast.Name) and expr.id in text_names


def test_no_rule_searches_the_text_of_code():
    """A rule shows code in its messages; it never decides by searching that text (``"requires_grad" in text``, a
    regular expression over it): a string, a comment or a longer name would decide. It asks the nodes
    (``analyzers.context.uses_name``, the program model)."""
    found = []
    for path in RULE_FILES:
        tree = ast.parse(path.read_text())
        text_names = {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
                      and _is_code_text(node.value, set()) for target in node.targets if isinstance(target, ast.Name)}
        for node in ast.walk(tree):
            searched = isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) \
                and any(_is_code_text(c, text_names) for c in node.comparators)
            searched = searched or isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("search", "match", "fullmatch", "findall", "startswith", "endswith") and \
                (any(_is_code_text(a, text_names) for a in node.args) or _is_code_text(node.func.value, text_names))
            if searched:
                found.append(f"{path.parent.name}/{path.name}:{node.lineno}")
    assert not found, f"rules search the text of code to decide; ask the nodes what the code does: {found}"
