"""The program model's answers about processes and data: which tests read the rank, which code runs on one rank
only, which modules an expression builds, which data sets live in memory, what names evaluation data."""
from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from analyzers.program.builds import built_module
from analyzers.program.data import dataset_in_memory, random_transforms, sampler_feeds_training
from analyzers.program.flow import subtree
from analyzers.program.library import is_data_loader
from analyzers.program.names import names_evaluation_data, names_evaluation_function, names_prediction_method
from analyzers.program.ranks import depends_on_rank, is_rank_test, rank_guarded
from tests.test_program_meanings import context


def _ifs(ctx) -> list[cst.If]:
    return [n for n in subtree(ctx.module) if isinstance(n, cst.If)]


def _call(ctx, name: str) -> cst.Call:
    return next(n for n in subtree(ctx.module) if isinstance(n, cst.Call)
                and ctx.module.code_for_node(n.func).endswith(name))


# ---- rank guards: decided by where the tested value comes from --------------------------------------------

@pytest.mark.parametrize("test", [
    "dist.get_rank() == 0",
    "torch.distributed.get_rank() != 0",
    "int(os.environ['LOCAL_RANK']) == 0",
    "os.environ.get('RANK', '0') == '0'",
    "accelerator.is_main_process",
    "not trainer.is_global_zero",
    "args.local_rank in [-1, 0]",
])
def test_a_test_of_what_the_libraries_say_the_rank_is_is_a_rank_test(test):
    ctx = context(f"""
        import os
        import torch
        import torch.distributed as dist
        if {test}:
            pass
    """)
    assert is_rank_test(_ifs(ctx)[0].test, ctx)


def test_a_name_assigned_from_the_rank_carries_it_into_the_test():
    ctx = context("""
        import torch.distributed as dist
        ddp_rank = dist.get_rank()
        leader = ddp_rank == 0
        if leader:
            pass
    """)
    assert is_rank_test(_ifs(ctx)[0].test, ctx)


def test_a_helper_of_the_file_that_returns_a_rank_comparison_is_a_rank_test():
    ctx = context("""
        import torch.distributed as dist
        def first_process():
            if not dist.is_initialized():
                return True
            return dist.get_rank() == 0
        if first_process():
            pass
    """)
    assert is_rank_test(_ifs(ctx)[-1].test, ctx)


def test_the_index_spawn_passes_and_the_device_ids_given_to_ddp_are_ranks():
    ctx = context("""
        import torch.multiprocessing as mp
        from torch.nn.parallel import DistributedDataParallel as DDP
        def worker(gpu, cfg):
            model = DDP(net, device_ids=[cfg.device_index])
            if gpu == 0:
                pass
            if cfg.device_index == 0:
                pass
        mp.spawn(worker, nprocs=4, args=(cfg,))
    """)
    first, second = _ifs(ctx)
    assert is_rank_test(first.test, ctx)
    assert is_rank_test(second.test, ctx)


@pytest.mark.parametrize("test", [
    "args.gpu is not None",  # which device, not which process: a single-GPU script has one too
    "use_master_weights",
    "epoch % 10 == 0",
    "ranking_loss > 0",
])
def test_tests_that_only_sound_like_ranks_are_not_rank_tests(test):
    ctx = context(f"""
        use_master_weights = cfg.fp32
        if {test}:
            pass
    """)
    assert not is_rank_test(_ifs(ctx)[-1].test, ctx)


def test_a_value_built_by_a_call_that_takes_the_rank_does_not_depend_on_it():
    """``DDP(net, device_ids=[rank])`` is a model, not a rank; ``f"ckpt_{rank}.pt"`` is a per-rank path."""
    ctx = context("""
        import torch.distributed as dist
        rank = dist.get_rank()
        model = DDP(net, device_ids=[rank])
        path = os.path.join(out, "ckpt_%d.pt" % rank)
    """)
    assert not depends_on_rank(cst.parse_expression("model"), ctx)
    assert depends_on_rank(cst.parse_expression("path"), ctx)


