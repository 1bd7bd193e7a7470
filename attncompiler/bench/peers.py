"""The peers: torch SDPA backends (flash, cuDNN, efficient, math) and FlexAttention (torch.compile'd).

Each peer is an :class:`~attncompiler.bench.measure.Impl` computing the same attention as the
attncompiler kernel of a case, on the same (B, H, N, d) bf16 tensors:

* SDPA: ``is_causal`` for causal cases; the variants that SDPA can express take an additive bf16
  ``attn_mask`` built once per case outside the timing (ALiBi bias with -inf above the diagonal,
  sliding window, document), dropout uses ``dropout_p``.  One backend is enabled at a time with
  ``sdpa_kernel``, so a backend that cannot take the inputs raises (recorded, not fatal) instead of
  silently falling back to another.
* FlexAttention: one ``torch.compile(flex_attention)`` for the whole run (dynamic shapes by
  default, so it compiles once per mask/score_mod, head dim and grad mode instead of once per
  shape; a key whose dynamic compile fails falls back to static shapes), a ``create_block_mask``
  per mask and N, and mod functions created once so that dynamo does not recompile on a new closure.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

from .grid import Case, VariantParams
from .measure import Impl, classify_error, is_fatal_cuda_error

__all__ = ["SDPA_BACKENDS", "sdpa_impl", "sdpa_attn_mask", "Flex", "raise_recompile_limits"]

SDPA_BACKENDS = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION",
                 "sdpa_efficient": "EFFICIENT_ATTENTION", "sdpa_math": "MATH"}


def sdpa_impl(name: str, causal: bool, attn_mask: Any = None, dropout_p: float = 0.0) -> Impl:
    """``F.scaled_dot_product_attention`` with only backend ``name`` enabled."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if name not in SDPA_BACKENDS:
        raise ValueError(f"SDPA backend: expected one of {sorted(SDPA_BACKENDS)}, got {name!r}")
    backend = getattr(SDPBackend, SDPA_BACKENDS[name])
    is_causal = causal and attn_mask is None

    def call(q: Any, k: Any, v: Any) -> Any:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)
    return Impl(name, call, lambda: sdpa_kernel([backend]),
                note="additive attn_mask" if attn_mask is not None else "")


def sdpa_attn_mask(case: Case, params: VariantParams, device: str = "cuda", dtype: Any = None) -> Any:
    """The additive attn_mask (``dtype``, default bf16: the inputs') for SDPA of a variant case,
    shape (1, H or 1, N, N); None when the case needs none."""
    import torch

    dtype = torch.bfloat16 if dtype is None else dtype
    from ..spec.presets import alibi_slopes, document_ids

    N, v = case.N, case.variant
    if v not in ("alibi", "sliding_window", "document"):
        return None
    qi = torch.arange(N, device=device, dtype=torch.int32)[:, None]
    ki = torch.arange(N, device=device, dtype=torch.int32)[None, :]
    neg = float("-inf")
    if v == "alibi":
        slopes = alibi_slopes(case.H).to(device)
        bias = torch.empty(1, case.H, N, N, device=device, dtype=dtype)
        dist = (ki - qi).to(torch.float32)
        hidden = ki > qi if case.causal else None
        for h in range(case.H):  # one (N, N) float32 temporary at a time
            b = dist * slopes[h]
            if hidden is not None:
                b.masked_fill_(hidden, neg)
            bias[0, h] = b
        return bias
    if v == "sliding_window":
        visible = (qi >= ki) & (qi - ki <= params.window)
    else:
        ids = document_ids(N, params.num_docs).to(device)
        visible = ids[:, None] == ids[None, :]
    mask = torch.zeros(1, 1, N, N, device=device, dtype=dtype)
    mask[0, 0].masked_fill_(~visible, neg)
    return mask


def raise_recompile_limits(per_code: int = 256, total: int = 4096) -> None:
    """FlexAttention compiles once per mask/score_mod, head dim and grad mode, all on one code object:
    past dynamo's recompile limit it would silently run eager (and time the wrong thing)."""
    import torch._dynamo

    cfg = torch._dynamo.config
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, val in (("recompile_limit", per_code), ("cache_size_limit", per_code),
                          ("accumulated_recompile_limit", total), ("accumulated_cache_size_limit", total)):
            if hasattr(cfg, name):
                try:
                    setattr(cfg, name, max(int(getattr(cfg, name)), val))
                except Exception:  # an alias that refuses writes
                    pass


