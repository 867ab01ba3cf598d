"""What a training loop iterates is data, and which optimizers keep float32 master weights (analyzers/program)."""
from __future__ import annotations

import textwrap

import libcst as cst

from analyzers.context import FileContext
from analyzers.engine import _Walker
from analyzers.program import library
from analyzers.program.flow import subtree
from analyzers.program.library import Does
from analyzers.program.loops import batch_of_training_loop


def context(code: str) -> FileContext:
    source = textwrap.dedent(code)
    module = cst.parse_module(source)
    ctx = FileContext("example.py", source, module)
    _Walker(ctx, [], lambda rule, exc: None).walk(module)
    return ctx


def cast_receivers(ctx: FileContext) -> dict[str, bool]:
    """Receiver of each ``.half()`` -> is it a batch of a training loop."""
    return {node.func.value.value: batch_of_training_loop(node.func.value, ctx) for node in subtree(ctx.module)
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "half"
            and isinstance(node.func.value, cst.Name)}


def test_the_items_a_training_loop_iterates_are_batches_not_the_model():
    ctx = context("""
        def fit(model, loader, opt):
            model.half()
            for step, (tokens, targets) in enumerate(loader):
                tokens.half()
                loss = model(tokens, targets)
                loss.backward()
                opt.step()
        def score(net, batches):
            for inputs in batches:
                inputs.half()
                net(inputs)
        def cast_all(members, loader):
            for x in loader:
                for member in members:
                    member.half()
                    member(x).sum().backward()
    """)
    assert cast_receivers(ctx) == {
        "model": False,  # not bound by a loop
        "tokens": True,  # an item of the loop that trains
        "inputs": False,  # that loop only evaluates
        "member": False,  # the loop calls it: it iterates models
    }


def test_master_weight_optimizers_are_known_by_the_table():
    assert library.does("apex.fp16_utils.FP16_Optimizer", Does.KEEPS_FP32_MASTER_WEIGHTS)
    assert library.does("deepspeed.initialize", Does.KEEPS_FP32_MASTER_WEIGHTS)
    assert not library.does("torch.optim.Adam", Does.KEEPS_FP32_MASTER_WEIGHTS)
    assert "FP16_Optimizer" in library.MASTER_WEIGHTS_LAST_NAMES


def test_a_value_read_only_as_a_slice_bound_or_python_number_stays_on_the_host():
    from analyzers.program.flow import read_only_as_host_scalar
    ctx = context("""
        def crop(images, size):
            top = draw()
            steps = draw()
            picked = draw()
            unused = draw()
            for _ in range(int(steps)):
                images = images[:, top : top + size]
            return images[picked]
    """)
    fn = next(n for n in subtree(ctx.module) if isinstance(n, cst.FunctionDef))
    assert read_only_as_host_scalar(ctx, fn, "top")  # slice bounds, through arithmetic
    assert read_only_as_host_scalar(ctx, fn, "steps")  # int(...)
    assert not read_only_as_host_scalar(ctx, fn, "picked")  # an index tensor: the device reads it
    assert not read_only_as_host_scalar(ctx, fn, "unused")  # never read: nothing to say


def test_a_name_picked_from_a_registry_of_classes_holds_a_class():
    from analyzers.program.values import names_a_class
    ctx = context("""
        from zoo import GCN, GraphSAGE
        import torch.nn as nn
        class Local(nn.Module):
            pass
        ARCHITECTURES = {"gcn": GCN, "sage": GraphSAGE, "local": Local}
        TRAINED = [first_net, second_net]
        def run(name, i):
            Model = ARCHITECTURES[name]
            model = Model(3)
            chosen = TRAINED[i]
            chosen(3)
            model(3)
    """)
    called = {n.func.value: names_a_class(ctx, n.func) for n in subtree(ctx.module)
              if isinstance(n, cst.Call) and isinstance(n.func, cst.Name)}
    assert called == {"Model": True, "chosen": False, "model": False}



def test_the_names_a_value_passed_through_are_its_aliases():
    from analyzers.program.values import alias_names
    ctx = context("""
        model = build_model(config)
        model.eval()
        runner = model
        served = runner
        fresh = build_model(config)
    """)
    assert alias_names(ctx, cst.Name("served")) == ["runner", "model"]  # model.eval() covers it
    assert alias_names(ctx, cst.Name("fresh")) == []