def test_code_under_a_rank_test_or_a_rank_zero_decorator_is_rank_guarded():
    ctx = context("""
        import torch
        import torch.distributed as dist
        from lightning.pytorch.utilities import rank_zero_only
        if dist.get_rank() == 0:
            torch.save(a, "a.pt")
        @rank_zero_only
        def write():
            torch.save(b, "b.pt")
        if args.gpu is not None:
            torch.save(c, "c.pt")
    """)
    saves = [n for n in subtree(ctx.module) if isinstance(n, cst.Call) and ctx.call_name(n) == "torch.save"]
    assert [rank_guarded(s, ctx) for s in saves] == [True, True, False]


# ---- modules an expression builds -------------------------------------------------------------------------

def test_built_module_follows_chains_and_names_and_knows_eval_mode():
    ctx = context("""
        import torch.nn as nn
        import torchvision
        class Net(nn.Module):
            pass
        net = Net().cuda()
        a = net.eval()
        b = torchvision.models.resnet18()
        c = nn.ReLU()
        d = make_something()
    """)
    values = {t.targets[0].target.value: t.value for t in subtree(ctx.module) if isinstance(t, cst.Assign)}
    assert built_module(ctx, values["a"]).eval_mode and built_module(ctx, values["a"]).model
    assert built_module(ctx, values["b"]).model and not built_module(ctx, values["b"]).eval_mode
    assert not built_module(ctx, values["c"]).model  # a module, but no layers worth calling a model
    assert built_module(ctx, values["d"]) is None


# ---- data ------------------------------------------------------------------------------------------------

def test_in_memory_data_sets_come_from_the_library_table_and_lose_it_with_random_transforms():
    ctx = context("""
        import torch
        from torchvision import datasets, transforms
        from torch.utils.data import TensorDataset, DataLoader
        augment = transforms.Compose([transforms.RandomRotation(10), transforms.ToTensor()])
        plain = datasets.MNIST("data", True, transforms.ToTensor())
        augmented = datasets.MNIST("data", train=True, transform=augment)
        tensors = TensorDataset(x, y)
        folder = datasets.ImageFolder("data")
        loader = DataLoader(tensors)
    """)
    verdict = {name: dataset_in_memory(cst.parse_expression(name), ctx)
               for name in ("plain", "augmented", "tensors", "folder")}
    assert verdict == {"plain": True, "augmented": False, "tensors": True, "folder": False}
    assert random_transforms(cst.parse_expression("augment"), ctx) == ["RandomRotation"]
    assert is_data_loader(ctx.call_name(_call(ctx, "DataLoader")))


@pytest.mark.parametrize("name,evaluation", [
    ("val_loader", True), ("testset", True), ("X_valid", True), ("devData", True), ("val2017", True),
    ("interval", False), ("device", False), ("latest_ckpt", False), ("train_loader", False),
])
def test_evaluation_data_is_read_from_the_words_of_a_name(name, evaluation):
    assert names_evaluation_data(name) is evaluation


@pytest.mark.parametrize("name,evaluation", [
    ("validate", True), ("eval_epoch", True), ("run_inference", True), ("predict", True),
    ("test_forward_shape", False), ("train_one_epoch", False),
])
def test_evaluation_functions_are_read_from_their_names(name, evaluation):
    assert names_evaluation_function(name) is evaluation


@pytest.mark.parametrize("name, predicts", [
    ("predict", True), ("full_sort_predict", True), ("predictScores", True), ("inference", False),
    ("predictor", False), ("evaluate", False), ("parameters", False), ("state_dict", False),
])
def test_prediction_methods_are_read_from_their_names(name, predicts):
    assert names_prediction_method(name) is predicts


# ---- accumulators that live for one optimizer step or one call ---------------------------------------------

