"""``torchreview lsp`` through the protocol: the real server as a subprocess, JSON-RPC over its stdio."""
from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Optional

from lsprotocol import types  # the lsp extra, part of dev: a missing pygls fails here rather than skipping
from pygls.lsp.client import LanguageClient

ROOT = Path(__file__).resolve().parents[1]
BUGGY = "import torch\n\nstate = torch.load('model.pt')\n"  # TR601, fixable: weights_only=True
FIXED = "import torch\n\nstate = torch.load('model.pt', weights_only=True)\n"
MODEL_SOFTMAX = ("import torch\nfrom torch import nn\n\n\nclass Net(nn.Module):\n    def __init__(self):\n"
                 "        super().__init__()\n        self.fc = nn.Linear(10, 3)\n\n    def forward(self, x):\n"
                 "        return torch.softmax(self.fc(x), dim=-1)\n")
TRAIN = ("import torch\nfrom torch import nn\nfrom model import Net\n\nmodel = Net()\ncriterion = nn.CrossEntropyLoss()\n"
         "x = torch.randn(4, 10)\ny = torch.randint(0, 3, (4,))\nloss = criterion(model(x), y)\n")
TIMEOUT = 60


class Client(LanguageClient):
    def __init__(self) -> None:
        super().__init__("torchreview-test", "1")
        self.published: asyncio.Queue = asyncio.Queue()

        @self.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def on_diagnostics(params: types.PublishDiagnosticsParams) -> None:  # no `ls` first: params only
            self.published.put_nowait(params)

    async def diagnostics_for(self, uri: str) -> types.PublishDiagnosticsParams:
        while True:
            params = await asyncio.wait_for(self.published.get(), TIMEOUT)
            if params.uri == uri:
                return params


# the rules these tests use (TR601, TR401) are preview rules: the workspace opts in, at the rules' own severities
WORKSPACE_CONFIG = "preview = true\nmeasured_severities = false\n"


async def started(tmp_path: Path, debounce: str = "1.0", env: Optional[dict] = None) -> Client:
    config = tmp_path / ".torchreview.toml"
    if not config.exists():
        config.write_text(WORKSPACE_CONFIG)
    client = Client()
    exe = Path(sys.executable).with_name("torchreview")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "bot.cli"]
    await client.start_io(*cmd, "lsp", "--debounce", debounce, cwd=str(tmp_path),
                          env=env or {**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        await asyncio.wait_for(client.initialize_async(types.InitializeParams(
            process_id=os.getpid(), root_uri=tmp_path.as_uri(), capabilities=types.ClientCapabilities())), TIMEOUT)
    except BaseException:
        await _killed(client)
        raise
    client.initialized(types.InitializedParams())
    return client


async def stopped(client: Client) -> None:
    """Shuts the server down as an editor does; kills it if it is still running after that, so that a test that
    failed or timed out (a server busy or stuck) does not leave it behind."""
    try:
        await asyncio.wait_for(client.shutdown_async(None), TIMEOUT)
        client.exit(None)
        await asyncio.wait_for(client._server.wait(), TIMEOUT)
    finally:
        await _killed(client)


async def _killed(client: Client) -> None:
    if client._server.returncode is None:  # pygls keeps the server's process there and has no other handle
        client._server.kill()
    await asyncio.wait_for(client.stop(), TIMEOUT)


def open_document(client: Client, path: Path, text: str) -> str:
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
    return uri


def apply(text: str, edit: types.TextEdit) -> str:
    lines = text.splitlines(keepends=True)
    start = sum(len(line) for line in lines[:edit.range.start.line]) + edit.range.start.character
    end = sum(len(line) for line in lines[:edit.range.end.line]) + edit.range.end.character
    return text[:start] + edit.new_text + text[end:]


def test_diagnostics_quick_fix_and_clearing(tmp_path):
    (tmp_path / ".git").mkdir()
    path = tmp_path / "train.py"
    path.write_text(BUGGY)

    async def scenario() -> None:
        client = await started(tmp_path)
        try:
            uri = open_document(client, path, BUGGY)
            published = await client.diagnostics_for(uri)
            assert [d.code for d in published.diagnostics] == ["TR601"]
            [diagnostic] = published.diagnostics
            assert diagnostic.source == "torchreview"
            assert diagnostic.severity == types.DiagnosticSeverity.Error  # TR601 is high
            assert (diagnostic.range.start.line, diagnostic.range.start.character) == (2, 8)  # torch.load(...)
            assert diagnostic.range.end.line == 2

            actions = await asyncio.wait_for(client.text_document_code_action_async(types.CodeActionParams(
                text_document=types.TextDocumentIdentifier(uri=uri), range=diagnostic.range,
                context=types.CodeActionContext(diagnostics=[diagnostic]))), TIMEOUT)
            [action] = actions
            assert action.kind == types.CodeActionKind.QuickFix and "TR601" in action.title
            # weights_only=True refuses some checkpoints: never applied by the editor on its own, and said so
            assert not action.is_preferred and action.title.endswith("changes behaviour, review it")
            [edit] = action.edit.changes[uri]
            assert apply(BUGGY, edit) == FIXED

            # nothing to fix elsewhere in the file
            elsewhere = await asyncio.wait_for(client.text_document_code_action_async(types.CodeActionParams(
                text_document=types.TextDocumentIdentifier(uri=uri),
                range=types.Range(start=types.Position(line=0, character=0), end=types.Position(line=0, character=5)),
                context=types.CodeActionContext(diagnostics=[]))), TIMEOUT)
            assert not elsewhere

            # typing the fix in two edits within the debounce: one analysis, of the last text, which is clean
            client.text_document_did_change(types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
                content_changes=[types.TextDocumentContentChangeWholeDocument(text=BUGGY.replace(")", ", "))]))
            client.text_document_did_change(types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=3),
                content_changes=[types.TextDocumentContentChangeWholeDocument(text=apply(BUGGY, edit))]))
            cleared = await client.diagnostics_for(uri)
            assert cleared.version == 3 and not cleared.diagnostics
        finally:
            await stopped(client)

    asyncio.run(scenario())