def test_an_implicit_load_beside_an_explicit_unrestricted_one_of_the_same_file_is_that_decision():
    from analyzers.program.roles import unrestricted_load_beside
    ctx = context("""
        import torch
        def per_version(f):
            if torch.__version__ < "2.6":
                return torch.load(f)
            return torch.load(f, weights_only=False)
        def two_files(a, b):
            first = torch.load(a)
            return first, torch.load(b, weights_only=False)
    """)
    implicit = [n for n in subtree(ctx.module) if isinstance(n, cst.Call) and ctx.call_name(n) == "torch.load"
                and not any(arg.keyword is not None for arg in n.args)]
    assert [unrestricted_load_beside(ctx, call) for call in implicit] == [True, False]


def test_a_probability_zeroed_outside_training_wherever_it_comes_from():
    from analyzers.program.state import zero_unless_training
    ctx = context("""
        class Block:
            def forward(self, x):
                if not self.training:
                    p = 0.0
                else:
                    p = self.rate
                q = self.rate if self.training else 0
                return self.helper(x, p), self.helper_always(x, self.rate), q
            def helper(self, x, rate):
                return drop(x, rate)
            def helper_always(self, x, rate):
                return drop(x, rate)
    """)
    functions = {n.name.value: n for n in subtree(ctx.module) if isinstance(n, cst.FunctionDef)}
    forward = functions["forward"]
    assert zero_unless_training(ctx, cst.Name("p"), forward)
    assert zero_unless_training(ctx, cst.Name("q"), forward)
    assert zero_unless_training(ctx, cst.Name("rate"), functions["helper"])  # through its one call site
    assert not zero_unless_training(ctx, cst.Name("rate"), functions["helper_always"])


def test_a_call_handed_a_model_acts_on_it_and_is_no_forward_pass():
    from analyzers.program.values import hands_a_model
    ctx = context("""
        import torch.nn as nn
        net = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        accelerator.unwrap_model(unet)
        helper.wrap(net)
        model(images)
        decoder(encoder(images))
        self.model(self.inputs)
    """)
    handed = {ctx.module.code_for_node(n.func): hands_a_model(ctx, n) for n in subtree(ctx.module)
              if isinstance(n, cst.Call) and not ctx.module.code_for_node(n.func).startswith("nn.")}
    assert handed == {"accelerator.unwrap_model": True, "helper.wrap": True, "model": False, "decoder": False,
                      "encoder": False, "self.model": False}


def test_from_pretrained_of_a_tokenizer_config_or_scheduler_builds_no_module():
    from analyzers.program.builds import built_module
    ctx = context("""
        import transformers
        from transformers import AutoModel, AutoTokenizer, BertTokenizerFast, AutoConfig
        from diffusers import DDPMScheduler
        a = AutoModel.from_pretrained(name)
        b = AutoTokenizer.from_pretrained(name)
        c = BertTokenizerFast.from_pretrained(name)
        d = AutoConfig.from_pretrained(name)
        e = DDPMScheduler.from_pretrained(name)
        f = transformers.AutoModelForCausalLM.from_pretrained(name)
        g = transformers.AutoTokenizer.from_pretrained(name)
    """)
    built = {n.targets[0].target.value: built_module(ctx, n.value) is not None for n in subtree(ctx.module)
             if isinstance(n, cst.Assign)}
    assert built == {"a": True, "b": False, "c": False, "d": False, "e": False, "f": True, "g": False}
    assert library.pretrained_gives_no_module("transformers.AutoTokenizer")
    assert all(doc.startswith("https://") for doc in library.PRETRAINED_NOT_MODULES.values())


def test_branches_on_different_values_of_one_setting_never_run_together():
    from analyzers.program.flow import exclusive_branches
    ctx = context("""
        if args.mode == "freeze":
            freeze()
        if args.mode == "finetune":
            unfreeze()
        if args.other == "x":
            other()
        for phase in ("train", "val"):
            if phase == "train":
                train_phase()
            if phase == "val":
                val_phase()
    """)
    at = {n.func.value: n for n in subtree(ctx.module) if isinstance(n, cst.Call) and isinstance(n.func, cst.Name)}
    assert exclusive_branches(ctx, at["freeze"], at["unfreeze"])
    assert not exclusive_branches(ctx, at["freeze"], at["other"])  # another setting
    assert not exclusive_branches(ctx, at["train_phase"], at["val_phase"])  # the loop changes it