def _tr104(code: str) -> list:
    from analyzers.engine import analyze_source
    from analyzers.rules import all_rules
    rules = [r for r in all_rules() if r.id == "TR104"]
    result = analyze_source(textwrap.dedent(code), "train.py", rules=rules)
    assert not result.errors, result.errors
    return result.findings


def test_a_list_rebuilt_for_each_optimizer_step_does_not_outlive_the_step():
    assert not _tr104("""
        import torch
        for batch in loader:
            opt.zero_grad()
            chunk_losses = []
            for part in batch.split(4):
                loss = criterion(model(part), part.y)
                chunk_losses.append(loss)
                loss.backward()
            opt.step()
    """)
    # ... while one rebuilt for each epoch keeps every step's graph of the epoch
    assert _tr104("""
        import torch
        for epoch in range(10):
            epoch_losses = []
            for x, y in loader:
                opt.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                opt.step()
                epoch_losses.append(loss)
    """)


def test_terms_gathered_into_the_loss_that_is_returned_are_part_of_it():
    assert not _tr104("""
        import torch
        def compute_loss(model, chunks, use_aux):
            aux_losses = []
            for chunk in chunks:
                out = model(chunk)
                aux_losses.append(out.aux_loss)
            aux = torch.stack(aux_losses).mean() if use_aux else None
            loss = out.loss + 0.1 * aux
            return loss
    """)


def test_a_host_side_random_draw_that_only_decides_a_branch_needs_no_device():
    from analyzers.engine import analyze_source
    from analyzers.rules import all_rules
    rules = [r for r in all_rules() if r.id == "TR701"]
    code = """
        import torch
        import torch.nn as nn
        class Block(nn.Module):
            def forward(self, x):
                if self.training and torch.rand(1) < self.drop_prob:
                    return x
                noise = torch.rand(x.shape)
                return x + noise
        model = Block().cuda()
    """
    findings = analyze_source(textwrap.dedent(code), "block.py", rules=rules).findings
    assert [f.line for f in findings] == [8]  # the noise added to x, not the draw that picks a branch


def test_a_test_of_a_half_precision_kernel_is_not_fp16_training():
    from analyzers.engine import analyze_source
    from analyzers.rules import all_rules
    rules = [r for r in all_rules() if r.id == "TR802"]
    body = """
        import torch
        def {name}():
            x = torch.rand(4, 3).cuda().half().requires_grad_()
            y = layer(x)
            y.sum().backward()
            assert x.grad is not None
    """
    assert not analyze_source(textwrap.dedent(body.format(name="test_layer_half")), "test_layer.py",
                              rules=rules).findings
    assert analyze_source(textwrap.dedent(body.format(name="train_half")), "train.py", rules=rules).findings


def test_detached_copies_gathered_for_logging_beside_the_loss_do_not_cut_it():
    from analyzers.engine import analyze_source
    from analyzers.rules import all_rules
    rules = [r for r in all_rules() if r.id == "TR405"]
    code = """
        import torch
        def compute_loss_q(data):
            q = torch.min(critic_a(data), critic_b(data))
            loss_q = ((q - data["backup"]) ** 2).mean()
            info = dict(QVals=q.detach().numpy())
            return loss_q, info
        def compute_loss_pi(logp, q):
            scale = logp.detach().numpy().mean()
            return torch.mean(scale * logp - q), {}
    """
    findings = analyze_source(textwrap.dedent(code), "sac.py", rules=rules).findings
    assert [f.line for f in findings] == [9]  # the copy that goes back into the loss


def test_a_wrapper_keeps_the_mode_of_the_module_it_wraps():
    ctx = context("""
        import torch.nn as nn
        from transformers import AutoModel
        model = AutoModel.from_pretrained("bert-base-uncased")
        model = nn.DataParallel(model.cuda())
        trained = nn.DataParallel(nn.Linear(2, 2))
    """)
    values = [t.value for t in subtree(ctx.module) if isinstance(t, cst.Assign)]
    assert built_module(ctx, values[1]).eval_mode
    assert not built_module(ctx, values[2]).eval_mode and built_module(ctx, values[2]).model


