"""TR970 model-selection-on-test-set: Hyperparameters chosen by their score on the test set."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from analyzers.context import (FileContext, all_children, dotted_name, short)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.program.names import mentions_test as _mentions_test
from analyzers.program.flow import targets as _targets
from analyzers.program.library import is_estimator_class, is_metric


class _Loop:
    def __init__(self, node: cst.For) -> None:
        self.node = node
        self.variables = set(_targets(node.target))
        self.fits = False
        self.varies = False
        self.evaluations: list[tuple[cst.Call, Optional[str], str]] = []  # call, assigned name, test data name
        self.compared: set[str] = set()
        self.compared_calls: list[cst.Call] = []
        self.appended: dict[str, list[cst.Call]] = {}  # list name -> evaluation calls appended to it


class TestSetModelSelection(Rule):
    id = "TR970"
    slug = "model-selection-on-test-set"
    category = Category.DATA_LEAKAGE
    severity = Severity.HIGH
    requires = "sklearn"
    summary = "Hyperparameters chosen by their score on the test set"
    what = """
        Flags a loop over hyperparameter values that builds an estimator from the loop
        variable, fits it, scores it on test data (`model.score(X_test, y_test)`,
        `accuracy_score(y_test, model.predict(X_test))`) and keeps the best: an `if` comparing
        the score, or a list of scores whose `max` / `argmax` is taken after the loop.
    """
    why = """
        Choosing among candidates by their test score fits the choice to the test set: the
        winning score is the maximum of noisy estimates and overstates how the model does on
        new data, and no untouched data is left to measure it. Select on a validation split or
        with cross-validation (`GridSearchCV`), then score the chosen model on the test set once.
    """
    example = """
        for k in range(1, 30):
            knn = KNeighborsClassifier(n_neighbors=k).fit(X_train, y_train)
            score = knn.score(X_test, y_test)
            if score > best_score:
                best_score, best_k = score, k
    """
    fix_example = """
        search = GridSearchCV(KNeighborsClassifier(), {"n_neighbors": range(1, 30)}, cv=5)
        search.fit(X_train, y_train)
        test_score = search.score(X_test, y_test)  # once, for the chosen model
    """
    VALID = [
        # selection on a validation split
        """
        from sklearn.neighbors import KNeighborsClassifier
        for k in range(1, 30):
            knn = KNeighborsClassifier(n_neighbors=k).fit(X_train, y_train)
            score = knn.score(X_val, y_val)
            if score > best_score:
                best_score, best_k = score, k
        """,
        # comparing models on the test set without choosing among them
        """
        from sklearn.linear_model import LogisticRegression
        for name, model in models.items():
            model.fit(X_train, y_train)
            print(name, model.score(X_test, y_test))
        """,
    ]
    INVALID = [
        Invalid(
            """
            from sklearn.neighbors import KNeighborsClassifier
            best_score = 0
            for k in range(1, 30):
                knn = KNeighborsClassifier(n_neighbors=k)
                knn.fit(X_train, y_train)
                score = knn.score(X_test, y_test)
                if score > best_score:
                    best_score, best_k = score, k
            """,
            line=7, message="`knn.score(X_test, y_test)`",
        ),
        Invalid(
            """
            import numpy as np
            from sklearn.svm import SVC
            from sklearn.metrics import accuracy_score
            scores = []
            for C in [0.01, 0.1, 1, 10]:
                clf = SVC(C=C).fit(X_train, y_train)
                scores.append(accuracy_score(y_test, clf.predict(X_test)))
            best_C = [0.01, 0.1, 1, 10][int(np.argmax(scores))]
            """,
            line=8, message="`C`",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._loops: dict[cst.For, _Loop] = {}
        self._maxed: set[str] = set()  # lists whose max / argmax is taken

    def _active(self, ctx: FileContext) -> list[_Loop]:
        return [self._loops[lp] for lp in ctx.loops_in_function() if lp in self._loops]

    def visit_For(self, node: cst.For, ctx: FileContext) -> None:
        self._loops[node] = _Loop(node)

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
        if name in ("max", "argmax", "nanargmax", "idxmax", "sorted", "index"):
            for arg in node.args:
                target = dotted_name(arg.value)
                if target:
                    self._maxed.add(target)
            if isinstance(func, cst.Attribute):
                receiver = dotted_name(func.value)
                if receiver:
                    self._maxed.add(receiver)
        loops = self._active(ctx)
        if not loops:
            return
        qualified = ctx.qualified_name(func) or ""
        if name in ("fit", "fit_predict", "fit_transform"):
            for loop in loops:
                loop.fits = True
        if name == "set_params" or is_estimator_class(qualified):
            for loop in loops:
                used = {n.value for a in node.args for n in _walk_names(a.value)}
                if used & loop.variables:
                    loop.varies = True
        test = None
        if name == "score" and isinstance(func, cst.Attribute) and node.args:
            test = _mentions_test(node.args[0].value)
        elif is_metric(qualified) and node.args:
            test = _mentions_test(node.args[0].value) or (
                _mentions_test(node.args[1].value) if len(node.args) > 1 else None)
        if test is not None:
            parent = ctx.parent(ctx.parent(node)) if isinstance(ctx.parent(node), cst.Arg) else ctx.parent(node)
            assigned = None
            if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
                assigned = dotted_name(parent.targets[0].target)
            for loop in loops:
                loop.evaluations.append((node, assigned, test))
            if isinstance(parent, cst.Call) and isinstance(parent.func, cst.Attribute) and \
                    parent.func.attr.value == "append":
                container = dotted_name(parent.func.value)
                if container:
                    for loop in loops:
                        loop.appended.setdefault(container, []).append(node)

    def visit_Comparison(self, node: cst.Comparison, ctx: FileContext) -> None:
        loops = self._active(ctx)
        if not loops:
            return
        names = {dotted_name(n) for n in _walk_names(node)}
        for loop in loops:
            loop.compared |= {n for n in names if n}

    def end_file(self, ctx: FileContext) -> None:
        reported: set[cst.Call] = set()
        for loop in self._loops.values():
            if not (loop.fits and loop.varies and loop.evaluations):
                continue
            chosen = None
            for call, assigned, test in loop.evaluations:
                if assigned is not None and assigned in loop.compared:
                    chosen = (call, test)
                    break
            if chosen is None:
                for container, calls in loop.appended.items():
                    if container in self._maxed:
                        chosen = (calls[0], _mentions_test(calls[0]) or "the test set")
                        break
            if chosen is None or chosen[0] in reported:
                continue
            call, test = chosen
            reported.add(call)
            variables = ", ".join(code_span(v) for v in sorted(loop.variables))
            self.report(call, f"{code_span(short(ctx, call))} scores each candidate {variables} on {code_span(test)} and "
                              f"the loop keeps the best: the hyperparameter is chosen on the test set, so the test "
                              f"score overstates performance on new data; choose on a validation split or with "
                              f"cross-validation (GridSearchCV) and score the test set once")


def _walk_names(node: cst.CSTNode):
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, (cst.Name, cst.Attribute)) and dotted_name(current) is not None:
            yield current
            continue
        stack.extend(all_children(current))
