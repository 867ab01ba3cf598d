"""TR971 train-test-overlap: A model fit on test data, on train + test concatenated, or tuned on a split overlapping
the test set.
"""
from __future__ import annotations

import libcst as cst

from analyzers.context import (FileContext, argument, dotted_name, short)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.program.names import (TEST_WORDS as _TEST_WORDS, name_tokens as _name_tokens,
                                     mentions_test as _mentions_test)
from analyzers.program.flow import targets as _targets
from analyzers.program.library import (ROW_CONCATENATIONS, TRAIN_TEST_SPLITTERS, is_estimator_class, is_meta_estimator,
                                       learns_from_rows)


_VAL_WORDS = {"val", "valid", "validation", "dev"}


class TrainTestOverlap(Rule):
    id = "TR971"
    slug = "train-test-overlap"
    category = Category.DATA_LEAKAGE
    severity = Severity.HIGH
    requires = "sklearn"
    summary = "A model fit on test data, on train + test concatenated, or tuned on a split overlapping the test set"
    what = """
        Flags a second `train_test_split` of the same data that carves out a validation set
        (`X_val`) after a first split already took the test set from it, an estimator `fit` on
        training and test data concatenated back together
        (`model.fit(pd.concat([X_train, X_test]), ...)`), and a scikit-learn / XGBoost / LightGBM
        estimator fit on test data (`clf.fit(X_test, y_test)`; preprocessors are TR951's).
    """
    why = """
        Splitting the full data again draws the validation rows from everything, test rows
        included: the model is tuned on the test set. Fitting on train + test trains on the
        test rows outright. Either way the test score no longer measures generalization.
    """
    example = """
        X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2)
        X_tr, X_val, y_tr, y_val = train_test_split(X, y, test_size=0.2)
    """
    fix_example = """
        X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2)
        X_tr, X_val, y_tr, y_val = train_test_split(X_train, y_train, test_size=0.25)
    """
    VALID = [
        """
        from sklearn.model_selection import train_test_split
        X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2)
        X_tr, X_val, y_tr, y_val = train_test_split(X_train, y_train, test_size=0.25)
        """,
        """
        import pandas as pd
        from sklearn.linear_model import LogisticRegression
        model = LogisticRegression().fit(pd.concat([X_train, X_val]), y)
        """,
        # a scaler on test data is TR951's; a search object is fit on training data
        """
        from sklearn.preprocessing import StandardScaler
        from sklearn.linear_model import LogisticRegression
        scaler = StandardScaler()
        scaler.fit(X_test)
        clf = LogisticRegression()
        clf.fit(X_train, y_train)
        """,
    ]
    INVALID = [
        Invalid(
            """
            from sklearn.model_selection import train_test_split
            X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2, random_state=0)
            X_tr, X_val, y_tr, y_val = train_test_split(X, y, test_size=0.2, random_state=1)
            """,
            line=4, message="splits `X` again",
        ),
        Invalid(
            """
            import pandas as pd
            from sklearn.ensemble import RandomForestClassifier
            full = pd.concat([X_train, X_test])
            clf = RandomForestClassifier().fit(full, pd.concat([y_train, y_test]))
            """,
            line=5, message="`X_test`",
        ),
        Invalid(
            """
            from sklearn.linear_model import LogisticRegression
            clf = LogisticRegression(max_iter=1000)
            clf.fit(X_test, y_test)
            print(clf.score(X_test, y_test))
            """,
            line=4, message="trains `LogisticRegression` on `X_test`",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        # data name -> first split, its test part, the binding of the data name it split
        self._splits: dict[str, tuple[cst.Call, str, object]] = {}

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
        if name == "train_test_split" and ctx.qualified_name(func) in TRAIN_TEST_SPLITTERS:
            self._split(node, ctx)
        elif name == "fit" and isinstance(func, cst.Attribute) and node.args:
            self._fit(node, ctx)

    def _split(self, node: cst.Call, ctx: FileContext) -> None:
        data = dotted_name(argument(node, 0, "X"))
        parent = ctx.parent(node)
        if data is None or not isinstance(parent, cst.Assign) or len(parent.targets) != 1:
            return
        outputs = _targets(parent.targets[0].target)
        if len(outputs) < 2:
            return
        held_out = outputs[1]
        tokens = _name_tokens(held_out)
        first = self._splits.get(data)
        if first is None:
            if tokens & _TEST_WORDS:
                self._splits[data] = (node, held_out, ctx.binding(data))
            return
        if tokens & _VAL_WORDS and ctx.binding(data) is first[2]:  # the same data: not reassigned in between
            self.report(node, f"{code_span(short(ctx, node))} splits {code_span(data)} again: {code_span(held_out)} is "
                              f"drawn from all of {code_span(data)}, rows of {code_span(first[1])} included, so "
                              f"tuning on it tunes on the test set; split the training part "
                              f"({code_span(outputs[0])} of the first split) instead")

    def _fit(self, node: cst.Call, ctx: FileContext) -> None:
        receiver = node.func.value
        made = ctx.origin_call_name(receiver) or (ctx.call_name(receiver) if isinstance(receiver, cst.Call) else "") or ""
        if learns_from_rows(made):
            return
        data = node.args[0].value
        if is_estimator_class(made) and not is_meta_estimator(made):
            test = _mentions_test(data)
            if test is not None and "train" not in _name_tokens(test):
                self.report(node, f"{code_span(short(ctx, node))} trains {code_span(made.rsplit('.', 1)[-1])} on "
                                  f"{code_span(test)}: the model learns the test rows, so any score on them measures "
                                  f"memorization; fit on the training split")
                return
        value = ctx.origin(data) if isinstance(data, (cst.Name, cst.Attribute)) else data
        if not isinstance(value, cst.Call) or ctx.qualified_name(value.func) not in ROW_CONCATENATIONS or not value.args:
            return
        parts = value.args[0].value
        if not isinstance(parts, (cst.List, cst.Tuple)):
            return
        names = [dotted_name(e.value) or "" for e in parts.elements]
        test = next((n for n in names if _name_tokens(n) & _TEST_WORDS), None)
        train = next((n for n in names if "train" in _name_tokens(n)), None)
        if test is None or train is None:
            return
        self.report(node, f"{code_span(short(ctx, node))} fits on {code_span(train)} and {code_span(test)} concatenated: "
                          f"the model trains on the test rows, and any score on {code_span(test)} afterwards is "
                          f"meaningless; fit on the training data only")
