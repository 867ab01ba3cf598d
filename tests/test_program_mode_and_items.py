"""Two questions of the program model: does eval() change a model (is it mode-dependent), and does a data set hold
its items in memory or read them from disk."""
from __future__ import annotations

import textwrap

import libcst as cst

from analyzers.context import FileContext
from analyzers.program.data import dataset_in_memory
from analyzers.program.flow import subtree
from analyzers.program.library import norm_keeps_running_stats
from analyzers.program.modules import ModuleFacts, RepositoryIndex
from analyzers.program.values import changes_in_eval
from tests.test_program_model import context


def _call_of(ctx: FileContext, name: str) -> cst.Call:
    return next(node for node in subtree(ctx.module) if isinstance(node, cst.Call)
                and isinstance(node.func, cst.Name) and node.func.value == name)


def _mode_dependent(code: str, model: str = "model") -> bool:
    ctx = context(code)
    use = _call_of(ctx, "use")
    return changes_in_eval(ctx, cst.parse_expression(model), use)


# ---- mode dependence ---------------------------------------------------------------------------------------

def test_library_table_says_which_norm_layers_keep_running_statistics():
    assert norm_keeps_running_stats("BatchNorm2d", None)
    assert not norm_keeps_running_stats("BatchNorm2d", False)
    assert not norm_keeps_running_stats("InstanceNorm2d", None)
    assert norm_keeps_running_stats("InstanceNorm2d", True)
    assert not norm_keeps_running_stats("LayerNorm", None)


def test_plain_layers_in_sequential_module_list_and_nested_classes_are_mode_free():
    assert not _mode_dependent("""
        import torch.nn as nn
        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.convs = nn.ModuleList([nn.Conv2d(3, 3, 1) for _ in range(2)])
            def forward(self, x):
                return x
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.block = Block()
                self.head = nn.Sequential(nn.Flatten(), nn.Linear(12, 2), nn.ReLU())
            def forward(self, x):
                return self.head(self.block(x))
        model = Net()
        use(model)
    """)


def test_a_nested_dropout_a_training_branch_or_an_unknown_class_is_not_mode_free():
    nested = """
        import torch.nn as nn
        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = nn.ModuleList([nn.Linear(2, 2), nn.Dropout(0.2)])
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.block = Block()
        model = Net()
        use(model)
    """
    assert _mode_dependent(nested)
    assert _mode_dependent("""
        import torch
        import torch.nn as nn
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(2, 2)
            def forward(self, x):
                return self.fc(x + torch.randn_like(x)) if self.training else self.fc(x)
        model = Net()
        use(model)
    """)
    assert _mode_dependent("from elsewhere import Net\nmodel = Net()\nuse(model)\n")


def test_a_helper_parameter_is_answered_by_every_call_site():
    helper = """
        import torch.nn as nn
        small = nn.Linear(4, 2)
        noisy = nn.Sequential(nn.Linear(4, 2), nn.Dropout())
        def score(model, x):
            use(model)
        score(small, 1)
        %s
    """
    ctx = context(helper % "")
    use = _call_of(ctx, "use")
    assert not changes_in_eval(ctx, cst.parse_expression("model"), use)
    ctx = context(helper % "score(noisy, 2)")
    use = _call_of(ctx, "use")
    assert changes_in_eval(ctx, cst.parse_expression("model"), use)


def test_an_attribute_stored_from_a_constructor_parameter_is_answered_by_the_class_calls():
    holder = """
        import torch.nn as nn
        plain = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
        normed = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
        class Ranker:
            def __init__(self, scorer, k):
                self.scorer = scorer
            def top(self, rows):
                use(self.scorer)
        Ranker(plain, 5)
        %s
    """
    ctx = context(holder % "")
    assert not changes_in_eval(ctx, cst.parse_expression("self.scorer"), _call_of(ctx, "use"))
    ctx = context(holder % "Ranker(scorer=normed, k=1)")
    assert changes_in_eval(ctx, cst.parse_expression("self.scorer"), _call_of(ctx, "use"))
    # no call of the class in the file: its callers may hand it anything
    ctx = context(holder.replace("Ranker(plain, 5)", "") % "")
    assert changes_in_eval(ctx, cst.parse_expression("self.scorer"), _call_of(ctx, "use"))



def test_a_lambda_unpacked_from_a_tuple_is_no_module():
    assert not _mode_dependent("""
        def fit(w, b):
            model, loss = lambda x: x @ w + b, mse
            use(model)
    """)
    assert _mode_dependent("""
        import torch.nn as nn
        def fit():
            model, loss = nn.Sequential(nn.Linear(2, 2), nn.Dropout()), mse
            use(model)
    """)


FACTORIES = """
    import torch.nn as nn
    class Straight(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)
    class Dropping(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.1))
    def make_straight(kind):
        if kind not in ("a", "b"):
            print("unknown kind")
            return
        return Straight()
    def make_dropping():
        return Dropping()
    def make_either(flag):
        return Straight() if flag else Dropping()
"""