def test_saving_the_model_file_refreshes_the_script_that_uses_it(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "model.py").write_text(MODEL_SOFTMAX)
    (tmp_path / "train.py").write_text(TRAIN)

    async def scenario() -> None:
        client = await started(tmp_path)
        try:
            uri = open_document(client, tmp_path / "train.py", TRAIN)
            assert [d.code for d in (await client.diagnostics_for(uri)).diagnostics] == ["TR401"]
            logits = MODEL_SOFTMAX.replace("torch.softmax(self.fc(x), dim=-1)", "self.fc(x)")
            (tmp_path / "model.py").write_text(logits)
            model_uri = open_document(client, tmp_path / "model.py", logits)
            client.text_document_did_save(types.DidSaveTextDocumentParams(
                text_document=types.TextDocumentIdentifier(uri=model_uri)))
            while True:  # the open of model.py publishes too; wait for train.py's refresh
                refreshed = await client.diagnostics_for(uri)
                if not refreshed.diagnostics:
                    break
        finally:
            await stopped(client)

    asyncio.run(scenario())


def test_positions_are_utf16_and_a_fix_on_a_last_line_without_newline_adds_none(tmp_path):
    (tmp_path / ".git").mkdir()
    text = "import torch\n\nname = '😀é'; state = torch.load(name)"  # no final newline
    prefix = "name = '😀é'; state = "

    async def scenario() -> None:
        client = await started(tmp_path)
        try:
            uri = open_document(client, tmp_path / "emoji.py", text)
            [diagnostic] = (await client.diagnostics_for(uri)).diagnostics
            assert diagnostic.code == "TR601"
            assert diagnostic.range.start.character == len(prefix.encode("utf-16-le")) // 2  # the emoji counts 2
            [action] = await asyncio.wait_for(client.text_document_code_action_async(types.CodeActionParams(
                text_document=types.TextDocumentIdentifier(uri=uri), range=diagnostic.range,
                context=types.CodeActionContext(diagnostics=[diagnostic]))), TIMEOUT)
            [edit] = action.edit.changes[uri]
            assert edit.range.end.line == 2
            # the edit's columns are UTF-16 too: apply it as an editor would
            lines = text.splitlines(keepends=True)
            last = lines[2].encode("utf-16-le")
            fixed_last = last[:edit.range.start.character * 2].decode("utf-16-le") + edit.new_text + \
                last[edit.range.end.character * 2:].decode("utf-16-le")
            assert edit.range.start.line == 2 and edit.range.start.character == 0
            assert fixed_last == "name = '😀é'; state = torch.load(name, weights_only=True)"
        finally:
            await stopped(client)

    asyncio.run(scenario())