def test_arms_of_one_branch_never_run_together_and_what_follows_it_runs_with_either():
    from analyzers.program.flow import enclosing_block, exclusive_branches, in_different_arms
    ctx = context("""
        if use_fast_kernels():
            fast()
        elif legacy:
            legacy_path()
        else:
            slow()
        after()
        try:
            attempt()
        except RuntimeError:
            fallback()
        match backend:
            case "gpu":
                on_gpu()
            case _:
                on_cpu()
        if ready:
            first()
            second()
    """)
    at = {n.func.value: n for n in subtree(ctx.module) if isinstance(n, cst.Call) and isinstance(n.func, cst.Name)}
    for one, other in (("fast", "legacy_path"), ("fast", "slow"), ("legacy_path", "slow"), ("attempt", "fallback"),
                       ("on_gpu", "on_cpu")):
        assert in_different_arms(ctx, at[one], at[other]) and in_different_arms(ctx, at[other], at[one])
        assert exclusive_branches(ctx, at[one], at[other])
    assert not in_different_arms(ctx, at["use_fast_kernels"], at["slow"])  # the test runs whichever arm follows
    assert not in_different_arms(ctx, at["fast"], at["after"]) and not in_different_arms(ctx, at["first"], at["second"])
    assert enclosing_block(ctx, at["first"]) is enclosing_block(ctx, at["second"])
    assert isinstance(enclosing_block(ctx, at["after"]), cst.Module)


def test_the_name_a_call_is_bound_to_directly_or_through_methods_called_on_its_result():
    from analyzers.program.flow import assigned_name
    ctx = context("""
        net = Decoder()
        half_net = Decoder().to("cuda").half()
        print(Decoder())
    """)
    calls = [n for n in subtree(ctx.module) if isinstance(n, cst.Call) and isinstance(n.func, cst.Name)
             and n.func.value == "Decoder"]
    assert [assigned_name(c, ctx) for c in calls] == ["net", None, None]
    assert [assigned_name(c, ctx, chained=True) for c in calls] == ["net", "half_net", None]


def test_torch_operations_and_counts_of_matches_are_read_from_the_call_not_its_spelling():
    from analyzers.program.values import counts_matches, tensor_operation_operand
    ctx = context("""
        import math
        import numpy as np
        import torch as T
        a = T.exp(logits)
        b = logits.exp()
        c = math.exp(rate)
        d = np.exp(rate)
        e = (pred == labels).sum().cpu()
        f = T.sum(pred.eq(labels))
        g = pred.eq(labels).float().sum()
        h = (pred == labels).sum(dtype=T.float32)
        i = T.count_nonzero(pred != labels)
    """)
    values = {n.targets[0].target.value: n.value for n in subtree(ctx.module) if isinstance(n, cst.Assign)}
    operands = {k: tensor_operation_operand(v, ctx, "exp") for k, v in values.items() if k in "abcd"}
    assert [k for k, v in operands.items() if v is not None] == ["a", "b"]
    assert all(operands[k].value == "logits" for k in "ab")
    assert [k for k, v in values.items() if counts_matches(v, ctx)] == ["e", "f", "i"]


def test_a_device_chosen_between_cuda_and_the_cpu_when_the_script_runs():
    from analyzers.program.devices import chooses_cuda_or_cpu
    ctx = context("""
        import torch
        a = torch.device("cuda" if opts.gpu else "cpu")
        b = "cuda:0" if use_gpu else "cpu"
        c = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        d = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
        e = torch.device("cuda")
        f = "cuda" if fast else "mps"
        g = torch.device("cpu")
    """)
    values = {n.targets[0].target.value: n.value for n in subtree(ctx.module) if isinstance(n, cst.Assign)}
    assert [k for k, v in values.items() if chooses_cuda_or_cpu(v, ctx)] == ["a", "b", "c", "d"]


def test_why_a_value_is_a_zero_dim_tensor():
    from analyzers.program.values import zero_dim_origin
    ctx = context("""
        total = criterion(out, y)
        recon = self.recon_loss(out, y)
        mass = weights.sum()
        avg = weights.mean(dim=1)
        g_loss = adversarial(out)
        other = model(x)
    """)
    names = [n.targets[0].target for n in subtree(ctx.module) if isinstance(n, cst.Assign)]
    assert {n.value: zero_dim_origin(n, ctx) for n in names} == {
        "total": "a loss", "recon": "a loss", "mass": "a full reduction (`.sum()`)", "avg": None, "g_loss": "a loss",
        "other": None}


def test_a_fresh_model_is_named_by_its_constructor_and_a_helpers_result_is_not():
    from analyzers.program.values import fresh_model_constructor
    ctx = context("""
        import torch
        import torchvision
        net = Classifier(10).cuda()
        backbone = torchvision.models.resnet18(weights=None)
        wrapped = torch.nn.DataParallel(Classifier(10))
        helped = build_model(cfg)
        opt = torch.optim.SGD(params, lr=0.1)
    """)
    names = {n.targets[0].target.value: n.targets[0].target for n in subtree(ctx.module) if isinstance(n, cst.Assign)}
    assert {k: fresh_model_constructor(v, ctx) for k, v in names.items()} == {
        "net": "Classifier", "backbone": "torchvision.models.resnet18", "wrapped": "Classifier", "helped": None,
        "opt": None}