def test_a_model_built_by_a_factory_function_of_another_file_is_as_mode_free_as_its_class(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "zoo.py").write_text(textwrap.dedent(FACTORIES))
    code = "from zoo import make_straight, make_dropping, make_either\nmodel = {}\nuse(model)\n"

    def dependent(factory: str) -> bool:
        ctx = context(code.format(factory), path=str(tmp_path / "run.py"), repository=RepositoryIndex(tmp_path))
        return changes_in_eval(ctx, cst.parse_expression("model"), _call_of(ctx, "use"))

    assert not dependent("make_straight('a')")  # the bare return of its error path builds nothing
    assert dependent("make_dropping()")
    assert dependent("make_either(True)")  # returns something other than one call of a class: not known
    assert dependent("make_unknown()")


def test_a_part_or_a_method_of_a_model_is_as_mode_free_as_the_model():
    """``model.encode`` (a method) or ``model.head`` (a submodule) that nothing assigns holds nothing the model does
    not hold; one assigned a module of its own is answered by what it is assigned."""
    code = """
        import torch.nn as nn
        class Coder(nn.Module):
            def __init__(self, %s):
                super().__init__()
                self.inner = nn.Linear(8, 2)
                self.outer = nn.Sequential(nn.Linear(2, 8), %s)
            def encode(self, x):
                return self.inner(x)
            def forward(self, x):
                return self.outer(self.encode(x))
        model = Coder().to("cpu")
        %s
        use(model.encode, model.outer)
    """
    assert not _mode_dependent(code % ("", "nn.Sigmoid()", ""), "model.encode")
    assert not _mode_dependent(code % ("", "nn.Sigmoid()", ""), "model.outer")
    assert _mode_dependent(code % ("", "nn.Dropout(0.1)", ""), "model.encode")
    assert _mode_dependent(code % ("", "nn.Sigmoid()", "model.outer = nn.BatchNorm1d(8)"), "model.outer")
    # an attribute of an object that is not a module: whatever it holds is not known
    assert _mode_dependent("""
        class Embedder:
            def __init__(self):
                self.net = fetch_network()
        holder = Embedder()
        use(holder.net)
    """, "holder.net")
    # the owner is unknown (a parameter no call in view passes): so is its part
    assert _mode_dependent("""
        def check(model, rows):
            use(model.encode(rows))
    """, "model.encode")



def test_the_library_table_names_embedding_models_that_eval_does_not_change():
    """A graph embedding model of the table (one embedding table, no dropout or norm) is mode-free; another model
    of the same library is not known to be."""
    code = """
        import torch
        from torch_geometric.nn import %s
        model = %s(edges, embedding_dim=16).to("cpu")
        use(model)
    """
    assert not _mode_dependent(code % ("MetaPath2Vec", "MetaPath2Vec"))
    assert not _mode_dependent(code % ("Node2Vec", "Node2Vec"))
    assert _mode_dependent(code % ("GraphSAGE", "GraphSAGE"))


# ---- where a data set's items come from --------------------------------------------------------------------

DATASETS = """
    import torch
    from torch.utils.data import Dataset
    class Held(Dataset):
        def __init__(self, ids):
            self.ids = torch.tensor(ids)
        def __getitem__(self, i):
            return self.ids[i].long()
    class Files(Dataset):
        def __init__(self, paths):
            self.paths = paths
        def __getitem__(self, i):
            with open(self.paths[i]) as f:
                return f.read()
    class Transformed(Dataset):
        def __getitem__(self, i):
            return self.transform(self.items[i])
    class Child(Held):
        pass
"""


def test_item_source_of_repository_data_sets(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "sets.py").write_text(textwrap.dedent(DATASETS))
    ctx = context("from sets import Held, Files, Transformed, Child\n", path=str(tmp_path / "train.py"),
                  repository=RepositoryIndex(tmp_path))
    facts = ctx.facts(ModuleFacts)
    assert facts.item_source("Held") == "memory"
    assert facts.item_source("Child") == "memory"  # an inherited __getitem__
    assert facts.item_source("Files") == "disk"
    assert facts.item_source("Transformed") is None  # a transform may do anything: unknown
    assert facts.item_source("Missing") is None


def test_dataset_in_memory_from_the_library_table_and_the_class():
    ctx = context(textwrap.dedent(DATASETS) + textwrap.dedent("""
        from torch.utils.data import TensorDataset
        a = TensorDataset(x, y)
        b = Held([1, 2])
        c = Files(paths)
        d = Transformed()
        import torch as t
        e = t.from_numpy(array)
        f = [t.zeros(3) for _ in range(4)]
        g = load_everything()
    """))
    assert [dataset_in_memory(cst.parse_expression(name), ctx) for name in "abcdefg"] == \
        [True, True, False, False, True, True, False]
