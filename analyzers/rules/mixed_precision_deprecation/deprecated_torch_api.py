"""TR811 deprecated-torch-api: Deprecated torch API (torch.qr, torch.cholesky, torch.ger, nn.UpsamplingBilinear2d,
functorch, ...).
"""
from __future__ import annotations

from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid
from analyzers.rules.mixed_precision_deprecation._removed_api import TableRule as _TableRule


class DeprecatedTorchApi(_TableRule):
    id = "TR811"
    syntactic = True
    slug = "deprecated-torch-api"
    category = Category.DEPRECATION
    severity = Severity.LOW
    summary = "Deprecated torch API (torch.qr, torch.cholesky, torch.ger, nn.UpsamplingBilinear2d, functorch, ...)"
    what = """
        Flags calls of deprecated PyTorch functions from one table: `torch.qr`, `torch.cholesky`,
        `torch.chain_matmul`, `torch.ger`, `torch.lu`, `torch.lu_solve`, `torch.svd`,
        `torch.triangular_solve`, `torch.range`, `nn.UpsamplingNearest2d/UpsamplingBilinear2d`,
        `F.upsample*`, `torch.norm`, `torch.testing.assert_allclose`, `nn.utils.weight_norm`,
        `torch.backends.cuda.sdp_kernel`, `torch.set_default_tensor_type`, `functorch.*`, and the
        underscore-less `nn.init.*` / `clip_grad_norm`, the private `_register_pytree_node` and
        torchvision's `transforms.v2.ToTensor`; also the `from ... import` of one of them and a
        mention without a call (`[v2.ToTensor, ...]`). Where the successor is a pure rename (same
        arguments, same results) it offers the rewrite; `from functorch import vmap` becomes
        `from torch.func import vmap`, leaving the calls as they are. Stays quiet when the repository pins a
        torch release older than the deprecation. `torch.norm` (deprecated in its docs, as in
        TorchFix's table) is rewritten only where it is certainly a vector norm: `p` a number and
        `dim` absent or one integer.
    """
    why = """
        Deprecated functions warn on every call, receive no fixes, and are removed in a later
        release (the `torch.solve` family already was). Their successors (`torch.linalg`,
        `torch.func`, `nn.Upsample`) are the maintained, better documented versions.
    """
    example = """
        q, r = torch.qr(A)
        up = nn.UpsamplingBilinear2d(scale_factor=2)
        m = torch.ger(a, b)
    """
    fix_example = """
        q, r = torch.linalg.qr(A)
        up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
        m = torch.outer(a, b)
    """
    VALID = [
        # the old function is only the default, replaced where the new one exists
        """
        import torch.nn as nn
        def apply_norm(layer):
            weight_norm = nn.utils.weight_norm
            if hasattr(nn.utils.parametrizations, "weight_norm"):
                weight_norm = nn.utils.parametrizations.weight_norm
            return weight_norm(layer)
        """,
        # the old name only as the fallback of an import preferring the new one
        """
        import torch
        def resample(k):
            try:
                from torch import vmap
            except ImportError:
                from functorch import vmap
            return vmap(k)(xs)
        """,
        """
        import torch
        q, r = torch.linalg.qr(A)
        m = torch.outer(a, b)
        xs = torch.arange(0, 10)
        """,
        """
        import torch
        import numpy as np
        q, r = np.linalg.qr(A)
        for i in range(10):
            pass
        """,
        # removed ones are TR810's
        """
        import torch
        x, _ = torch.solve(B, A)
        """,
        # an import the author guards: the newer spelling is the fallback
        """
        import torch
        try:
            from functorch import vmap
        except ImportError:
            from torch.func import vmap
        """,
        # the successor imported under the old name, the old one only as its fallback
        """
        import torch
        try:
            from torch.func import vmap
        except ImportError:
            from functorch import vmap
        batched = vmap(f)(xs)
        """,
        # the v1 ToTensor is not deprecated; attribute access on a symbol is not a use of it
        """
        import torch
        from torchvision import transforms
        steps = [transforms.ToTensor(), transforms.Normalize(mean, std)]
        doc = torch.qr.__doc__
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            q, r = torch.qr(A)
            """,
            line=3, message="is deprecated since PyTorch 1.9; use `torch.linalg.qr(A)`",
            fixed="""
            import torch
            q, r = torch.linalg.qr(A)
            """,
        ),
        Invalid(
            """
            import torch
            from torch import nn
            up = nn.UpsamplingBilinear2d(scale_factor=2)
            """,
            line=4,
            fixed="""
            import torch
            from torch import nn
            up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
            """,
        ),
        Invalid(
            """
            import torch
            import torch.nn.functional as F
            y = F.upsample(x, scale_factor=2, mode="nearest")
            """,
            line=4,
            fixed="""
            import torch
            import torch.nn.functional as F
            y = F.interpolate(x, scale_factor=2, mode="nearest")
            """,
        ),
        Invalid(
            """
            import torch
            u, s, v = torch.svd(A)
            """,
            message="returns `Vh`",
        ),
        Invalid(
            """
            import torch
            xs = torch.range(0, 9)
            """,
            line=3, message="includes its end point",
            fixed="""
            import torch
            xs = torch.arange(0, 10, dtype=torch.get_default_dtype())
            """,
        ),
        Invalid(
            """
            import torch
            p = torch.chain_matmul(a, b, c)
            s = torch.lu_solve(b, LU, piv)
            """,
            count=2,
            fixed="""
            import torch
            p = torch.linalg.multi_dot([a, b, c])
            s = torch.lu_solve(b, LU, piv)
            """,
        ),
        # literal flags have exact linalg spellings: some=False is mode="complete", upper=True the conjugate
        # transpose of the lower factor; chain_matmul's out= is multi_dot's
        Invalid(
            """
            import torch
            q, r = torch.qr(A, some=False)
            """,
            fixed="""
            import torch
            q, r = torch.linalg.qr(A, mode="complete")
            """,
        ),
        Invalid(
            """
            import torch
            U = torch.cholesky(cov, upper=True)
            """,
            fixed="""
            import torch
            U = torch.linalg.cholesky(cov).mH
            """,
        ),
        Invalid(
            """
            import torch
            torch.chain_matmul(a, b, c, out=buffer)
            L = torch.cholesky(cov, upper=is_upper)
            """,
            count=2,
            fixed="""
            import torch
            torch.linalg.multi_dot([a, b, c], out=buffer)
            L = torch.cholesky(cov, upper=is_upper)
            """,
        ),
        Invalid(
            """
            import torch
            import functorch
            batched = functorch.vmap(f)(xs)
            """,
            line=4, message="torch.func.vmap",
            fixed="""
            import torch
            import functorch
            batched = torch.func.vmap(f)(xs)
            """,
        ),
        # the import of a deprecated name is the line the port changes; calls through it are reported as well
        Invalid(
            """
            import torch
            from functorch import vmap, jacrev
            batched = vmap(f)(xs)
            """,
            line=3, message="imports `functorch.vmap`, `functorch.jacrev`, deprecated",
            fixed="""
            import torch
            from torch.func import vmap, jacrev
            batched = vmap(f)(xs)
            """,
        ),
        # a name that did not move with the others: the import is reported, the calls are rewritten one by one
        Invalid(
            """
            import torch
            from functorch import make_functional, vmap
            batched = vmap(f)(xs)
            """,
            line=3, count=2, message="import the successor instead (`vmap` → `torch.func.vmap`)",
        ),
        # ``from torch.linalg import qr as new_qr`` elsewhere in the file does not excuse ``torch.qr``
        Invalid(
            """
            import torch
            from torch.linalg import qr as new_qr
            q, r = torch.qr(A)
            """,
            line=4, message="use `torch.linalg.qr(A)`",
            fixed="""
            import torch
            from torch.linalg import qr as new_qr
            q, r = torch.linalg.qr(A)
            """,
        ),
        # the private pytree registration, renamed when it became public
        Invalid(
            """
            import torch
            import torch.utils._pytree as pytree
            pytree._register_pytree_node(Pair, flatten_pair, unflatten_pair)
            """,
            fixed="""
            import torch
            import torch.utils._pytree as pytree
            pytree.register_pytree_node(Pair, flatten_pair, unflatten_pair)
            """,
        ),
        # named without being called: a torchvision v2 pipeline listing the deprecated transform class
        Invalid(
            """
            import torch
            from torchvision.transforms import v2
            steps = [v2.ToTensor, v2.Normalize]
            """,
            line=4, message="is deprecated since torchvision 0.16",
        ),
        Invalid(
            """
            import torch
            torch.set_default_tensor_type(torch.DoubleTensor)
            """,
            fixed="""
            import torch
            torch.set_default_dtype(torch.float64)
            """,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn
            nn.init.xavier_uniform(m.weight, gain=2)
            """,
            message="torch.nn.init.xavier_uniform",
            fixed="""
            import torch
            import torch.nn as nn
            nn.init.xavier_uniform_(m.weight, gain=2)
            """,
        ),
        Invalid(
            """
            import torch as T
            dist = T.norm(a - b, dim=1)
            """,
            fixed="""
            import torch as T
            dist = T.linalg.vector_norm(a - b, dim=1)
            """,
        ),
        Invalid(
            """
            import torch
            total = torch.norm(grads, 2.0, -1, True)
            """,
            fixed="""
            import torch
            total = torch.linalg.vector_norm(grads, ord=2.0, dim=-1, keepdim=True)
            """,
        ),
        Invalid(
            """
            import torch
            nuclear = torch.norm(W, p="nuc")
            """,
            message="asks for a matrix norm",
        ),
        Invalid(
            """
            import torch
            conv = torch.nn.utils.weight_norm(torch.nn.Conv1d(4, 4, 3))
            """,
            message="parametrizations.weight.original0",
        ),
    ]