def test_what_builds_a_module_or_a_parameter():
    from analyzers.program.builds import module_kinds, module_or_parameter
    ctx = context("""
        import copy
        import timm
        import torch
        from torch import nn
        from blocks import ResidualBlock, Mixer


        class Local(nn.Module):
            pass


        layer = nn.Linear(4, 4)
        a = layer
        b = nn.Parameter(torch.zeros(3))
        c = Local()
        d = ResidualBlock(8)
        e = Mixer(8)
        f = copy.deepcopy(layer)
        g = timm.create_model("resnet18")
        h = torch.zeros(3)
    """)
    values = {n.targets[0].target.value: n.value for n in subtree(ctx.module)
              if isinstance(n, cst.Assign) and n.targets[0].target.value != "layer"}
    assert {k: module_or_parameter(v, ctx) for k, v in values.items()} == {
        "a": "module", "b": "parameter", "c": "module", "d": "module", "e": None, "f": "module", "g": "module",
        "h": None}
    assert module_kinds([values["a"], values["b"], values["h"]], ctx) == {"module", "parameter", None}


def test_which_built_modules_hold_nothing_to_register():
    """An activation, a pooling or padding layer, and a class of the file whose ``__init__`` keeps only constants
    hold no parameter, buffer or train/eval switch; a layer with weights, a dropout, a class that reads
    ``self.training``, one without its own ``__init__`` or one from another file may."""
    from analyzers.program.builds import registered_kind, stateless_module
    ctx = context("""
        import torch
        from torch import nn
        from blocks import Swish


        class Scale(nn.Module):
            def __init__(self, factor=2.0):
                super().__init__()
                self.factor = 2.0
                self.mode = ("a", -1)

            def forward(self, x):
                return x * self.factor


        class Noisy(nn.Module):
            def __init__(self):
                super().__init__()

            def forward(self, x):
                return x + torch.randn_like(x) if self.training else x


        class Bare(nn.Module):
            pass


        class Holds(nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner


        relu = nn.ReLU(inplace=True)
        a = relu
        b = nn.MaxPool2d(2)
        c = nn.ZeroPad2d(1)
        d = Scale()
        e = nn.Linear(2, 2)
        f = nn.Dropout(0.5)
        g = nn.PReLU()
        h = Noisy()
        i = Bare()
        j = Holds(nn.Linear(2, 2))
        k = Swish()
        l = nn.BatchNorm1d(4)
    """)
    values = {n.targets[0].target.value: n.value for n in subtree(ctx.module)
              if isinstance(n, cst.Assign) and isinstance(n.targets[0].target, cst.Name)
              and n.targets[0].target.value != "relu"}
    assert sorted(k for k, v in values.items() if stateless_module(v, ctx)) == ["a", "b", "c", "d"]
    assert registered_kind(values["b"], ctx) == "stateless" and registered_kind(values["e"], ctx) == "module"


def test_a_module_built_from_stateless_layers_and_the_sizes_it_is_given_holds_nothing():
    """A class whose ``__init__`` keeps a size it is given (used only in arithmetic) and a pooling layer holds
    nothing to register, and so does a class that keeps such a class; a size it calls, hands on or compares with
    nothing but keeps as a module, or a layer with weights beside, may hold something."""
    from analyzers.program.builds import stateless_module
    ctx = context("""
        from torch import nn


        class Smooth(nn.Module):
            def __init__(self, width, step):
                super(Smooth, self).__init__()
                self.width = width
                self.pool = nn.AvgPool1d(kernel_size=width, stride=step)

            def forward(self, x):
                pad = (self.width - 1) // 2
                return self.pool(x[:, :, pad:]) if -self.width < 0 else x


        class Split(nn.Module):
            def __init__(self, width):
                super().__init__()
                self.smooth = Smooth(width, 1)

            def forward(self, x):
                trend = self.smooth(x)
                return x - trend, trend


        class Calls(nn.Module):
            def __init__(self, act):
                super().__init__()
                self.act = act

            def forward(self, x):
                return self.act(x)


        class HandsOn(nn.Module):
            def __init__(self, block):
                super().__init__()
                self.block = block

            def forward(self, x):
                return run(self.block, x) + 1


        class Weighted(nn.Module):
            def __init__(self, width):
                super().__init__()
                self.smooth = Smooth(width, 1)
                self.proj = nn.Linear(width, 1)


        class Loop(nn.Module):
            def __init__(self):
                super().__init__()
                self.again = Loop()


        a = Smooth(5, 1)
        b = Split(3)
        c = Calls(nn.ReLU())
        d = HandsOn(nn.Linear(2, 2))
        e = Weighted(4)
        f = Loop()
    """)
    values = {n.targets[0].target.value: n.value for n in subtree(ctx.module)
              if isinstance(n, cst.Assign) and isinstance(n.targets[0].target, cst.Name)}
    assert sorted(k for k, v in values.items() if stateless_module(v, ctx)) == ["a", "b"]


