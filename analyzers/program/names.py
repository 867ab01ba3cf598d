"""What a name says about the value it holds, and how a name is written in a file.

One copy of each naming convention the rules rely on: a variable called ``model`` / ``netG`` / ``backbone``
holds a module, ``opt`` / ``optimizer_d`` an optimizer, ``lr_scheduler`` a scheduler, ``scaler`` a grad scaler.
Names are evidence of last resort: callers ask what built a value first (:mod:`analyzers.program.values`).
"""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from analyzers.context import FileContext, iter_names, local_name_for, all_children, dotted_name


def last_segment(dotted: Optional[str]) -> str:
    """``fc`` for ``self.model.fc``; "" for None."""
    return dotted.rsplit(".", 1)[-1] if dotted else ""


def last_name(expr: Optional[cst.BaseExpression]) -> Optional[str]:
    """``step`` for ``opt.step`` / ``step``; None for anything else (a call, a subscript)."""
    if isinstance(expr, cst.Attribute):
        return expr.attr.value
    if isinstance(expr, cst.Name):
        return expr.value
    return None


_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")


def name_words(name: str) -> list[str]:
    """The lower-case words of an identifier: ``valLoader`` and ``val_loader`` both give ``val, loader``."""
    return [w.lower() for w in _WORD.findall(name)]


# Names that hold a module. A union of what the serialization, inference and training rules each accepted.
_MODEL_NAMES = {"model", "net", "network", "module", "generator", "discriminator", "encoder", "decoder", "classifier",
                "backbone", "policy", "critic", "actor", "unet", "vae", "transformer", "detector", "segmenter",
                "autoencoder", "netg", "netd", "gen", "disc", "student", "ddp_model", "wrapped_model"}
# ... and names ending like a model's that hold something about a model: its path, state, config, class, loss
_NOT_MODEL_SUFFIXES = ("_path", "path", "state", "_dir", "_name", "name", "_fn", "_cls", "_class", "_type",
                       "_config", "_cfg", "_kwargs", "_args", "loss")
# ``get_model`` / ``build_net`` / ``prepare_model`` / ``unwrap_model``: a function that makes, readies or unwraps a
# model, not one
_VERB_PREFIXES = ("get_", "build_", "create_", "make_", "load_", "init_", "setup_", "set_", "save_", "to_",
                  "prepare_", "wrap_", "unwrap_",
                  "_get_", "_build_", "_create_", "_make_", "_load_", "_init_", "_setup_", "_prepare_", "_wrap_",
                  "_unwrap_")


def name_is_model_like(name: str) -> bool:
    """``model``, ``self.net``, ``netG``, ``teacher_model``, ``resnet`` — not ``model_path``, ``build_model``,
    ``model_state``, ``loss_fn`` or ``criterion_loss``."""
    low = last_segment(name).lower()
    if low.startswith(_VERB_PREFIXES) or low.endswith(_NOT_MODEL_SUFFIXES):
        return False
    return low in _MODEL_NAMES or low.endswith(("model", "_net")) or (low.endswith("net") and len(low) > 3)


def name_says_not_a_model(name: str) -> bool:
    """``model_fn``, ``net_path``, ``build_model``, ``model_cfg``: the name says what it holds is something about a
    model (a function, a path, a configuration), not a model itself."""
    low = last_segment(name).lower()
    return low.startswith(_VERB_PREFIXES) or low.endswith(_NOT_MODEL_SUFFIXES)


# What evaluation data and evaluation code are called: ``val_loader``, ``testset``, ``X_valid``, ``dev_ds``;
# ``validate``, ``evaluate``, ``eval_epoch``, ``run_inference``. One list for every rule that asks.
_EVALUATION_DATA_WORDS = {"val", "valid", "validation", "eval", "evaluation", "test", "testing", "dev", "holdout"}
_EVALUATION_DATA_JOINED = re.compile(
    r"^(?:val|valid|test|eval|dev)(?:loader|loaders|dl|set|sets|data|dataset|ds|iter|batches)$")
_EVALUATION_FUNCTION_WORDS = {"val", "valid", "eval", "test", "testing", "inference"}
_EVALUATION_FUNCTION_PREFIXES = ("validat", "evaluat", "predict", "infer")


def names_evaluation_data(name: Optional[str]) -> bool:
    """A word of ``name`` says it holds evaluation data (``val_loader``, ``testset``, ``devData``), not
    ``interval`` or ``device``."""
    return bool(name) and any(word in _EVALUATION_DATA_WORDS or _EVALUATION_DATA_JOINED.match(word)
                              for word in name_words(name))


def mentions_evaluation_data(expr: Optional[cst.BaseExpression]) -> bool:
    """Some name used in ``expr`` is named for evaluation data (by its last segment: ``self.val_set``)."""
    return expr is not None and any(names_evaluation_data(last_segment(name)) for name in iter_names(expr))


def names_evaluation_function(name: str) -> bool:
    """validate / evaluate / eval_epoch / predict / run_inference / test ... (not pytest's ``test_x``)."""
    if name.startswith(("test_", "Test")):
        return False
    return any(word in _EVALUATION_FUNCTION_WORDS or word.startswith(_EVALUATION_FUNCTION_PREFIXES)
               for word in name_words(name))


def names_prediction_method(name: str) -> bool:
    """``predict`` / ``full_sort_predict`` / ``predict_scores``: a model's method named for running it on inputs to get
    its outputs (its forward pass), not ``evaluate`` (a whole loop) or ``predictor``. Not ``inference(loader)``: a
    library model's batched inference turns gradients off itself often enough (PyG's ``@torch.no_grad() inference``)."""
    return any(word.startswith("predict") and not word.startswith("predictor") for word in name_words(name))


