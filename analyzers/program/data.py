"""What a data set is: what its transform does to each item, and whether it holds its items in memory."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import libcst as cst

from analyzers.context import (FileContext, argument, call_receiver, dotted_name, is_false, is_true, iter_names,
                               keyword_arg, positional_args, short, string_value)
from analyzers.program.flow import ModuleNodes, assigned_values, call_site_values, parameter_index, subtree
from analyzers.program.library import (COLUMN_TRANSFORMERS, ITERABLE_DATASETS, PIPELINES, Does, does,
                                       fitted_transformer, is_data_loader, learns_from_rows, training_libraries_that)
from analyzers.program.modules import ModuleFacts
from analyzers.program.names import last_segment, mentions_evaluation_data, names_evaluation_data

# transforms that draw a random number per item, besides the ``Random*`` classes
_RANDOM_TRANSFORMS = {"ColorJitter", "RandAugment", "TrivialAugmentWide", "AutoAugment", "AugMix", "ElasticTransform",
                      "RandomApply", "RandomChoice", "RandomOrder"}
_TRANSFORM_ROOTS = ("torchvision.transforms", "torchvision.transforms.v2", "albumentations", "monai.transforms",
                    "timm.data")


_EVALUATION_SPLITS = {"val", "valid", "validation", "test", "eval", "dev", "testing"}


def evaluation_data_reason(node: cst.Call, ctx: FileContext) -> Optional[str]:
    """Why the data set ``node`` builds holds evaluation data, said as a message quotes it: ``train=False``, an
    evaluation ``split=``, or the name it is assigned to; None when nothing says so."""
    train = keyword_arg(node, "train")
    if train is not None and is_false(train.value):
        return "`train=False`"
    split = keyword_arg(node, "split")
    if split is not None and (string_value(split.value) or "").lower() in _EVALUATION_SPLITS:
        return f"`split={ctx.module.code_for_node(split.value)}`"
    parent = ctx.parent(node)
    if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
        target = dotted_name(parent.targets[0].target)
        if target and names_evaluation_data(last_segment(target)):
            return f"it is assigned to `{target}`"  # a dotted name: no backtick to escape
    return None


def random_transforms(expr: Optional[cst.BaseExpression], ctx: FileContext, depth: int = 0) -> list[str]:
    """Names of the random transforms ``expr`` (a Compose, a list, or a name bound to one) applies."""
    if expr is None or depth > 3:
        return []
    if isinstance(expr, (cst.Name, cst.Attribute)):
        return random_transforms(ctx.assigned_value(expr), ctx, depth + 1)
    if isinstance(expr, (cst.List, cst.Tuple)):
        found: list[str] = []
        for element in expr.elements:
            found.extend(random_transforms(element.value, ctx, depth + 1))
        return found
    if not isinstance(expr, cst.Call):
        return []
    qualified = ctx.qualified_name(expr.func) or ""
    last = qualified.rsplit(".", 1)[-1]
    if not qualified.startswith(_TRANSFORM_ROOTS):
        return []
    if last == "Compose":
        return random_transforms(argument(expr, 0, "transforms"), ctx, depth + 1)
    if last.startswith("Random") or last in _RANDOM_TRANSFORMS:
        probability = keyword_arg(expr, "p")
        if probability is not None and isinstance(probability.value, (cst.Integer, cst.Float)) and \
                float(probability.value.value) == 0.0:
            return []
        return [last]
    return []


_DEPTH = 5  # steps from a loader's data set to where it is built: parameter, caller's name, call, return, name


def dataset_in_memory(dataset: Optional[cst.BaseExpression], ctx: FileContext, depth: int = 0,
                      images: bool = False) -> bool:
    """A data set of small tensors already in memory whose items need no random augmentation: loading one costs
    nothing worth a worker process or pinned memory. With ``images``, also one that holds full images in memory
    (the CIFAR family): nothing to read or decode per item, though each is still an image to copy to the device.
    Library data sets from the library table (``TensorDataset``, torchvision's MNIST family, a tensor built by
    torch); a list built in the program; a class of the repository from what its ``__getitem__`` does (it
    indexes tensors or lists the instance holds, opens no file);
    a parameter of the function around it when every call of that function in the file hands in such a data set
    (``train(args, train_dataset)``); what a function of this file returns when each of its ``return``s is one
    (``load_and_cache_examples`` building a ``TensorDataset``). Anything else is unknown, and not in memory."""
    origin = ctx.origin(dataset) if dataset is not None else None
    if isinstance(origin, (cst.List, cst.ListComp)):
        return True  # a list built in the program: its items are already in memory
    if isinstance(origin, cst.Name) and depth < _DEPTH:
        # a name of another scope than the one being walked, or a parameter: every value it may hold
        fn = _enclosing_function(origin, ctx.facts(ModuleNodes))
        if fn is not None and parameter_index(fn, origin.value) is not None:
            values = call_site_values(ctx, fn, origin.value) or []
        else:
            values = [v for v in assigned_values(ctx, fn if fn is not None else ctx.module, origin.value)
                      if not (isinstance(v, cst.Name) and v.value == origin.value)]
        return bool(values) and all(dataset_in_memory(value, ctx, depth + 1, images) for value in values)
    if not isinstance(origin, cst.Call):
        return False
    qualified = ctx.call_name(origin)
    if does(qualified, Does.HOLDS_DATA_IN_MEMORY) or (images and does(qualified, Does.HOLDS_IMAGES_IN_MEMORY)):
        transform = argument(origin, 2, "transform")
        return not random_transforms(transform, ctx)
    if not isinstance(origin.func, cst.Name):
        return False
    source = ctx.facts(ModuleFacts).item_source(origin.func.value)
    if source is not None or depth >= _DEPTH:
        return source == "memory"
    from analyzers.program.graphs import FunctionShapes  # graphs reads values, which reads this module
    from analyzers.program.values import functions_called
    functions = functions_called(origin, ctx)
    returned = [node.value for fn in functions for node in ctx.facts(FunctionShapes).own_returns(fn)]
    return bool(functions) and bool(returned) and all(
        value is not None and dataset_in_memory(value, ctx, depth + 1, images) for value in returned)


def transform_replaced(dataset: str, ctx: FileContext) -> bool:
    """The program gives ``dataset`` (or the data set it wraps: ``valid_data.dataset``) a transform with no random
    step somewhere: ``valid_data.dataset.transform = test_transforms`` after splitting it off augmented data."""
    for node in subtree(ctx.module):
        if isinstance(node, cst.Assign) and len(node.targets) == 1:
            target = dotted_name(node.targets[0].target) or ""
            if target.startswith(f"{dataset}.") and target.rsplit(".", 1)[-1] in ("transform", "transforms") and \
                    not random_transforms(node.value, ctx):
                return True
    return False


@dataclass
class Loader:
    call: cst.Call
    label: str  # ``train_loader = DataLoader(train_ds, ...)`` → "train_loader"
    training: bool
    in_memory: bool = False  # MNIST-like or TensorDataset: nothing to decode, little to copy
    read_in_memory: bool = False  # in memory, or images held in memory (CIFAR): nothing to read or decode per item


# ``train_loader``, ``trainset``, ``dataset_train``, ``pretrain_ds``: a word of the name says training data
_TRAIN_WORD = re.compile(r"(?<![a-z])train|train(?![a-z])", re.IGNORECASE)


class TrainingIterables:
    """What the file's training loops iterate: the name under ``for ... in <it>`` (through ``enumerate``,
    ``tqdm``...) of every loop whose body calls backward, and, where that name is a parameter of the loop's
    function, the names the function's call sites in this file pass for it (``train(model, train_dl)``). A plain
    name counts in its own function only (another function's ``data_loader`` is another variable); an attribute
    (``self.train_loader``) anywhere."""

    def __init__(self, ctx: FileContext) -> None:
        from analyzers.program.loops import iterated, loop_trains  # loops needs values, which needs this module

        nodes = ctx.facts(ModuleNodes)
        self._nodes = nodes
        self.names: set[tuple[Optional[int], str]] = set()
        for loop in nodes.of_type(cst.For):
            if not loop_trains(loop, ctx):
                continue
            name = dotted_name(iterated(loop.iter))
            if name is None:
                continue
            fn = _enclosing_function(loop, nodes)
            self.names.add(self._key(name, fn))
            if fn is not None and "." not in name and parameter_index(fn, name) is not None:
                for value in call_site_values(ctx, fn, name) or ():
                    passed = dotted_name(value)
                    if passed is not None:
                        self.names.add(self._key(passed, _enclosing_function(value, nodes)))

    @staticmethod
    def _key(name: str, fn: Optional[cst.FunctionDef]) -> tuple[Optional[int], str]:
        return (None if "." in name else id(fn) if fn is not None else 0), name

    def iterated_by_training(self, name: str, where: cst.CSTNode) -> bool:
        """``name``, bound where ``where`` stands, is iterated by a training loop of the file."""
        return self._key(name, _enclosing_function(where, self._nodes)) in self.names


def _enclosing_function(node: cst.CSTNode, nodes: ModuleNodes) -> Optional[cst.FunctionDef]:
    parent = nodes.parents.get(id(node))
    while parent is not None and not isinstance(parent, cst.FunctionDef):
        parent = nodes.parents.get(id(parent))
    return parent


def loader_trains(call: cst.Call, target: Optional[str], dataset: Optional[cst.BaseExpression],
                  ctx: FileContext) -> bool:
    """Does the DataLoader ``call`` (assigned to ``target``, over ``dataset``) feed training? Not when its name or
    its data's names say evaluation data (a test loader stays one when a Grad-CAM loop calls backward over it).
    Else where it is iterated decides first: a loop that calls backward over it; then it shuffles, a word of its
    name or of its data's names says train, or a ``train*`` function returns it."""
    if names_evaluation_data(last_segment(target)) or mentions_evaluation_data(dataset):
        return False  # a shuffled test loader is still a test loader
    iterables = ctx.facts(TrainingIterables)
    if target is not None and iterables.iterated_by_training(target, call):
        return True
    if is_true(argument(call, 2, "shuffle")):
        return True
    names = [target] if target is not None else []
    names += list(iter_names(dataset)) if dataset is not None else []
    if any(_TRAIN_WORD.search(last_segment(name)) for name in names):
        return True
    fn = _enclosing_function(call, ctx.facts(ModuleNodes))
    return isinstance(ctx.parent(call), cst.Return) and fn is not None and bool(_TRAIN_WORD.search(fn.name.value))


def loader_of_call(node: cst.Call, ctx: FileContext) -> Optional[Loader]:
    if not is_data_loader(ctx.call_name(node)):
        return None
    if any(a.star for a in node.args):
        return None  # ``**loader_kwargs`` may carry the setting
    dataset = argument(node, 0, "dataset")
    dataset_name = dotted_name(dataset) if dataset is not None else None
    parent = ctx.parent(node)
    target = None
    if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
        target = dotted_name(parent.targets[0].target)
    elif isinstance(parent, cst.AnnAssign):
        target = dotted_name(parent.target)
    label = target or (f"DataLoader({dataset_name})" if dataset_name else short(ctx, node, 50))
    in_memory = dataset_in_memory(dataset, ctx)
    return Loader(node, label, loader_trains(node, target, dataset, ctx), in_memory,
                  in_memory or dataset_in_memory(dataset, ctx, images=True))


DISTRIBUTED_SAMPLER_NAME = re.compile(r"Distributed\w*Sampler")


def is_sharding_sampler(node: cst.Call, ctx: FileContext) -> bool:
    """torch's DistributedSampler, or a project's own ``Distributed*Sampler`` class."""
    return does(ctx.call_name(node), Does.SHARDS_DATA) or bool(
        DISTRIBUTED_SAMPLER_NAME.search(dotted_name(node.func) or ""))


def data_splits_itself(ctx: FileContext) -> bool:
    """Does the file's data reach each process in its own part without a sampler being passed: a training library
    that shards what it is given (accelerate, Lightning: :func:`training_libraries_that`), a call that shards
    (``Does.SHARDS_DATA``: ``split_dataset_by_node``, a distributed sampler of any kind), an iterable-style data set
    (its iterator decides what each process reads: :data:`ITERABLE_DATASETS`, or a class built on one), or data
    sliced by the process's rank (``files[rank::world_size]``)?"""
    from analyzers.program.ranks import depends_on_rank  # ranks imports devices, which this module's importers need
    if any(ctx.imports.imports_root(library) for library in training_libraries_that(Does.SHARDS_DATA)):
        return True
    nodes = ctx.facts(ModuleNodes)
    if any(ctx.qualified_name(node) in ITERABLE_DATASETS for node in nodes.of_type(cst.Name, cst.Attribute)):
        return True
    if any(is_sharding_sampler(call, ctx) for call in nodes.of_type(cst.Call)):
        return True
    return any(isinstance(element.slice, cst.Slice) and any(
        part is not None and depends_on_rank(part, ctx) for part in (element.slice.lower, element.slice.step))
        for subscript in nodes.of_type(cst.Subscript) for element in subscript.slice)


def hands_a_collate_function(ctx: FileContext) -> bool:
    """Does the file's code give some loader a collate function: a ``collate_fn=`` argument (to a loader, to
    ``dict(...)``, to ``kwargs.update(...)``), a ``"collate_fn"`` key of a dict, or an item stored under that key?
    Loader options built in such a file may carry one; a comment or a helper's name carries nothing."""
    nodes = ctx.facts(ModuleNodes)
    if any(arg.keyword is not None and arg.keyword.value == "collate_fn" for arg in nodes.of_type(cst.Arg)):
        return True
    keys = [element.key for element in nodes.of_type(cst.DictElement)]
    keys += [element.slice.value for subscript in nodes.of_type(cst.Subscript) for element in subscript.slice
             if isinstance(element.slice, cst.Index)]
    return any(string_value(key) == "collate_fn" for key in keys)


def may_have_sampler(loader: cst.Call, max_positional: int) -> bool:
    """A ``DataLoader(...)`` call that passes a sampler, or may: ``**kwargs``, or more than ``max_positional``
    positional arguments (``sampler`` is the fourth: one passed that way is not read)."""
    return (any(a.star for a in loader.args) or len(positional_args(loader)) > max_positional
            or keyword_arg(loader, "sampler") is not None or keyword_arg(loader, "batch_sampler") is not None)


# an index into a data set named for the rows it picks: ``X[test_idx]`` reads the test rows
_INDEX_WORDS = ("idx", "index", "indices", "ids", "mask", "rows")


def data_names(expr: Optional[cst.BaseExpression], ctx: FileContext, depth: int = 0) -> list[str]:
    """The names that identify the data an expression reads: ``X_test`` in ``X_test.values`` / ``test_df["text"]``,
    and an index named as one in ``X[test_idx]``."""
    if expr is None or depth > 6:
        return []
    if isinstance(expr, (cst.Name, cst.Attribute)):
        name = dotted_name(expr)
        if name is not None:
            return [name]
        return data_names(expr.value, ctx, depth + 1) if isinstance(expr, cst.Attribute) else []
    if isinstance(expr, cst.Subscript):
        names = data_names(expr.value, ctx, depth + 1)
        for element in expr.slice:
            index = element.slice
            if isinstance(index, cst.Index) and isinstance(index.value, cst.Name):
                lowered = index.value.value.lower()
                if any(w in lowered for w in _INDEX_WORDS):
                    names.append(index.value.value)  # X[test_idx]
        return names
    if isinstance(expr, cst.Call):
        receiver = call_receiver(expr)
        if receiver is not None and ctx.qualified_name(receiver) is None:
            return data_names(receiver, ctx, depth + 1)  # X_test.values / test_df["t"].to_numpy()
        out: list[str] = []
        for arg in positional_args(expr):
            out.extend(data_names(arg.value, ctx, depth + 1))  # np.array(X_test), pd.concat([...])
        return out
    if isinstance(expr, cst.BinaryOperation):
        return data_names(expr.left, ctx, depth + 1) + data_names(expr.right, ctx, depth + 1)
    if isinstance(expr, (cst.List, cst.Tuple)):
        out = []
        for element in expr.elements:
            out.extend(data_names(element.value, ctx, depth + 1))
        return out
    return []


def preprocessor_of(call: cst.Call, ctx: FileContext, depth: int = 0) -> Optional[str]:
    """The preprocessor ``call`` builds, one that learns from the rows it is fitted on: ``StandardScaler`` for
    ``StandardScaler(...)``; a pipeline made only of preprocessors too (``Pipeline(StandardScaler, PCA)``)."""
    if depth > 3:
        return None
    name = ctx.call_name(call)
    if name is None:
        return None
    last = name.rsplit(".", 1)[-1]
    if learns_from_rows(name):
        return fitted_transformer(name)
    if name in COLUMN_TRANSFORMERS:
        return last
    if name in PIPELINES:
        steps = _pipeline_steps(call, last)
        if not steps:
            return None
        inner = []
        for step in steps:
            if isinstance(step, cst.SimpleString):
                continue  # "passthrough"
            value = ctx.origin(step) if isinstance(step, (cst.Name, cst.Attribute)) else step
            found = preprocessor_of(value, ctx, depth + 1) if isinstance(value, cst.Call) else None
            if found is None:
                return None  # ends in a model (or unknown): not only preprocessing
            inner.append(found)
        return f"{last}({', '.join(inner)})" if inner else None
    return None


def _pipeline_steps(call: cst.Call, kind: str) -> list[cst.BaseExpression]:
    if kind in ("make_pipeline", "make_union"):
        return [a.value for a in positional_args(call)]
    steps = argument(call, 0, "steps" if kind == "Pipeline" else "transformer_list")
    if not isinstance(steps, (cst.List, cst.Tuple)):
        return []
    out = []
    for element in steps.elements:
        pair = element.value
        if not isinstance(pair, cst.Tuple) or len(pair.elements) < 2:
            return []
        out.append(pair.elements[1].value)
    return out
def sampler_feeds_training(sampler: cst.Call, ctx: FileContext) -> bool:
    """Can the batches the sampler ``sampler`` orders reach training? Only evidence of evaluation says no: its
    own data or the name it is bound to says evaluation data (``DistributedSampler(eval_dataset)``,
    ``val_sampler = ...``), or every DataLoader of the file it is handed to (``sampler=``, inline or by name) is
    bound to such a name or loads such data. A name that says training (``train_sampler``) says yes, and so does
    anything unknown."""
    parent = ctx.parent(sampler)
    target = dotted_name(parent.targets[0].target) if isinstance(parent, cst.Assign) and len(parent.targets) == 1 \
        else None
    if target is not None and _TRAIN_WORD.search(last_segment(target)):
        return True
    if _evaluation_data(target, argument(sampler, 0, "dataset")):
        return False
    fed: list[bool] = []
    for call in ctx.facts(ModuleNodes).of_type(cst.Call):
        given = keyword_arg(call, "sampler")
        if given is None or not is_data_loader(ctx.call_name(call)):
            continue
        if given.value is sampler or (target is not None and dotted_name(given.value) == target):
            holder = ctx.parent(call)
            bound = dotted_name(holder.targets[0].target) if isinstance(holder, cst.Assign) and \
                len(holder.targets) == 1 else None
            fed.append(not _evaluation_data(bound, argument(call, 0, "dataset")))
    return not fed or any(fed)


def _evaluation_data(name: Optional[str], data: Optional[cst.BaseExpression]) -> bool:
    return names_evaluation_data(last_segment(name)) or mentions_evaluation_data(data)
