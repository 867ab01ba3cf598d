"""TR103 missing-grad-clipping-rnn: recurrent/attention model trained without gradient clipping."""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from analyzers.context import (
    FileContext,
    dotted_name,
    keyword_arg,
    method_name,
    positional_args)
from analyzers.markdown import code_span
from analyzers.program.clipping import clips_gradients
from analyzers.program.library import is_library
from analyzers.program.loops import loop_stack
from analyzers.program.modules import ModuleFacts
from analyzers.program.values import (BACKWARD_METHODS)
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.program.values import optimizer_step as _optimizer_step


_RNN_CLASSES = {"LSTM", "GRU", "RNN", "LSTMCell", "GRUCell", "RNNCell", "Transformer", "TransformerEncoder",
                "TransformerEncoderLayer", "TransformerDecoder", "TransformerDecoderLayer", "MultiheadAttention"}


class MissingGradClippingRNN(Rule):
    id = "TR103"
    source_hint = re.compile(r"backward|\.step\s*\(")  # a training step (the RNN may live in another file)
    slug = "missing-grad-clipping-rnn"
    category = Category.TRAINING
    severity = Severity.MEDIUM
    requires = "torch"
    summary = "recurrent/attention model trained without gradient clipping"
    what = """
        Flags a file that trains, in a loop, a vanilla `nn.RNN`, or a language or translation
        model (a head with one output per vocabulary token) built on `nn.LSTM`/`nn.GRU` or
        `nn.Transformer*`/`nn.MultiheadAttention` — in the file or in a model class of the
        repository it imports — while nothing the file calls clips gradients: no `clip_grad_norm_` /
        `clip_grad_value_` (torch's, accelerate's, Fabric's), no gradient clamped in place, no function of the
        file or of the repository that does either. A library's clipping option (DeepSpeed's
        `gradient_clipping`, Lightning's `gradient_clip_val`) clips the library's own steps, not a torch
        optimizer's `step()` in the file's loop. Words in the text (an unused `--grad_clip` option, a comment)
        clip nothing. A language model is one whose head has one output per vocabulary token, or per token it
        embeds (the `nn.Linear`'s size is its `nn.Embedding`'s, or computed from them). Short-sequence
        classifiers (an LSTM over MNIST rows, a ViT) and L-BFGS training are not flagged. Reported once, on the
        first optimizer step in a loop.
    """
    why = """
        Recurrent networks and transformers are prone to exploding gradients: one bad batch
        produces a huge update and the loss turns into NaN. Clipping the gradient norm (typically
        to 0.5-1.0) is the standard safeguard and costs almost nothing.
    """
    example = """
        self.rnn = nn.LSTM(128, 256)
        ...
        loss.backward()
        optimizer.step()
    """
    fix_example = """
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
    """
    VALID = [
        # a short-sequence LSTM classifier (MNIST rows): clipping is optional there
        """
        import torch
        import torch.nn as nn
        class RNN(nn.Module):
            def __init__(self):
                super().__init__()
                self.lstm = nn.LSTM(28, 128, batch_first=True)
                self.fc = nn.Linear(128, 10)
        model = RNN()
        for images, labels in train_loader:
            loss = criterion(model(images), labels)
            loss.backward()
            optimizer.step()
        """,
        # L-BFGS bounds its own steps with a line search
        """
        import torch
        import torch.nn as nn
        rnn = nn.RNN(1, 51)
        optimizer = torch.optim.LBFGS(rnn.parameters(), lr=0.8)
        for i in range(15):
            optimizer.step(closure)
        """,
        """
        import torch
        import torch.nn as nn
        model = nn.LSTM(10, 20)
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x)[0], y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        """,
        # AMP: unscale then clip
        """
        import torch
        from torch import nn
        from torch.nn.utils import clip_grad_norm_
        enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(512, 8), 6)
        for batch in loader:
            opt.zero_grad()
            scaler.scale(enc(batch).sum()).backward()
            scaler.unscale_(opt)
            clip_grad_norm_(enc.parameters(), 0.5)
            scaler.step(opt)
            scaler.update()
        """,
        # no RNN in this file
        """
        import torch
        model = torch.nn.Linear(10, 2)
        for x, y in loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
        """,
        # an RNN but no training loop (inference only)
        """
        import torch
        rnn = torch.nn.GRU(8, 16)
        with torch.no_grad():
            for x in data:
                out, h = rnn(x)
        """,
        # clipping configured through a variable/option
        """
        import torch
        model = torch.nn.LSTM(4, 4)
        for batch in loader:
            opt.zero_grad()
            model(batch)[0].sum().backward()
            accelerator.clip_grad_value_(model.parameters(), cfg.grad_clip)
            opt.step()
        """,
        # clipped by value, by hand
        """
        import torch
        rnn = torch.nn.RNN(8, 8)
        for x in loader:
            rnn(x)[0].sum().backward()
            for p in rnn.parameters():
                p.grad.data.clamp_(-5, 5)
            opt.step()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn as nn
            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.rnn = nn.LSTM(10, 20, batch_first=True)
                    self.head = nn.Linear(20, vocab_size)
            model = Net()
            for x, y in loader:
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """,
            line=14, message="nn.LSTM",
        ),
        Invalid(
            """
            from torch import nn
            attn = nn.MultiheadAttention(64, 4)
            head = nn.Linear(64, vocab_size)
            for epoch in range(3):
                for x in loader:
                    opt.zero_grad()
                    attn(x, x, x)[0].sum().backward()
                    opt.step()
                    opt.step()
            """,
            line=9, message="nn.MultiheadAttention",
        ),
        # backward in a loop, optimizer stepped elsewhere
        Invalid(
            """
            import torch
            rnn = torch.nn.RNN(8, 8)
            for x in loader:
                rnn(x)[0].sum().backward()
            """,
            line=5, message="nn.RNN",
        ),
        # DeepSpeed's configuration clips the engine's steps; the plain optimizer's branch clips nothing
        Invalid(
            """
            import torch
            rnn = torch.nn.RNN(8, 8)
            config = {"gradient_clipping": 1.0}
            engine = build_engine(rnn, config)
            for x in loader:
                if use_engine:
                    engine.backward(rnn(x)[0].sum())
                    engine.step()
                else:
                    rnn(x)[0].sum().backward()
                    opt.step()
            """,
            line=12, message="nn.RNN",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.built: dict[str, str] = {}  # feature -> what was built ("nn.RNN", "nn.Transformer")
        self.project_classes: set[str] = set()  # model classes of this repository built here
        self.vocab_output = False
        self.first_step: Optional[cst.Call] = None
        self.first_backward: Optional[cst.Call] = None
        self.line_search = False  # an L-BFGS optimizer is built here

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = method_name(node)
        if name == "LBFGS":  # torch.optim.LBFGS, or a library's: a line-search optimizer
            self.line_search = True
            return
        if name in _RNN_CLASSES or name == "Linear":
            qualified = ctx.call_name(node) or ""
            if qualified.startswith("torch.nn."):
                if name == "Linear":
                    positional = positional_args(node)
                    out = keyword_arg(node, "out_features")
                    size = out.value if out is not None else (positional[1].value if len(positional) > 1 else None)
                    self.vocab_output |= any(w in (dotted_name(size) or "").lower() for w in _VOCABULARY_WORDS)
                else:
                    feature = "vanilla-rnn" if name in ("RNN", "RNNCell") else \
                        "transformer" if name not in ("LSTM", "GRU", "LSTMCell", "GRUCell") else "recurrent"
                    self.built.setdefault(feature, f"nn.{name}")
            return
        if name is not None and name[:1].isupper() and isinstance(node.func, (cst.Name, cst.Attribute)):
            qualified = ctx.call_name(node)
            if not is_library(qualified):
                self.project_classes.add(dotted_name(node.func) or name)
            return
        if name == "step":
            if self.first_step is None and ctx.loops and loop_stack(ctx) and _optimizer_step(node, ctx):
                self.first_step = node
        elif name in BACKWARD_METHODS:
            if self.first_backward is None and ctx.loops and loop_stack(ctx):
                self.first_backward = node

    def end_file(self, ctx: FileContext) -> None:
        target = self.first_step or self.first_backward
        if target is None:
            return
        if self.line_search or clips_gradients(ctx, own_optimizer_step=target is self.first_step):
            return  # clipped already; or L-BFGS, whose line search bounds its own steps
        built = dict(self.built)
        vocab_output = self.vocab_output
        facts = ctx.facts(ModuleFacts)
        for cls in sorted(self.project_classes):  # the model may be defined in model.py beside this script
            features = facts.features(cls) or set()
            for feature in ("vanilla-rnn", "transformer", "recurrent"):
                if feature in features:
                    built.setdefault(feature, cls)
            vocab_output |= "vocab-output" in features
        # Exploding gradients are a real risk for vanilla RNNs, transformers and recurrent language models
        # (long sequences, one logit per token); a short-sequence LSTM/GRU classifier rarely needs clipping.
        if "vanilla-rnn" in built:
            what, kind = built["vanilla-rnn"], "a vanilla RNN"
        elif "transformer" in built and vocab_output:
            what, kind = built["transformer"], "a transformer language or translation model"
        elif "recurrent" in built and vocab_output:
            what, kind = built["recurrent"], "a recurrent language model"
        else:
            return
        self.report(target, (f"this file trains {kind} ({code_span(what)}) but never clips gradients: vanilla RNNs, "
                             f"recurrent language models and transformers are prone to exploding gradients; call "
                             f"torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) before the optimizer step"))


_VOCABULARY_WORDS = ("vocab", "ntoken", "n_token", "num_token")
