"""TR201 missing-eval-mode: model run for validation/inference without model.eval()."""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst
from analyzers.program.values import changes_in_eval
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Valid
from analyzers.program.evaluation import ModelCall as _ModelCall
from analyzers.rules.inference._inference import InferencePathRule as _InferencePathRule


class MissingEvalMode(_InferencePathRule):
    id = "TR201"
    slug = "missing-eval-mode"
    category = Category.INFERENCE
    severity = Severity.HIGH
    summary = "model run for validation/inference without model.eval()"
    what = """
        Flags a model that is called in a validation, evaluation, test or prediction path (a
        function named like `validate`, `evaluate`, `predict`, `infer`, `test`, or a loop over a
        `val`/`test`/`eval`/`dev` loader; also, whatever the names, a loop over data that keeps only
        the numbers of each forward pass while nothing around it trains, or a module's own method
        that calls `self.eval()`) when no `model.eval()` (or `model.train(False)`) comes
        before it in that function, in its class, or before the call sites in this file. Lightning
        `LightningModule` hooks are skipped: Lightning switches modes itself. A model the program
        model knows to be mode-free is skipped: its class (found in this repository, through its
        submodules and bases) or its torch.nn layers hold no dropout, no batch norm with running
        statistics (InstanceNorm keeps none by default) and no code reading `self.training`; a
        helper's parameter is answered by what every call in the file passes (a lambda, alone or
        unpacked from a tuple, is no module). eval() changes
        nothing there. A lambda that is handed the model (`model_fn=lambda model, x: model(x)`)
        runs where it is called, on whatever model its caller gives: not an evaluation path of
        its own. A helper whose model only code in other files hands it (no call in this file fills
        that parameter, itself or through its own caller's) is reported one step lower: those
        callers may switch it to eval mode first. A model built by a factory function (`net =
        build_net()`, here or in another module of the repository) is judged by the class it returns;
        the attribute of a helper object (`enc.backbone`) whose class in this file only ever assigns it
        a model built in eval mode (`from_pretrained`) is in eval mode.
    """
    why = """
        In training mode dropout keeps dropping activations and batch-norm normalizes with the
        statistics of the current batch (and keeps updating its running averages with validation
        data). Metrics become noisy and too pessimistic, predictions depend on the batch they come
        in, and the running statistics are silently corrupted by evaluation data.
    """
    example = """
        def validate(model, loader):
            with torch.no_grad():
                for x, y in loader:
                    loss = criterion(model(x), y)
    """
    fix_example = """
        def validate(model, loader):
            model.eval()
            with torch.no_grad():
                for x, y in loader:
                    loss = criterion(model(x), y)
            model.train()
    """
    VALID = [
        # every part of a model kept as a mapping switched in a comprehension over its keys
        "import torch\nfrom networks import build_model\ndef main(args):\n    model = build_model(args)\n"
        "    for epoch in range(args.epochs):\n        _ = [model[key].train() for key in model]\n"
        "        for x in train_loader:\n            model.decoder(model.encoder(x)).mean().backward()\n"
        "        _ = [model[key].eval() for key in model]\n        with torch.no_grad():\n"
        "            for x in val_loader:\n                y = model.decoder(model.encoder(x))\n",
        # switched after a method that returns the module itself
        "import torch\nimport torch.nn as nn\nclass Head(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.drop = nn.Dropout(0.2)\n    def forward(self, x):\n        return self.drop(x)\n"
        "model = nn.DataParallel(Head())\nmodel.cuda().eval()\nwith torch.no_grad():\n    for x in test_loader:\n"
        "        y = model(x)\n",
        # a single nn.Linear built in the file: nothing behaves differently in eval mode
        "import torch\nimport torch.nn as nn\nmodel = nn.Linear(784, 10)\n"
        "def test():\n    with torch.no_grad():\n        for x, y in test_loader:\n            out = model(x)\n",
        # nothing in the model behaves differently in eval mode (no dropout, no BatchNorm)
        "import torch\nimport torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.fc = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))\n"
        "    def forward(self, x):\n        return self.fc(x)\nnet = Net().to(device)\n"
        "with torch.no_grad():\n    for x, y in val_loader:\n        pred = net(x)\n",
        # batch norm built without running statistics normalizes with the batch's statistics in both modes
        Valid("import torch\nimport torch.nn as nn\nclass Scaler(nn.Module):\n    def __init__(self):\n"
              "        super().__init__()\n        self.norm = nn.BatchNorm1d(8, track_running_stats=False)\n"
              "    def forward(self, x):\n        return self.norm(x)\nscaler = Scaler()\n"
              "def validate(model, loader):\n    with torch.no_grad():\n        for x in loader:\n            model(x)\n"
              "validate(scaler, val_loader)\n"),
        # instance norm keeps no running statistics by default
        Valid("import torch\nimport torch.nn as nn\nclass Styler(nn.Module):\n    def __init__(self):\n"
              "        super().__init__()\n        self.norm = nn.InstanceNorm2d(3)\n"
              "    def forward(self, x):\n        return self.norm(x)\nstyler = Styler()\n"
              "with torch.no_grad():\n    for x in val_loader:\n        styler(x)\n"),
        # a mode-free model, restored from the file the same program saves it to: the same model comes back
        Valid("import torch\nimport torch.nn as nn\nclass Plain(nn.Module):\n    def __init__(self):\n"
              "        super().__init__()\n        self.body = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())\n"
              "    def forward(self, x):\n        return self.body(x)\nnet = Plain().cuda()\ntry:\n"
              "    net = torch.load('plain.pkl')\nexcept FileNotFoundError:\n    pass\n"
              "for x, y in train_loader:\n    step(net, x, y)\n    torch.save(net, 'plain.pkl')\n"
              "with torch.no_grad():\n    for x, y in test_loader:\n        out = net(x)\n"),
        # eval() first
        "import torch\ndef validate(model, loader):\n    model.eval()\n    with torch.no_grad():\n"
        "        for x, y in loader:\n            out = model(x)\n",
        # train(False)
        "import torch\ndef evaluate(model, loader):\n    model.train(False)\n    with torch.no_grad():\n"
        "        for x in loader:\n            model(x)\n",
        # eval() inside the no_grad block
        "import torch\ndef predict(model, x):\n    with torch.no_grad():\n        model.eval()\n        return model(x)\n",
        # eval done by the caller in this file
        "import torch\ndef evaluate(model, loader):\n    with torch.no_grad():\n        return [model(x) for x in loader]\n"
        "def main(model, loader):\n    model.eval()\n    evaluate(model, loader)\n",
        # Lightning sets eval mode for validation_step / test_step / predict_step
        "import torch\nimport lightning as L\nclass Lit(L.LightningModule):\n    def validation_step(self, batch, i):\n"
        "        x, y = batch\n        return self.model(x)\n    def test_step(self, batch, i):\n        return self.model(batch[0])\n"
        "    def predict_step(self, batch, i):\n        return self.model(batch)\n",
        # pytest tests that only run a model
        "import torch\ndef test_forward_shape():\n    model = torch.nn.Linear(2, 3)\n    assert model(torch.zeros(1, 2)).shape == (1, 3)\n",
        # self.eval() of an enclosing module covers self.model
        "import torch\nimport torch.nn as nn\nclass Wrapper(nn.Module):\n    def evaluate(self, loader):\n        self.eval()\n"
        "        with torch.no_grad():\n            for x in loader:\n                self.model(x)\n",
        # eval() in __init__ of a predictor class
        "import torch\nclass Predictor:\n    def __init__(self, path):\n        self.model = torch.jit.load(path)\n"
        "        self.model.eval()\n    @torch.no_grad()\n    def predict(self, x):\n        return self.model(x)\n",
        # eval'd in the chain
        "import torch\nimport torch.nn as nn\nnet = nn.Sequential(nn.Linear(2, 2), nn.Dropout()).eval()\n"
        "def infer(x):\n    with torch.no_grad():\n        return net(x)\n",
        # training loop over the training data is not an evaluation path
        "import torch\ndef train(model, train_loader, opt):\n    model.train()\n    for x, y in train_loader:\n"
        "        loss = model(x).sum()\n        loss.backward()\n        opt.step()\n",
        Valid("import torch\nfrom transformers import AutoModel\nmodel = AutoModel.from_pretrained('bert-base-uncased')\n"
              "def predict(batch):\n    with torch.no_grad():\n        return model(**batch)\n"),
        Valid("import torch\ndef prepare(config, x, script):\n    model = build_model(config)\n    model.eval()\n"
              "    if script:\n        serving_model = torch.jit.trace(model, x)\n    else:\n"
              "        serving_model = model\n    def predict():\n        with torch.no_grad():\n"
              "            return serving_model(x)\n    return predict\n"),
        Valid("import torch\nfrom espnet2.bin.asr_inference import Speech2Text\nclass Scorer:\n"
              "    def __init__(self, path):\n        self.asr_model = Speech2Text(asr_model_file=path)\n"
              "    def predict_hypothesis(self, wav):\n        return self.asr_model(wav)\n"),
        Valid("import torch\ndef on_validation_end(accelerator, unet, batch):\n    with torch.no_grad():\n"
              "        accelerator.unwrap_model(unet).reset_cache()\n"),
        Valid("import torch\nfrom zoo import GCN, GIN\nMODELS = {'gcn': GCN, 'gin': GIN}\n"
              "@torch.no_grad()\ndef run_inference(name, data):\n    Model = MODELS[name]\n"
              "    model = Model(data, 3).eval()\n    return model(data)\n"),
        # an adapter handed to the step that sets the mode: the lambda runs there, on the model it is given
        "import torch\ndef make_evaluator(model, loader, model_fn=lambda model, x: model(x)):\n"
        "    def step(x):\n        model.eval()\n        with torch.no_grad():\n            return model_fn(model, x)\n"
        "    return step\n",
        # a method of the class that loads weights is no module
        Valid("import torch\nclass Solver:\n    def reload_model(self, step):\n        self.step = step\n"
              "    def test(self):\n        with torch.no_grad():\n            self.reload_model(self.test_iters)\n"),
        # every caller hands a plain function: no module, no mode
        Valid("import torch\ndef net(X):\n    return X @ W\ndef evaluate_accuracy(loader, net):\n"
              "    with torch.no_grad():\n        return [net(x) for x, y in loader]\nevaluate_accuracy(test_loader, net)\n"),
        # the only caller hands a lambda, unpacked from a tuple beside the loss: a function, with no mode to switch
        "import torch\ndef evaluate_fit(net, batches, loss):\n    total = 0.0\n    for x, y in batches:\n"
        "        total += loss(net(x), y).sum().item()\n    return total\n"
        "def fit(batches, w, b):\n    net, loss = lambda x: x @ w + b, torch.nn.functional.mse_loss\n"
        "    for x, y in batches:\n        loss(net(x), y).backward()\n    print(evaluate_fit(net, batches, loss))\n",
        # the caller hands the module in eval mode: eval() returns the module itself
        "import torch\ndef show(net, frames):\n    def predict(frame):\n        return net(frame)\n"
        "    for frame in frames:\n        predict(frame)\nif __name__ == '__main__':\n    net = load_detector()\n"
        "    show(net.eval(), camera_frames())\n",
        # built by a factory function that returns a class holding no dropout and no batch norm
        "import torch\nimport torch.nn as nn\nclass Scorer(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.fc = nn.Linear(8, 1)\n    def forward(self, x):\n"
        "        return self.fc(x)\ndef make_scorer():\n    return Scorer()\ndef evaluate(batches):\n"
        "    net = make_scorer()\n    with torch.no_grad():\n        for x, y in batches:\n"
        "            print((net(x) - y).abs().mean())\n",
        # an attribute of a helper object whose class builds it pretrained (in eval mode) and never trains it
        "import torch\nfrom transformers import AutoModel\nclass Encoder:\n    def __init__(self, name):\n"
        "        self.backbone = AutoModel.from_pretrained(name)\ndef _test(batches):\n    enc = Encoder('m')\n"
        "    with torch.no_grad():\n        for ids in batches:\n            print(enc.backbone(ids))\n",
        # a class picked from a registry and built: construction, no forward pass
        Valid("import torch\nfrom detectors import factory\ndef test(opt):\n    Detector = factory[opt.task]\n"
              "    with torch.no_grad():\n        detector = Detector(opt)\n"),
        # a loader of this file returns the pretrained model (in eval mode) as one item of a tuple
        Valid("import torch\nfrom transformers import CLIPTextModel, CLIPTokenizer\ndef load_clip(name):\n"
              "    text_model = CLIPTextModel.from_pretrained(name)\n    tokenizer = CLIPTokenizer.from_pretrained(name)\n"
              "    return tokenizer, text_model\ndef evaluate(prompts):\n    tokenizer, text_model = load_clip('clip')\n"
              "    with torch.no_grad():\n        for p in prompts:\n            text_model(**tokenizer(p))\n"),
        # the wrapper's constructor puts the wrapped module in eval mode
        Valid("import torch\nimport torch.nn as nn\nclass Frozen(nn.Module):\n    def __init__(self, backbone):\n"
              "        super().__init__()\n        self.backbone = backbone\n        self.drop = nn.Dropout(0.1)\n"
              "        self.backbone.eval()\ndef evaluate(backbone, loader):\n    feature_model = Frozen(backbone)\n"
              "    with torch.no_grad():\n        for x in loader:\n            feature_model(x)\n"),
        # a name given what an import names (a function of a helper module), as when it is called directly
        Valid("import torch\nimport helpers\ndef evaluate(loader):\n    net, loss = helpers.linreg, helpers.squared_loss\n"
              "    with torch.no_grad():\n        for x, y in loader:\n            loss(net(x), y)\n"),
        # built in eval mode here; the train() elsewhere is another function's model
        Valid("import torch\ndef train(loader):\n    model = make_net()\n    model.train()\n"
              "def test(loader):\n    model = make_net().eval()\n    with torch.no_grad():\n        for x in loader:\n"
              "            model(x)\n"),
        # a parameter named like nothing in particular: every caller passes a module built in eval mode
        Valid("import torch\nimport torch.nn as nn\nclass Head(nn.Module):\n    def __init__(self):\n"
              "        super().__init__()\n        self.drop = nn.Dropout(0.2)\n    def forward(self, x):\n"
              "        return self.drop(x)\n@torch.no_grad()\ndef test(scorer, batches):\n"
              "    return [scorer(x) for x in batches]\ndef main(batches):\n    head = Head().eval()\n"
              "    test(head, batches)\n"),
        # ... or a caller passes something the file does not show to be a module
        Valid("import torch\nimport torch.nn as nn\nclass Head(nn.Module):\n    def __init__(self):\n"
              "        super().__init__()\n        self.drop = nn.Dropout(0.2)\n    def forward(self, x):\n"
              "        return self.drop(x)\n@torch.no_grad()\ndef test(scorer, batches):\n"
              "    return [scorer(x) for x in batches]\ndef main(batches, pick):\n    test(Head(), batches)\n"
              "    test(pick, batches)\n"),
    ]
    INVALID = [
        # the same helper object, its class building the attribute fresh (with dropout) rather than pretrained
        Invalid("import torch\nfrom torch import nn\nclass Encoder:\n    def __init__(self):\n"
                "        self.backbone = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.2))\ndef _test(batches):\n"
                "    enc = Encoder()\n    with torch.no_grad():\n        for ids in batches:\n"
                "            print(enc.backbone(ids))\n", line=10),
        # the same tuple assignment handing the helper a module with dropout: its mode matters
        Invalid("import torch\nimport torch.nn as nn\ndef evaluate_fit(net, batches, loss):\n    total = 0.0\n"
                "    for x, y in batches:\n        total += loss(net(x), y).sum().item()\n    return total\n"
                "def fit(batches):\n    net, loss = nn.Sequential(nn.Linear(4, 1), nn.Dropout(0.5)), nn.MSELoss()\n"
                "    for x, y in batches:\n        loss(net(x), y).backward()\n    print(evaluate_fit(net, batches, loss))\n",
                line=6),
        # the second module of an evaluation function is a parameter; the caller hands it a module with dropout
        Invalid("import torch\nimport torch.nn as nn\nclass Head(nn.Module):\n    def __init__(self):\n"
                "        super().__init__()\n        self.drop = nn.Dropout(0.2)\n    def forward(self, x):\n"
                "        return self.drop(x)\n@torch.no_grad()\ndef test(encoder, scorer, batches):\n"
                "    encoder.eval()\n    return [scorer(encoder(x)) for x in batches]\n"
                "def main(batches):\n    encoder = nn.Sequential(nn.Linear(4, 4), nn.Dropout())\n"
                "    scorer = Head().to('cpu')\n    test(encoder, scorer, batches)\n",
                line=12, message="`scorer`"),
        Invalid("import torch\ndef validate(model, loader):\n    with torch.no_grad():\n        for x, y in loader:\n"
                "            out = model(x)\n", line=5, message="`model`"),
        # restored from a file the program does not write: whatever it holds may have dropout
        Invalid("import torch\nimport torch.nn as nn\nclass Plain(nn.Module):\n    def __init__(self):\n"
                "        super().__init__()\n        self.body = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())\n"
                "    def forward(self, x):\n        return self.body(x)\nnet = Plain()\n"
                "net = torch.load(args.weights)\nwith torch.no_grad():\n    for x, y in test_loader:\n"
                "        out = net(x)\n", line=13, message="`net`"),

        Invalid("import torch\nimport torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n"
                "        super().__init__()\n        self.drop = nn.Dropout(0.5)\n    def forward(self, x):\n"
                "        return self.drop(x)\n"
                "net = Net()\nwith torch.no_grad():\n    for x, y in val_loader:\n        pred = net(x)\n",
                line=12, message="val_loader"),
        Invalid("import torch\nclass Trainer:\n    def evaluate(self):\n        with torch.no_grad():\n"
                "            for batch in self.val_loader:\n                logits = self.model(batch)\n",
                line=6, message="`self.model`"),
        # eval before, then train() again, then a validation loop
        Invalid("import torch\ndef fit(model, train_loader, val_loader, opt):\n    model.eval()\n"
                "    for epoch in range(3):\n        model.train()\n        for x, y in train_loader:\n"
                "            model(x).sum().backward()\n            opt.step()\n        with torch.no_grad():\n"
                "            for x, y in val_loader:\n                model(x)\n", line=11),
        # the model's own code takes another branch in training: eval() changes it
        Invalid("import torch\nimport torch.nn as nn\nclass Noisy(nn.Module):\n    def __init__(self):\n"
                "        super().__init__()\n        self.fc = nn.Linear(4, 4)\n    def forward(self, x):\n"
                "        if self.training:\n            x = x + torch.randn_like(x)\n        return self.fc(x)\n"
                "net = Noisy()\nwith torch.no_grad():\n    for x in val_loader:\n        net(x)\n", line=14),
        # instance norm asked to keep running statistics uses them in eval mode
        Invalid("import torch\nimport torch.nn as nn\nclass Styler(nn.Module):\n    def __init__(self):\n"
                "        super().__init__()\n        self.norm = nn.InstanceNorm2d(3, track_running_stats=True)\n"
                "    def forward(self, x):\n        return self.norm(x)\nstyler = Styler()\n"
                "with torch.no_grad():\n    for x in val_loader:\n        styler(x)\n", line=12),
        # a lambda that runs a model it does not receive: the model the evaluation path holds
        Invalid("import torch\ndef evaluate(model, loader):\n    with torch.no_grad():\n"
                "        scores = map(lambda x: model(x), loader)\n        return list(scores)\n", line=4,
                message="`model`"),
        Invalid("import torch as th\ndef predict(encoder, x):\n    with th.inference_mode():\n        return encoder.forward(x)\n",
                line=4, message="encoder"),
    ]

    def check(self, call: _ModelCall, where: str) -> Optional[str]:
        if self.facts.eval_covered(call) or self.facts.runs_a_function(call):
            return None
        if _DOTTED.match(call.model) and not changes_in_eval(self.ctx, cst.parse_expression(call.model), call.node):
            return None  # no dropout and no BatchNorm anywhere in the model: eval() would change nothing
        return (f"`{call.model}` runs in {where} without `{call.model}.eval()` before it: dropout stays active and "
                f"batch-norm normalizes with (and updates its running statistics from) the evaluation batches; "
                f"call `{call.model}.eval()` first")

    def severity_of(self, call: _ModelCall) -> Optional[Severity]:
        # a helper handed its model by code in other files: whether that code switched it to eval mode first (or
        # hands a pretrained or mode-free one) is not shown here; said one step lower
        return Severity.MEDIUM if self.facts.handed_from_elsewhere(call) else None


_DOTTED = re.compile(r"^[A-Za-z_][\w.]*$")