def test_a_pretrained_model_wrapped_for_several_gpus_is_still_in_eval_mode():
    from analyzers.engine import analyze_source
    from analyzers.rules import all_rules
    rules = [r for r in all_rules() if r.id == "TR201"]
    code = """
        import torch
        import torch.nn as nn
        from transformers import AutoModelForSequenceClassification
        def predict(model_path, batches):
            model = AutoModelForSequenceClassification.from_pretrained(model_path)
            if torch.cuda.is_available():
                model = nn.DataParallel(model.cuda())
            logits = []
            for batch in batches:
                with torch.no_grad():
                    logits.append(model(**batch).logits)
            return logits
    """
    assert not analyze_source(textwrap.dedent(code), "predict.py", rules=rules).findings
    trained = textwrap.dedent(code).replace("AutoModelForSequenceClassification.from_pretrained(model_path)",
                                            "build_classifier(model_path).train()")
    assert analyze_source(trained, "predict.py", rules=rules).findings


def test_modules_saved_in_a_list_are_whole_modules_in_the_checkpoint():
    from analyzers.program.roles import CheckpointWrites, Payload
    ctx = context("""
        import torch
        import torch.nn as nn
        class Encoder(nn.Module):
            pass
        encoder = Encoder().cuda()
        decoder = nn.Linear(4, 4)
        torch.save([encoder, decoder], "autoencoder.pkl")
        torch.save([encoder.state_dict(), decoder.state_dict()], "weights.pt")
    """)
    writes = ctx.facts(CheckpointWrites).writes
    assert [w.payloads for w in writes] == [{Payload.MODULE}, {Payload.TENSORS}]


def test_distributed_loads_of_scheduler_state_or_on_one_rank_do_not_crowd_gpu_0():
    from analyzers.engine import analyze_source
    from analyzers.rules import all_rules
    rules = [r for r in all_rules() if r.id == "TR611"]
    code = """
        import os
        import torch
        import torch.distributed as dist
        from torch.optim.lr_scheduler import LambdaLR
        dist.init_process_group("nccl")
        optimizer = torch.optim.AdamW(model.parameters())
        scheduler = LambdaLR(optimizer, lambda step: 1.0)
        optimizer.load_state_dict(torch.load(os.path.join(args.resume, "optimizer.pt")))
        scheduler.load_state_dict(torch.load(os.path.join(args.resume, "scheduler.pt")))
        if args.local_rank in [-1, 0]:
            model.load_state_dict(torch.load(os.path.join(args.output_dir, "model.bin")))
    """
    findings = analyze_source(textwrap.dedent(code), "run.py", rules=rules).findings
    assert [f.line for f in findings] == [9]  # the optimizer's state holds tensors saved on a GPU


def test_a_validation_split_given_a_deterministic_transform_afterwards_is_not_augmented():
    from analyzers.engine import analyze_source
    from analyzers.rules import all_rules
    rules = [r for r in all_rules() if r.id == "TR960"]
    code = """
        import copy
        from torch.utils.data import random_split
        from torchvision import datasets, transforms
        train_tf = transforms.Compose([transforms.RandomCrop(28, padding=2), transforms.ToTensor()])
        test_tf = transforms.Compose([transforms.ToTensor()])
        full = datasets.MNIST("data", train=True, transform=train_tf)
        train_data, valid_data = random_split(full, [50000, 10000])
    """
    assert analyze_source(textwrap.dedent(code), "nb.py", rules=rules).findings
    fixed = textwrap.dedent(code) + "valid_data = copy.deepcopy(valid_data)\nvalid_data.dataset.transform = test_tf\n"
    assert not analyze_source(fixed, "nb.py", rules=rules).findings
    still_random = textwrap.dedent(code) + "valid_data.dataset.transform = train_tf\n"
    assert analyze_source(still_random, "nb.py", rules=rules).findings


