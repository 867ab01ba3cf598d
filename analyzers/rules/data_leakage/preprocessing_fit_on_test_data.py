"""TR951 preprocessing-fit-on-test-data: scikit-learn preprocessor fit on test/validation data or on the full data
before the split.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import libcst as cst

from analyzers.context import (Binding, FileContext, FunctionNode, argument, call_receiver, dotted_name,
                               keyword_arg, method_name, positional_args, short)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.data import data_names, preprocessor_of
from analyzers.program.library import (CROSS_VALIDATION_FUNCTIONS, LABEL_ENCODERS, TRAIN_TEST_SPLITTERS,
                                       is_model_selection)
from analyzers.program.names import name_words
from analyzers.rules.base import Invalid, Rule


_HELD_OUT = {"test", "tests", "testing", "val", "valid", "validation", "holdout", "dev", "eval"}


def _held_out_token(token: str) -> bool:
    if token in _HELD_OUT:
        return True
    if token[:1] in ("x", "y") and token[1:] in _HELD_OUT:
        return True  # Xtest, yval
    for suffix in ("set", "data", "df", "ds"):
        if token.endswith(suffix) and token[: -len(suffix)] in _HELD_OUT:
            return True  # testset, valdata
    return False


@dataclass
class _Fit:
    node: cst.Call
    label: str  # ``StandardScaler `scaler` ``, Markdown
    receiver: str  # dotted receiver ("scaler"), or "" for ``StandardScaler().fit(...)``
    data: str  # source text of the data argument
    data_name: Optional[str]  # plain dotted data name (``X``) for the split check
    data_binding: Optional[Binding]
    function: Optional[FunctionNode]
    method: str


class PreprocessingFitOnTestData(Rule):
    id = "TR951"
    slug = "preprocessing-fit-on-test-data"
    category = Category.DATA_LEAKAGE
    severity = Severity.CRITICAL
    requires = "sklearn"
    summary = "scikit-learn preprocessor fit on test/validation data or on the full data before the split"
    what = """
        Flags `fit`/`fit_transform` of a scikit-learn preprocessor (scalers and encoders from
        `sklearn.preprocessing`, text vectorizers, `PCA` and other decompositions, imputers,
        feature selectors, and pipelines/column transformers made of them) when it is called
        on test or validation data (`X_test`, `x_val`, `test_df["text"]`, `val_texts`...) or on
        data that is split afterwards (`X = scaler.fit_transform(X)` followed by
        `train_test_split(X, ...)`, `KFold().split(X)` or `cross_val_score(model, X, ...)`).
    """
    why = """
        A preprocessor's fit learns statistics — means, variances, vocabularies, categories,
        principal components — from the rows it sees. Learning them from test rows leaks
        information about the evaluation data into the model, so the reported score is
        optimistic and does not carry over to new data.
    """
    example = """
        scaler = StandardScaler()
        X = scaler.fit_transform(X)
        X_train, X_test, y_train, y_test = train_test_split(X, y)
    """
    fix_example = """
        X_train, X_test, y_train, y_test = train_test_split(X, y)
        scaler = StandardScaler()
        X_train = scaler.fit_transform(X_train)
        X_test = scaler.transform(X_test)
        # or: make_pipeline(StandardScaler(), model) with cross_val_score
    """
    VALID = [
        """
        from sklearn.preprocessing import StandardScaler
        from sklearn.model_selection import train_test_split
        X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2)
        scaler = StandardScaler()
        X_train = scaler.fit_transform(X_train)
        X_test = scaler.transform(X_test)
        """,
        """
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler
        from sklearn.linear_model import LogisticRegression
        from sklearn.model_selection import cross_val_score
        pipe = make_pipeline(StandardScaler(), LogisticRegression())
        scores = cross_val_score(pipe, X, y, cv=5)
        """,
        # fitting a model (not a preprocessor) and a stateless transformer
        """
        from sklearn.linear_model import LogisticRegression
        from sklearn.preprocessing import Normalizer
        clf = LogisticRegression().fit(X_train, y_train)
        Xn = Normalizer().fit_transform(X_test)
        """,
        # train in the name; names that only look like "val"
        """
        from sklearn.feature_extraction.text import TfidfVectorizer
        vec = TfidfVectorizer()
        vec.fit(train_texts + val_texts)
        imputer_values = vec.transform(interval_texts)
        """,
        # a KFold loop fitting on the training fold
        """
        from sklearn.model_selection import KFold
        from sklearn.preprocessing import MinMaxScaler
        for tr, te in KFold(5).split(X):
            sc = MinMaxScaler()
            sc.fit(X[tr])
        """,
    ]
    INVALID = [
        Invalid(
            """
            from sklearn.preprocessing import StandardScaler
            scaler = StandardScaler()
            X_train_s = scaler.fit_transform(X_train)
            X_test_s = scaler.fit_transform(X_test)
            """,
            line=5, message="StandardScaler `scaler` is fit on test/validation data `X_test`",
        ),
        Invalid(
            """
            from sklearn import preprocessing as pp
            from sklearn.model_selection import train_test_split
            scaler = pp.MinMaxScaler()
            X = scaler.fit_transform(X)
            X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25)
            """,
            line=5, message="before `train_test_split",
        ),
        Invalid(
            """
            import sklearn.feature_extraction.text as text
            vectorizer = text.TfidfVectorizer(max_features=5000)
            X_val = vectorizer.fit_transform(val_df["text"])
            """,
            line=4, message='val_df["text"]',
        ),
        Invalid(
            """
            from sklearn.decomposition import PCA
            from sklearn.model_selection import StratifiedKFold
            pca = PCA(n_components=10)
            X_red = pca.fit_transform(X)
            skf = StratifiedKFold(n_splits=5)
            for tr, te in skf.split(X_red, y):
                pass
            """,
            line=5, message="PCA `pca`",
        ),
        Invalid(
            """
            from sklearn.pipeline import Pipeline
            from sklearn.impute import SimpleImputer
            from sklearn.preprocessing import StandardScaler
            prep = Pipeline([("impute", SimpleImputer()), ("scale", StandardScaler())])
            prep.fit(X_holdout)
            """,
            line=6, message="Pipeline(SimpleImputer, StandardScaler)",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.fits: list[_Fit] = []
        self.reported: set[int] = set()
        self.transformed: set[str] = set()  # receivers later used with .transform()
        self.split_hits: list[tuple[_Fit, str, bool]] = []  # (fit, split text, data-only match)

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = method_name(node)
        if name is None:
            return
        if name in ("fit", "fit_transform"):
            self._fit(node, name, ctx)
        elif name == "transform":
            receiver = dotted_name(call_receiver(node))
            if receiver is not None:
                self.transformed.add(receiver)
        elif self.fits and name in ("train_test_split", "split", "cross_val_score", "cross_validate",
                                    "cross_val_predict"):
            self._split(node, name, ctx)

    def _fit(self, node: cst.Call, method: str, ctx: FileContext) -> None:
        receiver = call_receiver(node)
        if receiver is None:
            return
        made = receiver if isinstance(receiver, cst.Call) else ctx.origin(receiver)
        if not isinstance(made, cst.Call):
            return
        kind = preprocessor_of(made, ctx)
        if kind is None:
            return
        data = argument(node, 0, "X")
        if data is None:
            for keyword in ("raw_documents", "y"):
                kw = keyword_arg(node, keyword)
                if kw is not None:
                    data = kw.value
                    break
        if data is None:
            return
        receiver_name = dotted_name(receiver) or ""
        label = f"{kind} {code_span(receiver_name)}" if receiver_name else code_span(f"{kind}()")
        data_text = short(ctx, data, 50)
        names = data_names(data, ctx)
        tokens = [t for n in names for t in name_words(n)]
        if any("train" in t for t in tokens):
            return
        if any(_held_out_token(t) for t in tokens):
            self.reported.add(id(node))
            self.report(node, f"{label} is fit on test/validation data {code_span(data_text)}: the statistics it "
                              f"learns leak the held-out rows into the model and inflate the score; fit on the "
                              f"training split and only `.transform()` {code_span(data_text)}")
            return
        if kind in LABEL_ENCODERS:
            return
        data_name = dotted_name(data) if isinstance(data, (cst.Name, cst.Attribute)) else None
        binding = ctx.binding(data_name) if data_name else None
        self.fits.append(_Fit(node, label, receiver_name, data_text, data_name, binding, ctx.function, method))

    def _split(self, node: cst.Call, name: str, ctx: FileContext) -> None:
        if name == "split":
            receiver = call_receiver(node)
            made = receiver if isinstance(receiver, cst.Call) else ctx.origin(receiver)
            splitter = ctx.call_name(made) if isinstance(made, cst.Call) else None
            if not is_model_selection(splitter):
                return
            arrays = [argument(node, 0, "X")]
        else:
            qualified = ctx.call_name(node)
            if qualified in TRAIN_TEST_SPLITTERS:
                arrays = [a.value for a in positional_args(node)]
            elif qualified in CROSS_VALIDATION_FUNCTIONS:
                arrays = [argument(node, 1, "X")]
            else:
                return
        function = ctx.function
        for array in arrays:
            array_name = dotted_name(array) if isinstance(array, (cst.Name, cst.Attribute)) else None
            if array_name is None:
                continue
            binding = ctx.binding(array_name)
            if binding is None:
                continue
            for fit in self.fits:
                if fit.function is not function or id(fit.node) in self.reported:
                    continue
                produced = binding.kind in ("assign", "annassign") and ctx.inside(fit.node, binding.node)
                same_data = fit.data_binding is binding and fit.data_name == array_name
                if produced or same_data:
                    self.reported.add(id(fit.node))
                    self.split_hits.append((fit, short(ctx, node, 60), not produced))

    def end_file(self, ctx: FileContext) -> None:
        for fit, split, data_only in self.split_hits:
            if data_only and fit.receiver not in self.transformed:
                continue  # fit on everything but never used to transform anything: exploration
            self.report(fit.node, f"{fit.label} is fit on {code_span(fit.data)} before {code_span(split)} splits it: "
                                  f"statistics of the "
                                  f"test rows leak into training; split first and fit on the training part only "
                                  f"(or put the preprocessor in a Pipeline)")
