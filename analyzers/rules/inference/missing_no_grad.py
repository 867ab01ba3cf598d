"""TR202 missing-no-grad: model run for validation/inference with autograd recording."""
from __future__ import annotations

from typing import Optional
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Valid
from analyzers.program.evaluation import ModelCall as _ModelCall
from analyzers.rules.inference._inference import InferencePathRule as _InferencePathRule


class MissingNoGrad(_InferencePathRule):
    id = "TR202"
    slug = "missing-no-grad"
    category = Category.INFERENCE
    severity = Severity.MEDIUM
    summary = "model run for validation/inference with autograd recording"
    what = """
        Flags a model that is called in a validation, evaluation, test or prediction path (see
        TR201) outside `torch.no_grad()` / `torch.inference_mode()` (as a context manager or a
        decorator) or `torch.set_grad_enabled(False)`, when the same function does not compute
        gradients itself (`.backward()`, `torch.autograd.grad`, `torch.enable_grad()`). A caller in
        this file that enters no-grad around the call counts.
    """
    why = """
        With autograd on, every forward pass records the graph and keeps all intermediate
        activations alive for a backward pass that never comes: evaluation uses several times
        more memory (often the cause of out-of-memory errors during validation) and runs slower.
    """
    example = """
        def evaluate(model, loader):
            model.eval()
            for x, y in loader:
                correct += (model(x).argmax(1) == y).sum()
    """
    fix_example = """
        @torch.no_grad()
        def evaluate(model, loader):
            model.eval()
            for x, y in loader:
                correct += (model(x).argmax(1) == y).sum()
    """
    VALID = [
        "import torch\n@torch.no_grad()\ndef evaluate(model, loader):\n    model.eval()\n    for x in loader:\n        model(x)\n",
        "import torch\n@torch.inference_mode()\ndef predict(model, x):\n    model.eval()\n    return model(x)\n",
        "import torch\ndef validate(model, loader):\n    model.eval()\n    torch.set_grad_enabled(False)\n"
        "    for x in loader:\n        model(x)\n",
        # no_grad entered by the caller in this file
        "import torch\ndef evaluate(model, loader):\n    model.eval()\n    return [model(x) for x in loader]\n"
        "def main(model, loader):\n    with torch.no_grad():\n        evaluate(model, loader)\n",
        # decorator on the enclosing method
        "import torch\nclass Runner:\n    @torch.no_grad()\n    def validate(self):\n        self.model.eval()\n"
        "        def step(x):\n            return self.model(x)\n        return [step(x) for x in self.val_loader]\n",
        # gradients wanted on purpose (saliency maps, test-time adaptation)
        "import torch\ndef predict_saliency(model, x):\n    model.eval()\n    x.requires_grad_()\n"
        "    model(x).max().backward()\n    return x.grad\n",
        "import torch\ndef infer_with_grad(model, x):\n    model.eval()\n    with torch.enable_grad():\n        return model(x)\n",
        Valid("import torch\nimport pytorch_lightning as pl\nclass Lit(pl.LightningModule):\n    def test_step(self, batch, i):\n"
              "        return self.net(batch)\n"),
        # eval() for a forward inside a function that also trains: not an inference path
        "import torch\ndef fit(model, loader, opt):\n    model.eval()\n    for x, y in loader:\n"
        "        loss = model(x).sum()\n        loss.backward()\n        opt.step()\n",
        # a module's self-check on a random input, after eval()
        "import torch\nif __name__ == '__main__':\n    net = Separator(n_src=2)\n    x = torch.rand(2, 3200)\n"
        "    print(net(x).shape)\n    net.eval()\n    print(net(x).shape)\n",
        # one forward after eval(): to count the model's operations, or to compare it with a converted copy
        "import torch\ndef convert(original, new_model, batch):\n    original.eval()\n    new_model.eval()\n"
        "    assert torch.allclose(original(batch), new_model(batch))\n",
        "import torch\ndef count_flops(model, size):\n    model.eval()\n    x = torch.rand(size)\n    if cuda:\n"
        "        x = x.cuda()\n    model(x)\n",
        # a no-grad context entered by hand for the rest of the function
        "import torch\ndef evaluate(model, test_set):\n    model.eval()\n    torch.no_grad().__enter__()\n"
        "    for x in test_set:\n        model(x)\n",
        # eval() for a warm-up before the model is trained again in this file
        "import torch\ndef run(model, x, n):\n    model.eval()\n    for _ in range(n):\n        model(x)\n"
        "    model.train()\n    for _ in range(n):\n        train_step(model, x)\n",
        # a test that asserts, in a file named outside pytest's defaults
        "import torch\ndef test_cached_matches_uncached(model, x):\n    model.eval()\n"
        "    assert torch.allclose(model(x), model(x, use_cache=False))\n",
        # a pytest test in a file pytest collects
        "import torch\nimport pytest\ndef test_forward(model, batch):\n    for x in batch:\n        assert model(x).shape\n",
        # a model's prediction method under no_grad; and one of a model this code never put in eval mode (its class
        # may turn gradients off itself)
        "import torch\nclass Runner:\n    @torch.no_grad()\n    def evaluate(self, data):\n        self.net.eval()\n"
        "        return [self.net.predict_scores(b) for b in data]\n",
        "import torch\ndef evaluate(model, data):\n    return [model.predict(b) for b in data]\n",
        # a batched inference method: libraries often turn gradients off inside it
        "import torch\ndef run(model, loader):\n    model.eval()\n    for _ in range(3):\n        model.inference(loader)\n",
        # a helper object named for predicting is no model
        "import torch\ndef evaluate(model, predictor, data):\n    model.eval()\n    with torch.no_grad():\n"
        "        feats = [model(b) for b in data]\n    return [predictor.predict(f) for f in feats]\n",
    ]
    INVALID = [
        Invalid("import torch\ndef evaluate(model, loader):\n    model.eval()\n    for x, y in loader:\n"
                "        correct = (model(x).argmax(1) == y).sum()\n", line=5, message="`model`"),
        Invalid("import torch\nmodel = torch.nn.Linear(3, 1)\nmodel.eval()\nfor x in test_loader:\n    y = model(x)\n",
                line=5, message="test_loader"),
        Invalid("import torch\nclass Engine:\n    def predict(self, x):\n        self.model.eval()\n"
                "        return self.model(x).softmax(-1)\n", line=5, message="self.model"),
        # enable_grad elsewhere in the file does not count; the call site here is not under no_grad
        Invalid("import torch\ndef evaluate(net, loader):\n    net.eval()\n    return [net(x) for x in loader]\n"
                "def main(net, loader):\n    print(evaluate(net, loader))\n", line=4),
        # eval() says the model runs for inference, whatever the function and the loader are called
        Invalid("import torch\ndef demo(model, loader):\n    model.eval()\n    for images, paths in loader:\n"
                "        print(paths, model(images).argmax(1))\n", line=5, message="after `model.eval()`"),
        Invalid("import torch\nmodel = Detector()\nmodel.eval()\nfor paths, images in dataloader:\n"
                "    boxes = model(images)\n", line=5, message="the module's code after `model.eval()`"),
        # test_net in a script pytest never collects: it runs the model to test it, not a pytest test
        Invalid("import torch\ndef test_net(net, image):\n    return net(image.unsqueeze(0))\n"
                "if __name__ == '__main__':\n    net = Detector()\n    net.eval()\n    test_net(net, load_image())\n",
                line=3, message="test_net"),
        # a model put in eval mode and run through its prediction method, as through its forward
        Invalid("import torch\nclass Runner:\n    def evaluate(self, data):\n        self.net.eval()\n"
                "        scores = []\n        for batch in data:\n            scores.append(self.net.predict_scores(batch))\n"
                "        return scores\n", line=7, message="`self.net`"),
        Invalid("import torch\ndef test(model, loader):\n    model.eval()\n    for x, y in loader:\n"
                "        hits = (model.predict(x) == y).sum()\n", line=5, message="`model`"),
    ]

    def check(self, call: _ModelCall, where: str) -> Optional[str]:
        if self.facts.nograd_covered(call):
            return None
        return (f"`{call.model}` runs in {where} with autograd recording: wrap it in `torch.no_grad()` or "
                f"`torch.inference_mode()` (or decorate the function) so activations are not kept for a backward "
                f"pass that never comes")