# What the run's configuration is called (``args.lr``, ``cfg.device``, ``hparams``, ``train_args``). Not ``params``:
# it holds a model's parameters as often as settings. One list for every question about configuration.
CONFIG_NAMES = frozenset({"args", "arg", "opt", "opts", "options", "cfg", "cfgs", "config", "conf", "hparams", "hp",
                          "hyperparams", "hyperparameters", "hyp", "settings", "flags"})
_CONFIG_SUFFIXES = ("_args", "_cfg", "_config")


def names_configuration(name: Optional[str]) -> bool:
    """``args``, ``self.cfg``, ``FLAGS``, ``training_args``, ``model_config``: the name (its last segment) holds the
    run's configuration. A private attribute (``self._config``) holds whatever its class keeps: not by name."""
    low = last_segment(name).lower()
    return low in CONFIG_NAMES or (low.endswith(_CONFIG_SUFFIXES) and not low.startswith("_"))


# opt, optim, optimizer, g_opt, opt_d, optG, optimizerD, generator_optimizer (not options/optuna/opts)
_OPTIMIZER_NAME = re.compile(r"^(?:\w*_)?(?:opt|optim|optimizer|optimiser)(?:[A-Z_\d]\w*)?$")


def name_is_optimizer_like(name: Optional[str]) -> bool:
    """``opt``, ``optimizer_d``, ``optG``, ``g_opt``, ``myoptimizer`` — not ``options``, ``opts``, ``optuna``."""
    last = last_segment(name)
    return bool(_OPTIMIZER_NAME.match(last)) or last.lower().endswith(("optimizer", "optimiser"))


def name_is_loader_like(name: Optional[str]) -> bool:
    """``loader``, ``train_loader``, ``valLoader``, ``dl``, ``train_dl``."""
    last = last_segment(name).lower()
    return last.endswith(("loader", "_dl")) or last == "dl"


def name_is_recurrent_like(name: Optional[str]) -> bool:
    """``lstm``, ``self.rnn``, ``gru_cell``, ``encoder_rnn``: a recurrent layer, by the words its kind is spelled with."""
    last = last_segment(name).lower()
    return any(word in last for word in ("rnn", "lstm", "gru"))


def name_is_loss_like(name: Optional[str]) -> bool:
    """``loss``, ``train_loss``, ``self.g_loss``, ``totalloss``: a value named as a loss."""
    last = last_segment(name).lower()
    return "loss" in last.split("_") or last.endswith("loss")


def name_is_criterion_like(name: Optional[str]) -> bool:
    """``criterion``, ``self.loss_fn``, ``loss_function``, ``recon_loss``, ``loss``: a callable named as a loss
    function (its result is a loss)."""
    last = last_segment(name).lower()
    return last in ("criterion", "loss_fn", "loss_func", "loss_function", "lossfn", "loss") or last.endswith("_loss")


def name_is_scheduler_like(name: Optional[str]) -> bool:
    return "sched" in last_segment(name).lower()


def name_is_scaler_like(name: Optional[str]) -> bool:
    return "scaler" in last_segment(name).lower()


def render_name(ctx: FileContext, qualified: str) -> Optional[cst.BaseExpression]:
    """``qualified`` written through the file's imports: ``nn.Upsample`` after ``from torch import nn``."""
    parts = qualified.split(".")
    for cut in range(len(parts), 0, -1):
        local = local_name_for(ctx, ".".join(parts[:cut]))
        if local is not None:
            return cst.parse_expression(".".join([local, *parts[cut:]]))
    return None


# expressions that bind tighter than any operator they may be embedded in
_ATOMS = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float, cst.SimpleString,
          cst.List, cst.Dict, cst.Set, cst.Tuple, cst.ListComp, cst.DictComp, cst.SetComp, cst.GeneratorExp)


def parenthesized(expr: cst.BaseExpression) -> cst.BaseExpression:
    """``expr`` parenthesised unless it binds tighter than any operator it may be embedded in."""
    if expr.lpar or isinstance(expr, _ATOMS):
        return expr
    return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def node_text(ctx: FileContext, node: cst.CSTNode) -> str:
    """The source of ``node`` as written (stripped), for messages."""
    return ctx.module.code_for_node(node).strip()


# What held-out test data is called (not validation data: choosing a model on it is what it is for).
TEST_WORDS = {"test", "testing", "holdout"}


def name_tokens(name: str) -> set[str]:
    """The words of ``name``'s last segment, also without an ``X``/``y`` prefix or a ``set``/``data`` suffix."""
    tokens = set(name_words(last_segment(name)))
    for token in list(tokens):
        if token[:1] in ("x", "y") and len(token) > 1:
            tokens.add(token[1:])  # Xtest, yval
        for suffix in ("set", "data", "df", "ds"):
            if token.endswith(suffix) and len(token) > len(suffix):
                tokens.add(token[: -len(suffix)])  # testset, valdata
    return tokens


def mentions_resume(ctx: FileContext, node: cst.CSTNode) -> bool:
    """The code of ``node`` speaks of resuming (``args.resume``, ``restore_path``): a checkpoint a run continues from."""
    code = ctx.module.code_for_node(node).lower()
    return "resume" in code or "restore" in code


def mentions_test(expr: Optional[cst.BaseExpression]) -> Optional[str]:
    """The first name under ``expr`` that reads as test data (``X_test``, ``testset``), if any."""
    if expr is None:
        return None
    stack: list[cst.CSTNode] = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.Name, cst.Attribute)):
            name = dotted_name(node)
            if name is not None:
                if name_tokens(name) & TEST_WORDS:
                    return name
                continue
        stack.extend(reversed(all_children(node)))
    return None


def within(path: str, prefix: str) -> bool:
    """``path`` is ``prefix`` or one of its submodules."""
    return path == prefix or path.startswith(prefix + ".")
