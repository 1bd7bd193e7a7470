"""Jinja rendering of the schedule templates into one self-contained CUDA translation unit.

Templates live in ``templates/`` (shipped inside the wheel as ``attncompiler/templates``); kernel
bodies are real headers under ``templates/include/attncompiler``.  :func:`render_source` inlines
those headers (each once, like ``#pragma once``) so that ``.source`` is exactly what NVRTC and
``nvcc`` compile, readable top to bottom, with no include path needed for our own code.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

import jinja2

__all__ = ["templates_dir", "render_source", "inline_includes", "TemplateError"]

_INCLUDE_RE = re.compile(r'^[ \t]*#include[ \t]+"(attncompiler/[A-Za-z0-9_./-]+)"[ \t]*$', re.MULTILINE)


class TemplateError(RuntimeError):
    """A template or header could not be found or rendered."""


def templates_dir() -> Path:
    """The template folder: inside the installed package, else the source checkout's ``templates/``."""
    here = Path(__file__).resolve().parent.parent
    for cand in (here / "templates", here.parent / "templates"):
        if (cand / "include" / "attncompiler").is_dir():
            return cand
    raise TemplateError(
        f"attncompiler templates not found: expected {here / 'templates'} (installed wheel) or "
        f"{here.parent / 'templates'} (source checkout); reinstall the package"
    )


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def inline_includes(source: str, include_dir: Path | None = None) -> str:
    """Replace each ``#include "attncompiler/..."`` line with the header's text, once per header."""
    root = include_dir or (templates_dir() / "include")
    seen: set[str] = set()

    def expand(text: str) -> str:
        def repl(m: re.Match[str]) -> str:
            rel = m.group(1)
            if rel in seen:
                return f"// (already included: {rel})"
            seen.add(rel)
            path = root / rel
            if not path.is_file():
                raise TemplateError(f"header {rel} not found under {root}")
            body = path.read_text().replace("#pragma once\n", "")
            return f"// ---- begin {rel} ----\n{expand(body)}\n// ---- end {rel} ----"

        return _INCLUDE_RE.sub(repl, text)

    return expand(source)


def render_source(template: str, **params: object) -> str:
    """Render ``templates/<template>`` with ``params`` and inline our headers."""
    try:
        text = _env().get_template(template).render(**params)
    except jinja2.TemplateNotFound as e:
        raise TemplateError(f"template {template!r} not found in {templates_dir()}") from e
    except jinja2.UndefinedError as e:
        raise TemplateError(f"template {template!r} needs a parameter that was not given: {e}") from e
    return inline_includes(text)