def test_the_name_a_computation_from_a_new_tensor_lands_in_and_a_modules_embedding_tables():
    from analyzers.program.devices import embedding_attributes
    from analyzers.program.flow import computed_into
    ctx = context("""
        import torch
        from torch import nn
        theta = 1.0 / (base ** (torch.arange(0, d, 2).float() / d))
        print(torch.ones(3))


        class Tiny(nn.Module):
            def __init__(self):
                super().__init__()
                self.tokens = nn.Embedding(100, 8)
                self.stack = nn.ModuleDict(dict(positions=nn.Embedding(16, 8), head=nn.Linear(8, 2)))
                self.out = nn.Linear(8, 2)
    """)
    factories = [n for n in subtree(ctx.module) if isinstance(n, cst.Call) and ctx.call_name(n) in (
        "torch.arange", "torch.ones")]
    assert [computed_into(c, ctx) for c in factories] == ["theta", None]
    cls = next(n for n in subtree(ctx.module) if isinstance(n, cst.ClassDef))
    assert embedding_attributes(cls, ctx) == {"self.tokens", "self.stack.positions"}


def test_what_a_method_does_includes_the_helpers_it_delegates_to():
    from analyzers.program.flow import reaches_through_own_methods
    ctx = context("""
        class Table:
            def __init__(self, n):
                self.build(n)
            def build(self, n):
                self.fill(n)
            def fill(self, n):
                mark(n)
            def other(self):
                self.unrelated()
            def unrelated(self):
                pass
    """)
    cls = next(n for n in subtree(ctx.module) if isinstance(n, cst.ClassDef))
    methods = {m.name.value: m for m in cls.body.body}
    marks = lambda node: isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "mark"
    assert reaches_through_own_methods(cls, methods["__init__"], marks)  # two calls deep
    assert not reaches_through_own_methods(cls, methods["__init__"], marks, depth=1)
    assert not reaches_through_own_methods(cls, methods["other"], marks)


def test_the_names_the_optimizers_are_given():
    from analyzers.program.values import optimized_names
    ctx = context("""
        import torch
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.Adam(params, lr=1e-3)
        opt_d = torch.optim.SGD(discriminator.parameters())
    """)
    names = optimized_names(ctx)
    assert "model.parameters" in names and "discriminator" in names and "frozen" not in names
    assert optimized_names(context("import torch\nopt = torch.optim.Adam(groups)\n")) is None  # unknown
    assert optimized_names(context("import torch\nx = 1\n")) is None  # no optimizer here


def test_code_under_a_negative_cuda_test_runs_off_cuda_only():
    from analyzers.program.state import runs_only_off_cuda
    ctx = context("""
        def forward(x):
            on_gpu = x.is_cuda
            if on_gpu:
                a = make()
            else:
                b = make()
            if not x.is_cuda:
                c = make()
            d = make()
    """)
    made = {n.targets[0].target.value: runs_only_off_cuda(ctx, n) for n in subtree(ctx.module)
            if isinstance(n, cst.Assign) and isinstance(n.value, cst.Call)}
    assert made == {"a": False, "b": True, "c": True, "d": False}


def test_espnet_inference_wrappers_come_back_in_eval_mode():
    from analyzers.program.builds import built_module
    ctx = context("""
        from espnet2.bin.asr_inference import Speech2Text
        recognizer = Speech2Text(asr_model_file=path, device="cuda")
    """)
    assign = next(n for n in subtree(ctx.module) if isinstance(n, cst.Assign))
    built = built_module(ctx, assign.value)
    assert built is not None and built.eval_mode


def test_functions_that_ready_or_unwrap_a_model_are_not_one():
    from analyzers.program.names import name_is_model_like
    for name in ("self.prepare_model", "accelerator.unwrap_model", "self._wrap_model", "wrap_model"):
        assert not name_is_model_like(name), name
    for name in ("model", "wrapped_model", "prepared_model", "self.model"):
        assert name_is_model_like(name), name
