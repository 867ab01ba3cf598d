"""TR822 removed-scipy-misc-image: scipy.misc.imread / imsave / imresize / toimage were removed from SciPy."""
from __future__ import annotations

import libcst as cst

from analyzers.context import (FileContext, dotted_name, short)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.versions import VersionFacts
from analyzers.rules.base import Invalid, Rule
from analyzers.program.roles import handles_other_versions as _handles_other_versions


# scipy.misc image helpers: deprecated in SciPy 1.0, removed in 1.2 (imresize in 1.3)
_SCIPY_MISC = {
    "imread": "`imageio.v3.imread(path)` or `PIL.Image.open(path)`",
    "imsave": "`imageio.v3.imwrite(path, image)` or `PIL.Image.fromarray(image).save(path)`",
    "imresize": "`PIL.Image.fromarray(image).resize(size)` or `skimage.transform.resize`",
    "toimage": "`PIL.Image.fromarray(array)`",
    "fromimage": "`numpy.asarray(image)`",
    "imrotate": "`PIL.Image.rotate` or `scipy.ndimage.rotate`",
    "imfilter": "`PIL.ImageFilter`",
    "bytescale": "an explicit rescale to uint8",
}


class RemovedScipyMiscImage(Rule):
    id = "TR822"
    syntactic = True
    slug = "removed-scipy-misc-image"
    pinned_package = "scipy"
    category = Category.DEPRECATION
    severity = Severity.HIGH
    summary = "scipy.misc.imread / imsave / imresize / toimage were removed from SciPy"
    what = """
        Flags `scipy.misc.imread`, `imsave`, `imresize`, `toimage`, `fromimage`, `imrotate`,
        `imfilter` and `bytescale`, used as attributes or imported from `scipy.misc`. Quiet when
        the repository pins SciPy below 1.3.
    """
    why = """
        These PIL wrappers were deprecated in SciPy 1.0 and removed in 1.2 (`imresize` in
        1.3): the call raises AttributeError (the import, ImportError) on every current install,
        typically when a training script first saves sample images, hours into a run.
    """
    example = """
        scipy.misc.imsave(path, merged)
    """
    fix_example = """
        imageio.v3.imwrite(path, merged)
    """
    VALID = [
        """
        import torch
        import imageio
        from scipy import ndimage
        imageio.v3.imwrite(path, merged)
        face = scipy.datasets.face()
        """,
        """
        import torch
        try:
            from scipy.misc import imread
        except ImportError:
            from imageio import imread
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import scipy.misc
            def save_samples(path, merged):
                scipy.misc.imsave(path, merged)
            """,
            line=5, message="`scipy.misc.imsave`",
        ),
        Invalid(
            """
            import torch
            from scipy.misc import imread, imresize
            """,
            line=3, message="`imread`, `imresize`",
        ),
    ]

    def visit_Attribute(self, node: cst.Attribute, ctx: FileContext) -> None:
        name = node.attr.value
        if name not in _SCIPY_MISC or ctx.qualified_name(node) != f"scipy.misc.{name}":
            return
        if _handles_other_versions(ctx, node) or not ctx.facts(VersionFacts).admits("scipy", (1, 3)):
            return
        self.report(node, f"{code_span(short(ctx, node))} was removed from SciPy (1.2/1.3): it raises AttributeError on "
                          f"current installs; use {_SCIPY_MISC[name]}")

    def visit_ImportFrom(self, node: cst.ImportFrom, ctx: FileContext) -> None:
        if node.relative or node.module is None or dotted_name(node.module) != "scipy.misc" or \
                isinstance(node.names, cst.ImportStar):
            return
        removed = [n for n in (dotted_name(a.name) for a in node.names) if n in _SCIPY_MISC]
        if not removed or _handles_other_versions(ctx, node) or not ctx.facts(VersionFacts).admits("scipy", (1, 3)):
            return
        shown = ", ".join(code_span(n) for n in removed)
        instead = "; ".join(f"{code_span(n)}: {_SCIPY_MISC[n]}" for n in removed)
        self.report(node, f"{shown} from `scipy.misc` were removed from SciPy (1.2/1.3): this import raises "
                          f"ImportError on current installs; use instead {instead}")