def test_losses_gathered_in_a_forward_and_returned_in_one_branch_are_returned():
    code = """
        import torch
        def forward(self, x, labels, train_exits):
            loss = self.criterion(self.head(x), labels)
            outputs = (self.head(x),)
            exit_losses = []
            for exit_head in self.exits:
                exit_loss = self.criterion(exit_head(x), labels)
                exit_losses.append(exit_loss)
            if train_exits:
                outputs = (sum(exit_losses[:-1]),) + outputs
            else:
                outputs = (loss,) + outputs
            return outputs
    """
    assert not _tr104(code)


def test_outputs_of_one_steps_chunks_gathered_per_step_do_not_outlive_it():
    from analyzers.engine import analyze_source
    from analyzers.rules import all_rules
    rules = [r for r in all_rules() if r.id == "TR510"]
    code = """
        import torch
        for x, y in loader:
            opt.zero_grad()
            outputs = []
            for xc, yc in zip(x.chunk(4), y.chunk(4)):
                out = model(xc)
                outputs.append(out)
                criterion(out, yc).backward()
            opt.step()
            accuracy = (torch.cat(outputs).argmax(1) == y).float().mean()
    """
    assert not analyze_source(textwrap.dedent(code), "train.py", rules=rules).findings
    per_epoch = textwrap.dedent(code).replace("    outputs = []\n", "").replace(
        "for x, y in loader:", "outputs = []\nfor x, y in loader:")
    assert analyze_source(per_epoch, "train.py", rules=rules).findings


def test_a_value_also_written_with_safetensors_is_a_state_dict_whatever_its_name():
    from analyzers.engine import analyze_source
    from analyzers.rules import all_rules
    rules = [r for r in all_rules() if r.id == "TR602"]
    code = """
        import os
        import torch
        from safetensors.torch import save_file
        def save_to_file(file_name, model):
            if os.path.splitext(file_name)[1] == ".safetensors":
                save_file(model, file_name)
            else:
                torch.save(model, file_name)
    """
    assert not analyze_source(textwrap.dedent(code), "extract.py", rules=rules).findings
    plain = textwrap.dedent(code).replace("save_file(model, file_name)", "pass")
    assert analyze_source(plain, "extract.py", rules=rules).findings


def test_exp_of_values_less_their_maximum_cannot_overflow():
    from analyzers.engine import analyze_source
    from analyzers.rules import all_rules
    rules = [r for r in all_rules() if r.id == "TR412"]
    code = """
        import torch
        def log_sum_exp(x):
            x_max = x.data.max()
            return torch.log(torch.sum(torch.exp(x - x_max), 1, keepdim=True)) + x_max
        def unstable(x, shift):
            return torch.log(torch.sum(torch.exp(x - shift), 1))
    """
    findings = analyze_source(textwrap.dedent(code), "boxes.py", rules=rules).findings
    assert [f.line for f in findings] == [7]


def test_a_load_in_the_branch_that_does_not_resume_is_no_resume():
    from analyzers.engine import analyze_source
    from analyzers.rules import all_rules
    rules = [r for r in all_rules() if r.id == "TR610"]
    code = """
        import torch
        net = build_net()
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        if args.resume:
            net.load_weights(args.resume)
        else:
            net.backbone.load_state_dict(torch.load(args.backbone_weights))
        for x, y in loader:
            optimizer.zero_grad()
            criterion(net(x), y).backward()
            optimizer.step()
    """
    assert not analyze_source(textwrap.dedent(code), "train.py", rules=rules).findings
    negated = textwrap.dedent(code).replace("if args.resume:", "if not args.resume:")
    assert analyze_source(negated, "train.py", rules=rules).findings