def test_a_file_whose_analysis_stalls_is_said_on_the_file_and_the_server_goes_on(tmp_path):
    """A rule caught in a loop (tests/fixtures/stalling_rule) must not hang the editor's server."""
    from tests.test_bounded_analysis import STALL, stalling_env

    (tmp_path / ".git").mkdir()
    (tmp_path / ".torchreview.toml").write_text(WORKSPACE_CONFIG + "file_timeout = 2\n")
    slow, fast = tmp_path / "slow.py", tmp_path / "train.py"
    slow.write_text(STALL)
    fast.write_text(BUGGY)

    async def scenario() -> None:
        client = await started(tmp_path, debounce="0", env=stalling_env())
        try:
            slow_uri = open_document(client, slow, STALL)
            [unfinished] = (await client.diagnostics_for(slow_uri)).diagnostics
            assert (unfinished.code, unfinished.severity) == ("timeout", types.DiagnosticSeverity.Warning)
            assert unfinished.message == "not analyzed: analysis took over 2 s; stopped"
            fast_uri = open_document(client, fast, BUGGY)  # the server still answers, and analyzes the next file
            assert [d.code for d in (await client.diagnostics_for(fast_uri)).diagnostics] == ["TR601"]
        finally:
            await stopped(client)

    asyncio.run(scenario())


def test_only_a_behaviour_keeping_fix_alone_on_its_lines_is_preferred(tmp_path):
    (tmp_path / ".git").mkdir()
    one, two = tmp_path / "one.py", tmp_path / "two.py"
    single = "import torch\nouter = torch.ger(a, b)\n"
    double = "import torch\nboth = torch.ger(a, b), torch.range(0, 9)\n"
    one.write_text(single)
    two.write_text(double)

    async def actions_for(client, path, text):
        uri = open_document(client, path, text)
        published = await client.diagnostics_for(uri)
        return await asyncio.wait_for(client.text_document_code_action_async(types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=types.Range(start=types.Position(line=1, character=0), end=types.Position(line=1, character=40)),
            context=types.CodeActionContext(diagnostics=published.diagnostics))), TIMEOUT)

    async def scenario() -> None:
        client = await started(tmp_path, debounce="0")
        try:
            [alone] = await actions_for(client, one, single)
            assert alone.is_preferred and alone.title == "Fix TR811 (deprecated-torch-api)"
            overlapping = await actions_for(client, two, double)
            assert len(overlapping) == 2 and not any(a.is_preferred for a in overlapping)  # the edits would collide
        finally:
            await stopped(client)

    asyncio.run(scenario())


def test_a_quick_fix_also_removes_the_import_it_leaves_unused(tmp_path):
    (tmp_path / ".git").mkdir()
    one, two = tmp_path / "one.py", tmp_path / "two.py"
    single = "import torch\nfrom torch.autograd import Variable, grad\n\nx = Variable(torch.ones(2))\ng = grad\n"
    both = ("import torch\nfrom torch.cuda.amp import autocast, GradScaler\nscaler = GradScaler()\n"
            "with autocast():\n    y = 1\n")

    async def actions_on(client, path, text, first_line, last_line):
        path.write_text(text)
        uri = open_document(client, path, text)
        published = await client.diagnostics_for(uri)
        actions = await asyncio.wait_for(client.text_document_code_action_async(types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=types.Range(start=types.Position(line=first_line, character=0),
                              end=types.Position(line=last_line, character=20)),
            context=types.CodeActionContext(diagnostics=published.diagnostics))), TIMEOUT)
        return [action.edit.changes[uri] for action in actions], actions

    async def scenario() -> None:
        client = await started(tmp_path, debounce="0")
        try:
            [edits], _ = await actions_on(client, one, single, 3, 3)
            assert len(edits) == 2  # the fix, and the import line it frees (edits of the document as it is)
            fixed = single
            for edit in sorted(edits, key=lambda e: e.range.start.line, reverse=True):
                fixed = apply(fixed, edit)
            assert fixed == "import torch\nfrom torch.autograd import grad\n\nx = torch.ones(2)\ng = grad\n"

            # two fixes each freeing one name of line 2: applied together they would collide, so neither is preferred
            edits, actions = await actions_on(client, two, both, 2, 3)
            assert [a.title for a in actions] == ["Fix TR801 (deprecated-cuda-amp)"] * 2
            assert all(any(e.range.start.line == 1 for e in mine) for mine in edits)
            assert not any(a.is_preferred for a in actions)
        finally:
            await stopped(client)

    asyncio.run(scenario())
