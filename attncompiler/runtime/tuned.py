"""Tuned plans: what they are keyed by, how they are stored, and how they are looked up.

A tuned plan is stored with its :class:`TuneKey` -- GPU name, SM arch, CUDA runtime and driver
versions, package fingerprint (version + templates, headers and codegen modules), spec hash,
schedule tuned ("v1", "v2", "v3", or "auto": v2 and v3 candidates together), dtype, head dims
and seqlen bucket (next power of two of Nq) -- and the schedule that won
(:attr:`TuneResult.schedule`; entries written before it was recorded read back as the key's
schedule, so they stay usable) in one JSON file,
``<tuned dir>/plans.json`` (``ATTNCOMPILER_TUNED_DIR``, default ``<cache dir>/tuned``; in this
process only with ``ATTNCOMPILER_DISABLE_CACHE=1``).  Writers read-modify-write it under a
:class:`~.filelock.FileLock` and replace it atomically, so readers never see a torn file and
concurrent writers lose no entry.  :func:`find_tuned` is what ``compile(schedule="auto")`` asks;
:mod:`.autotune` produces the entries.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from .. import env
from .filelock import FileLock, atomic_write

__all__ = [
    "FORMAT_VERSION", "Shape", "TuneError", "DeviceInfo", "TuneKey", "TunedCandidate", "TuneResult", "TunedStore",
    "device_info", "package_fingerprint", "spec_hash", "seqlen_bucket", "tune_key", "store", "find_tuned",
    "lookup_tuned", "auto_lookup_order",
]

FORMAT_VERSION = 1
Shape = tuple[int, int, int, int]  # (B, H, N, D)


class TuneError(RuntimeError):
    """Tuning could not run (no GPU, bad shape) or no candidate produced a correct kernel."""


# --- keys -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceInfo:
    """What identifies a GPU and its software stack for tuning purposes."""

    gpu_name: str
    sm_arch: str  # "sm_90"
    cuda_runtime: str  # CUDA runtime version, e.g. "13000"
    driver: str  # CUDA driver API version, plus the kernel module's release where readable


def _driver_release() -> str:
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return ""
    for tok in text.split():
        if tok.count(".") >= 1 and tok.replace(".", "").isdigit():
            return tok
    return ""


@functools.lru_cache(maxsize=None)
def device_info(device: int | None = None) -> DeviceInfo:
    """:class:`DeviceInfo` of a CUDA device (default: the current one); raises TuneError without one."""
    import torch

    if not torch.cuda.is_available():
        raise TuneError("autotuning needs a CUDA GPU: expected torch.cuda.is_available(), got False")
    idx = torch.cuda.current_device() if device is None else int(device)
    props = torch.cuda.get_device_properties(idx)
    runtime = driver = "unknown"
    try:
        from cupy.cuda import runtime as rt

        runtime, driver = str(rt.runtimeGetVersion()), str(rt.driverGetVersion())
    except Exception:  # CuPy missing or too old: fall back to what torch knows
        runtime = str(torch.version.cuda)
    release = _driver_release()
    return DeviceInfo(gpu_name=str(props.name), sm_arch=f"sm_{props.major}{props.minor}", cuda_runtime=runtime,
                      driver=f"{driver}/{release}" if release else driver)


@functools.lru_cache(maxsize=1)
def package_fingerprint() -> str:
    """sha256 (16 hex digits) of the package version, every template and header file, and the
    codegen modules that render them (a change to any of them can change a kernel's speed)."""
    from .. import __version__
    from ..codegen.render import templates_dir

    h = hashlib.sha256(f"attncompiler {__version__}\0".encode())
    root = templates_dir()
    files = [(f"templates/{p.relative_to(root).as_posix()}", p) for p in root.rglob("*")
             if p.suffix in (".j2", ".cuh") and p.is_file()]
    codegen = Path(__file__).resolve().parent.parent / "codegen"
    files += [(f"codegen/{p.name}", p) for p in codegen.glob("*.py")]
    for name, p in sorted(files):
        h.update(name.encode() + b"\0")
        h.update(p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def spec_hash(ir: Any, ir_key: Optional[tuple] = None) -> str:
    """sha256 (16 hex digits) of the IR's structural key (score / mask expressions, dims, buffers);
    ``ir_key`` is ``ir.key()`` when the caller has it already."""
    return hashlib.sha256(repr(ir.key() if ir_key is None else ir_key).encode()).hexdigest()[:16]


def seqlen_bucket(n: int) -> int:
    """The next power of two >= n (n >= 1)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise TuneError(f"seqlen: expected a positive int, got {n!r}")
    return 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class TuneKey:
    """Everything a tuned plan depends on.  Stored as its fields; :meth:`digest` names the entry."""

    gpu_name: str
    sm_arch: str
    cuda_runtime: str
    driver: str
    package: str
    spec_hash: str
    schedule: str
    dtype: str
    head_dim: int
    head_dim_v: int
    seqlen_bucket: int

    def fields(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.fields(), sort_keys=True).encode()).hexdigest()[:32]

    def family(self) -> "TuneKey":
        """The key with the seqlen bucket erased: entries of one family differ only in the bucket."""
        return dataclasses.replace(self, seqlen_bucket=0)

    @classmethod
    def from_fields(cls, d: Mapping[str, Any]) -> "TuneKey":
        names = [f.name for f in dataclasses.fields(cls)]
        if sorted(d) != sorted(names):
            raise TuneError(f"tuned-plan key: expected fields {names}, got {sorted(d)}")
        return cls(**{n: d[n] for n in names})


def tune_key(ir: Any, seqlen: int, schedule: str = "v2", info: DeviceInfo | None = None,
             ir_key: Optional[tuple] = None) -> TuneKey:
    """The :class:`TuneKey` of ``ir`` at ``seqlen`` on ``info`` (default: the current device)."""
    dev = info if info is not None else device_info()
    return TuneKey(gpu_name=dev.gpu_name, sm_arch=dev.sm_arch, cuda_runtime=dev.cuda_runtime, driver=dev.driver,
                   package=package_fingerprint(), spec_hash=spec_hash(ir, ir_key), schedule=schedule,
                   dtype=str(ir.dtype),
                   head_dim=int(ir.head_dim), head_dim_v=int(ir.head_dim_v), seqlen_bucket=seqlen_bucket(seqlen))


# --- results and the store ------------------------------------------------------------------------
@dataclass(frozen=True)
class TunedCandidate:
    """One benchmarked plan: its options, time (inf if it failed) and why it failed."""

    options: Mapping[str, Any]
    ms: float
    error: Optional[str] = None
    model_rank: int = 0  # 1 = the model's choice
    schedule: str = ""  # the schedule the options are for ("": the key's)


@dataclass(frozen=True)
class TuneResult:
    """The outcome of tuning one key: the kept plan options (for ``schedule``, the winner: the key's
    schedule unless that is "auto") and every candidate's time.  ``default_*`` is the model's choice."""

    key: TuneKey
    shape: Shape
    options: Mapping[str, Any]
    ms: float
    default_options: Mapping[str, Any]
    default_ms: float
    candidates: tuple[TunedCandidate, ...] = ()
    from_cache: bool = False
    path: Optional[str] = field(default=None, compare=False)
    schedule: str = ""  # the schedule of ``options`` ("": the key's)
    default_schedule: str = ""  # the schedule of ``default_options`` ("": ``schedule``)

    def __post_init__(self) -> None:
        tuned = self.key.schedule
        sched = self.schedule or tuned
        if sched == "auto":
            raise TuneError("tuned plan: expected the winning schedule (v2 or v3) for a key tuned with 'auto', got none")
        object.__setattr__(self, "schedule", sched)
        object.__setattr__(self, "default_schedule", self.default_schedule or sched)
        if tuned != "auto" and any(not c.schedule for c in self.candidates):
            object.__setattr__(self, "candidates", tuple(c if c.schedule else dataclasses.replace(c, schedule=tuned)
                                                         for c in self.candidates))

    @property
    def speedup(self) -> float:
        """Model default time / kept time (>= 1; 1 when the model's choice was kept)."""
        return self.default_ms / self.ms if self.ms > 0 and math.isfinite(self.default_ms) else math.inf

    def to_json(self) -> dict[str, Any]:
        def num(x: float) -> Optional[float]:
            return x if math.isfinite(x) else None

        return {"key": self.key.fields(), "shape": list(self.shape), "schedule": self.schedule,
                "options": dict(self.options), "ms": self.ms, "default_schedule": self.default_schedule,
                "default_options": dict(self.default_options), "default_ms": num(self.default_ms),
                "candidates": [{"schedule": c.schedule, "options": dict(c.options), "ms": num(c.ms), "error": c.error,
                                "model_rank": c.model_rank} for c in self.candidates],
                "created": time.strftime("%Y-%m-%dT%H:%M:%S")}

    @classmethod
    def from_json(cls, d: Mapping[str, Any], *, path: Optional[str] = None) -> "TuneResult":
        def num(x: Any) -> float:
            return math.inf if x is None else float(x)

        cands = tuple(TunedCandidate(dict(c["options"]), num(c["ms"]), c.get("error"), int(c.get("model_rank", 0)),
                                     str(c.get("schedule") or ""))
                      for c in d.get("candidates", ()))
        # entries without "schedule" (written before it was recorded) are the key's schedule's
        return cls(key=TuneKey.from_fields(d["key"]), shape=tuple(d["shape"]), options=dict(d["options"]),
                   ms=float(d["ms"]), default_options=dict(d["default_options"]), default_ms=num(d["default_ms"]),
                   candidates=cands, from_cache=True, path=path, schedule=str(d.get("schedule") or ""),
                   default_schedule=str(d.get("default_schedule") or ""))


class TunedStore:
    """The tuned-plan file: {"format": 1, "entries": {digest: TuneResult JSON}}; readers see whole
    files (atomic replacement), writers serialize on ``<file>.lock``.  ``path`` None keeps the
    entries in memory (disk cache disabled)."""

    def __init__(self, path: Optional[Path]) -> None:
        self.path = path
        self._memory: dict[str, dict[str, Any]] = {}
        self._puts = 0
        self._seen: tuple[Any, dict[str, dict[str, Any]]] | None = None  # (stat signature, entries)

    @property
    def lock_path(self) -> Optional[Path]:
        return None if self.path is None else self.path.with_name(self.path.name + ".lock")

    def key_lock(self, key: TuneKey) -> Optional[FileLock]:
        """A lock held while ``key`` is being tuned (None without a disk store)."""
        return None if self.path is None else FileLock(self.path.parent / "locks" / f"{key.digest()}.lock")

    def _read_disk(self) -> dict[str, dict[str, Any]]:
        assert self.path is not None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return {}
        sig = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._seen is not None and self._seen[0] == sig:
            return self._seen[1]
        try:
            doc = json.loads(self.path.read_text())
            entries = doc["entries"] if doc.get("format") == FORMAT_VERSION else {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            print(f"[attncompiler] ignoring unreadable tuned-plan file {self.path}: {e}", file=sys.stderr)
            entries = {}
        self._seen = (sig, entries)
        return entries

    def entries(self) -> dict[str, dict[str, Any]]:
        return dict(self._memory) if self.path is None else dict(self._read_disk())

    def version(self) -> Any:
        """Changes whenever the stored entries may have changed (for callers' memo tables)."""
        if self.path is None:
            return len(self._memory), self._puts
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def get(self, key: TuneKey) -> Optional[TuneResult]:
        raw = self.entries().get(key.digest())
        if raw is None:
            return None
        try:
            res = TuneResult.from_json(raw, path=str(self.path) if self.path else None)
        except (KeyError, TypeError, ValueError, TuneError):
            return None
        return res if res.key == key else None

    def family(self, key: TuneKey) -> list[TuneResult]:
        """Every stored result whose key equals ``key`` up to the seqlen bucket."""
        out = []
        for raw in self.entries().values():
            try:
                res = TuneResult.from_json(raw, path=str(self.path) if self.path else None)
            except (KeyError, TypeError, ValueError, TuneError):
                continue
            if res.key.family() == key.family():
                out.append(res)
        return out

    def put(self, result: TuneResult) -> None:
        entry = result.to_json()
        if self.path is None:
            self._memory[result.key.digest()] = entry
            self._puts += 1
            return
        assert self.lock_path is not None
        with FileLock(self.lock_path):
            entries = dict(self._read_disk())
            entries[result.key.digest()] = entry
            atomic_write(self.path, json.dumps({"format": FORMAT_VERSION, "entries": entries}, indent=1,
                                               sort_keys=True))
            self._seen = None


_stores: dict[Optional[Path], TunedStore] = {}


def store() -> TunedStore:
    """The store the environment points at (one object per path, so its parse cache is shared)."""
    path = env.tuned_dir() / "plans.json" if env.disk_cache_enabled() else None
    if path not in _stores:
        _stores[path] = TunedStore(path)
    return _stores[path]


_found: dict[tuple, Optional[TuneResult]] = {}


def auto_lookup_order(sm_arch: str) -> tuple[str, ...]:
    """Key schedules whose entries ``compile(schedule="auto")`` may use on ``sm_arch``, preferred first:
    entries tuned with "auto" (they compared v2 and v3), then v3 (sm_90 only), then v2.  v1 entries are
    never used by "auto" (only by ``compile(spec, "v1", **options)``)."""
    return ("auto", "v3", "v2") if sm_arch == "sm_90" else ("auto", "v2")


def find_tuned(ir: Any, target: Any = None, seqlen: Optional[int] = None, *, schedule: str = "v2",
               nearest: bool = True, ir_key: Optional[tuple] = None) -> Optional[TuneResult]:
    """The tuned result for ``ir`` on the current GPU at ``seqlen``'s bucket, or None.

    ``schedule`` "v1" / "v2" / "v3" / "auto" asks for entries tuned with that schedule, except
    that "auto" means what ``compile(schedule="auto")`` uses: an entry of any key schedule in
    :func:`auto_lookup_order` -- the one nearest ``seqlen``'s bucket, at equal distance the first
    in that order.  The result's ``schedule`` is the plan's.  None also when tuned plans are disabled
    (``ATTNCOMPILER_USE_TUNED=0``), there is no GPU, or ``target`` is not the current GPU's arch.
    With ``nearest``, a missing bucket falls back to the family's nearest tuned bucket (``seqlen``
    None: the largest); any tuned plan is correct at every length, only its speed was measured at
    another.  ``ir_key`` (``ir.key()``) saves recomputing it; answers are memoized until the store
    changes, so this is cheap enough for every call.
    """
    if not env.use_tuned():
        return None
    st = store()
    version = st.version()
    if version is None or (st.path is None and not st.entries()):
        return None
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        info = device_info()
    except Exception:
        return None
    if target is not None and getattr(target, "name", target) != info.sm_arch:
        return None
    key = tune_key(ir, seqlen if seqlen is not None else 1, schedule, info, ir_key)
    memo = (st.path, version, key.family(), None if seqlen is None else key.seqlen_bucket, nearest)
    if memo in _found:
        return _found[memo]
    order = auto_lookup_order(info.sm_arch) if schedule == "auto" else (schedule,)
    hits = [(i, r) for i, s in enumerate(order)
            if (r := _find(st, dataclasses.replace(key, schedule=s), seqlen is not None, nearest)) is not None]
    res = None
    if hits and seqlen is not None:
        want = math.log2(key.seqlen_bucket)
        res = min(hits, key=lambda h: (abs(math.log2(h[1].key.seqlen_bucket) - want), -h[1].key.seqlen_bucket,
                                       h[0]))[1]
    elif hits:
        res = min(hits, key=lambda h: (-h[1].key.seqlen_bucket, h[0]))[1]
    if len(_found) > 4096:  # stale versions accumulate; start over
        _found.clear()
    _found[memo] = res
    return res


def _find(st: TunedStore, key: TuneKey, exact: bool, nearest: bool) -> Optional[TuneResult]:
    if exact:
        hit = st.get(key)
        if hit is not None or not nearest:
            return hit
    fam = st.family(key)
    if not fam:
        return None
    if not exact:
        return max(fam, key=lambda r: r.key.seqlen_bucket)
    want = math.log2(key.seqlen_bucket)
    return min(fam, key=lambda r: (abs(math.log2(r.key.seqlen_bucket) - want), -r.key.seqlen_bucket))


def lookup_tuned(ir: Any, target: Any = None, Nq: Optional[int] = None, *, schedule: str = "v2",
                 nearest: bool = True) -> Optional[dict[str, Any]]:
    """The tuned plan options (for ``compile(spec, schedule, **options)``), or None; see :func:`find_tuned`
    (with ``schedule="auto"`` the options are for the result's ``schedule``: use :func:`find_tuned`)."""
    res = find_tuned(ir, target, Nq, schedule=schedule, nearest=nearest)
    return None if res is None else dict(res.options)