class Flex:
    """FlexAttention peer: one compiled ``flex_attention`` for the run, block masks and mods cached."""

    def __init__(self, *, dynamic: bool = True, device: str = "cuda", max_seqlen: int = 16384) -> None:
        import torch
        from torch.nn.attention.flex_attention import flex_attention

        raise_recompile_limits()
        # The timing loop replays one backward graph (retain_graph=True); AOTAutograd's donated
        # buffers forbid that ("compiled with non-empty donated buffers ..."), so they are off for
        # the benchmark process.  It costs FlexAttention's backward nothing measurable.
        import torch._functorch.config as functorch_config

        functorch_config.donated_buffer = False
        self.dynamic = dynamic
        self.device = device
        self._flex = flex_attention
        self._compiled = torch.compile(flex_attention, dynamic=dynamic)
        self._static: Callable[..., Any] | None = None
        self._static_keys: dict[tuple, str] = {}  # keys compiled with static shapes -> why
        self._failed: dict[tuple, str] = {}
        self._mods: dict[tuple, Callable[..., Any]] = {}
        self._block_masks: dict[tuple, Any] = {}
        self._doc = torch.zeros(max_seqlen, device=device, dtype=torch.int32)
        self._doc_n = 0

    # mods are created once per parameter so that dynamo sees the same function object every call
    def _mod(self, key: tuple) -> Callable[..., Any]:
        if key in self._mods:
            return self._mods[key]
        import torch

        from ..spec.presets import alibi_slopes

        kind = key[0]
        if kind == "causal":
            def fn(b: Any, h: Any, q: Any, k: Any) -> Any:
                return q >= k
        elif kind == "sliding_window":
            w = int(key[1])

            def fn(b: Any, h: Any, q: Any, k: Any) -> Any:
                return (q >= k) & (q - k <= w)
        elif kind == "document":
            doc = self._doc

            def fn(b: Any, h: Any, q: Any, k: Any) -> Any:
                return doc[q] == doc[k]
        elif kind == "alibi":
            slopes = alibi_slopes(int(key[1])).to(self.device)

            def fn(score: Any, b: Any, h: Any, q: Any, k: Any) -> Any:  # type: ignore[misc]
                return score + slopes[h] * (k - q)
        elif kind == "softcap":
            cap = float(key[1])

            def fn(score: Any, b: Any, h: Any, q: Any, k: Any) -> Any:  # type: ignore[misc]
                return cap * torch.tanh(score / cap)
        else:
            raise ValueError(f"flex mod: expected causal, sliding_window, document, alibi or softcap, got {kind!r}")
        self._mods[key] = fn
        return fn

    def _block_mask(self, key: tuple, N: int) -> Any:
        from torch.nn.attention.flex_attention import create_block_mask

        bk = (key, N)
        if bk not in self._block_masks:
            self._block_masks[bk] = create_block_mask(self._mod(key), None, None, N, N, device=self.device)
        return self._block_masks[bk]

    def _set_documents(self, N: int, num_docs: int) -> None:
        import torch

        from ..spec.presets import document_ids

        if N > self._doc.numel():
            self._doc = torch.zeros(N, device=self.device, dtype=torch.int32)
            self._mods = {k: v for k, v in self._mods.items() if k[0] != "document"}
            self._block_masks = {k: v for k, v in self._block_masks.items() if k[0][0] != "document"}
        if self._doc_n != N:
            self._doc[:N] = document_ids(N, num_docs).to(self.device)
            self._doc_n = N

    def clear(self) -> None:
        """Drop cached block masks (keeps compiled code)."""
        self._block_masks.clear()

    def impl(self, case: Case, params: VariantParams) -> Impl:
        """The FlexAttention call for ``case`` (mods and block mask prepared here, outside any timing)."""
        v = case.variant
        score_mod = None
        mask_key: tuple | None = ("causal",) if case.causal else None
        if v == "alibi":
            score_mod = self._mod(("alibi", case.H))
        elif v == "softcap":
            score_mod = self._mod(("softcap", params.softcap))
        elif v == "sliding_window":
            mask_key = ("sliding_window", params.window)
        elif v == "document":
            self._set_documents(case.N, params.num_docs)
            mask_key = ("document", params.num_docs)
        elif v == "dropout":
            raise NotImplementedError("FlexAttention has no dropout")
        block_mask = self._block_mask(mask_key, case.N) if mask_key else None
        key = (case.d, v, case.causal)
        impl = Impl("flex", lambda q, k, v_: None, note="dynamic shapes" if self.dynamic else "static shapes")

        def call(q: Any, k: Any, v_: Any) -> Any:
            import torch

            gkey = (key, torch.is_grad_enabled())  # inference and training graphs compile separately
            if gkey in self._failed:
                raise RuntimeError(self._failed[gkey])
            static = gkey in self._static_keys
            fn = self._static_fn() if static else self._compiled
            if static:
                impl.note = self._static_keys[gkey]
            try:
                return fn(q, k, v_, score_mod=score_mod, block_mask=block_mask)
            except Exception as e:
                status, msg = classify_error(e)
                if status == "oom" or is_fatal_cuda_error(e):
                    raise
                if static or not self.dynamic:
                    self._failed[gkey] = f"compile failed before, not retried: {msg}"
                    raise
            try:  # this key with static shapes from now on (one compile per shape)
                out = self._static_fn()(q, k, v_, score_mod=score_mod, block_mask=block_mask)
            except Exception as e2:
                self._failed[gkey] = f"compile failed before, not retried (dynamic: {msg[:150]}; static: " \
                                     f"{classify_error(e2)[1][:150]})"
                raise
            self._static_keys[gkey] = impl.note = f"static shapes (dynamic compile failed: {msg[:120]})"
            return out
        impl.call = call
        return impl

    def _static_fn(self) -> Callable[..., Any]:
        if self._static is None:
            import torch

            self._static = torch.compile(self._flex, dynamic=False)
        return self._static