def test_eval_changes_nothing_in_a_sequential_of_plain_torch_layers_reached_from_a_closure():
    from analyzers.engine import analyze_source
    from analyzers.rules import all_rules
    rules = [r for r in all_rules() if r.id == "TR201"]
    code = """
        import torch
        import torch.nn as nn
        def train(features, labels, layers):
            net = nn.Sequential(nn.Linear(features.shape[-1], 1){extra})
            loss = nn.MSELoss()
            def eval_loss():
                return loss(net(features).view(-1), labels).item()
            for x, y in torch.utils.data.DataLoader(torch.utils.data.TensorDataset(features, labels)):
                loss(net(x), y).backward()
            return eval_loss()
    """
    assert not analyze_source(textwrap.dedent(code.format(extra="")), "sgd.py", rules=rules).findings
    with_dropout = textwrap.dedent(code.format(extra=", nn.Dropout(0.5)"))
    assert analyze_source(with_dropout, "sgd.py", rules=rules).findings


# ---- loaders: where a loader is iterated says what it is for --------------------------------------------------

def _loader_training(code: str) -> dict[str, bool]:
    from analyzers.program.data import loader_of_call

    ctx = context(code)
    loaders = [loader_of_call(call, ctx) for call in subtree(ctx.module) if isinstance(call, cst.Call)]
    return {loader.label: loader.training for loader in loaders if loader is not None}


def test_a_loader_that_a_training_loop_iterates_trains_whatever_it_is_called():
    code = """
        from torch.utils.data import DataLoader
        def fit(model, opt, batches):
            for x, y in batches:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
        def main(model, opt, ds, other):
            dl = DataLoader(ds, batch_size=8)
            fit(model, opt, dl)
            peek = DataLoader(other, batch_size=8)
            for x, y in peek:
                print(x.shape)
    """
    assert _loader_training(code) == {"dl": True, "peek": False}


def test_without_a_training_loop_names_and_shuffling_decide_and_evaluation_names_win():
    code = """
        from torch.utils.data import DataLoader
        train_loader = DataLoader(data, batch_size=8)
        shuffled = DataLoader(data, batch_size=8, shuffle=True)
        val_loader = DataLoader(val_set, batch_size=8, shuffle=True)
        folds = DataLoader(Subset(data, valid_idx), batch_size=8, shuffle=True)
        plain = DataLoader(data, batch_size=8)
    """
    assert _loader_training(code) == {"train_loader": True, "shuffled": True, "val_loader": False, "folds": False,
                                      "plain": False}


@pytest.mark.parametrize("name, configuration", [
    ("args", True), ("self.cfg", True), ("FLAGS", True), ("training_args", True), ("model_config", True),
    ("hparams", True), ("params", False), ("device", False), ("configure", False), ("self._config", False)])
def test_one_answer_to_what_holds_the_configuration(name, configuration):
    from analyzers.program.names import names_configuration

    assert names_configuration(name) is configuration


def test_a_device_read_from_configuration_or_a_run_object_is_a_device_variable():
    from analyzers.program.devices import device_like_name

    assert device_like_name("args.device") and device_like_name("self.cfg.device")
    assert device_like_name("accelerator.device") and device_like_name("train_args.device")
    assert not device_like_name("self.device") and not device_like_name("params.device")


def test_a_scaler_is_known_by_what_built_it():
    from analyzers.program.amp import AmpFacts

    ctx = context("""
        import torch
        gs = torch.cuda.amp.GradScaler()
        def step(loss, opt):
            gs.scale(loss).backward()
            gs.step(opt)
            gs.update()
    """)
    facts = ctx.facts(AmpFacts)
    for call in subtree(ctx.module):
        if isinstance(call, cst.Call):
            facts.note(call, ctx)
    assert [receiver for _, receiver, _ in facts.scaler_steps] == ["gs"] and facts.scaler_updates == {"gs"}


def test_a_test_loader_stays_one_when_a_loop_calls_backward_over_it_for_saliency():
    code = """
        from torch.utils.data import DataLoader
        test_loader = DataLoader(test_set, batch_size=20)
        for x, y in test_loader:
            out = model(x)
            out[0, y[0]].backward()
            show(x.grad)
    """
    assert _loader_training(code) == {"test_loader": False}


def test_a_parameter_a_training_loop_iterates_names_no_loader_of_another_function():
    code = """
        from torch.utils.data import DataLoader
        def train_epoch(data_loader, model, opt):
            for x, y in data_loader:
                model(x).sum().backward()
                opt.step()
        def cache_features(dataset, model):
            data_loader = DataLoader(dataset, batch_size=8)
            return [model(x) for x, _ in data_loader]
    """
    assert _loader_training(code) == {"data_loader": False}


def test_why_a_data_set_holds_evaluation_data():
    from analyzers.program.data import evaluation_data_reason
    ctx = context("""
        a = CIFAR10(root, train=False, transform=t)
        b = Flowers(root, split="val")
        val_set = ImageFolder(valdir, transform=t)
        c = ImageFolder(traindir, transform=t)
        d = Flowers(root, split="train")
    """)
    calls = [n.value for n in subtree(ctx.module) if isinstance(n, cst.Assign)]
    assert [evaluation_data_reason(c, ctx) for c in calls] == [
        "`train=False`", "`split=\"val\"`", "it is assigned to `val_set`", None, None]


def test_the_data_an_expression_reads_and_the_preprocessor_a_call_builds():
    from analyzers.program.data import data_names, preprocessor_of
    ctx = context("""
        import numpy as np
        from sklearn.decomposition import PCA
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler
        a = X_test.values
        b = frame["text"].to_numpy()
        c = X[val_idx]
        d = np.concatenate([X_train, X_holdout])
        s = StandardScaler()
        p = make_pipeline(StandardScaler(), PCA(3))
        m = make_pipeline(StandardScaler(), LogisticRegression())
    """)
    values = {n.targets[0].target.value: n.value for n in subtree(ctx.module) if isinstance(n, cst.Assign)}
    assert [data_names(values[k], ctx) for k in "abcd"] == [["X_test.values"], ["frame"], ["X", "val_idx"],
                                                          ["X_train", "X_holdout"]]
    assert preprocessor_of(values["s"], ctx) == "StandardScaler"
    assert preprocessor_of(values["p"], ctx) == "make_pipeline(StandardScaler, PCA)"
    assert preprocessor_of(values["m"], ctx) is None  # it ends in a model
def _samplers_feeding_training(code: str) -> dict[str, bool]:
    ctx = context(code)
    found = {}
    for node in subtree(ctx.module):
        if isinstance(node, cst.Assign) and isinstance(node.value, cst.Call) and \
                ctx.module.code_for_node(node.value.func).endswith("Sampler"):
            found[node.targets[0].target.value] = sampler_feeds_training(node.value, ctx)
    return found


def test_a_sampler_feeds_training_unless_its_data_or_every_loader_it_orders_is_for_evaluation():
    code = """
        from torch.utils.data import DataLoader, DistributedSampler
        first = DistributedSampler(part_a)
        second = DistributedSampler(part_b)
        third = DistributedSampler(valid_rows)
        train_order = DistributedSampler(rows_c)
        orphan = DistributedSampler(rows)
        loader_a = DataLoader(part_a, sampler=first)
        dev_loader = DataLoader(part_b, sampler=second)
        DataLoader(test_rows, sampler=train_order)
        for epoch in range(2):
            for x, y in loader_a:
                model(x).sum().backward()
    """
    # the second orders only a loader named for held-out data; the third's data is named for evaluation; a sampler
    # named for training feeds it whatever loader takes it; nothing shows where the orphan's batches go
    assert _samplers_feeding_training(code) == {"first": True, "second": False, "third": False, "train_order": True,
                                                "orphan": True}
