"""The report's sections (sections.py) laid out as Markdown and as self-contained HTML.

The report opens with its first section (the answer), then a contents list that links to every
section and says how to read the tables; the run list and the provenance close it.
Texts may mark code as Markdown does (`single`): Markdown keeps it, the HTML makes it <code>.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from .tables import formatted, markdown_table, numeric_columns, wrapping_columns

TITLE = "Data-parallel Faster R-CNN benchmark: report"
# Read at 1400 px and up: the page is as wide as the window allows up to 1320 px, paragraphs
# keep a readable measure, and every table fits without scrolling (tests/finished_demo: a
# browser checks it): prose cells wrap at their spaces, ids and numbers never break, numbers
# are right-aligned. The box around a table scrolls only where a window is narrower still.
CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1320px;margin:1.5em auto;padding:0 1.5em;"
    "color:#222;line-height:1.45}p,li,figcaption{max-width:62em}"
    "nav.contents{background:#f5f5f5;padding:.5em 1em;margin:1em 0}nav.contents ol{margin:.3em 0}"
    "nav.contents p{margin:0}nav.contents p:first-child{font-weight:bold}"
    "div.table{overflow-x:auto;margin:1em 0}table{border-collapse:collapse;font-size:.87em}"
    "th,td{border-bottom:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}"
    "th{vertical-align:bottom}th.num,td.num{text-align:right}td.num{white-space:nowrap;"
    "font-variant-numeric:tabular-nums}td.key,span.id{white-space:nowrap}p.note{font-size:.87em}"
    "code{font-size:.95em;background:#f3f3f3;padding:0 .2em}"
    "img{max-width:100%}figure{margin:1.5em 0}figcaption{font-size:.9em}"
)


@dataclass(frozen=True, eq=False)
class Section:
    """One section of the report: a title and any of: paragraphs, a table (a frame as a reader
    sees it, tables.formatted; one not yet formatted gets formatted), bullets, and figures
    ((name, path, caption) triples)."""

    title: str
    text: Sequence[str] = ()
    table: pd.DataFrame | None = None
    bullets: Sequence[str] = ()
    figures: Sequence[tuple[str, str, str]] = ()


def anchor(title: str) -> str:
    """A section's anchor, as GitHub makes it from a Markdown heading: 'Table 1: COCO box AP'
    -> 'table-1-coco-box-ap'; the HTML report uses the same."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


# Under the contents list: how to read every table.
READING = (
    "Tables give the mean over an entry's seeds ± their standard deviation, and n, the "
    "number of runs; n/a marks a number that does not exist, - an empty field. Skipped "
    "and failed runs are left out of the tables and figures and listed with their reason "
    "under Runs, at the end."
)


def _contents(sections: list[Section]) -> list[tuple[str, str]]:
    """(title, anchor) of every section after the first (the answer), for the contents list."""
    return [(s.title, anchor(s.title)) for s in sections[1:]]


def _table(section: Section) -> pd.DataFrame | None:
    """The section's table as a reader sees it (a frame not yet formatted gets formatted)."""
    table = section.table
    if table is None or "notes" in table.attrs:
        return table
    return formatted(table, {})


def render_markdown(sections: list[Section]) -> str:
    out = [f"# {TITLE}\n"]
    for i, section in enumerate(sections):
        out.append(f"## {section.title}\n")
        out += [text + "\n" for text in section.text]
        table = _table(section)
        if table is not None:
            out.append(markdown_table(table))
        if section.bullets:
            out.append("".join(f"- {b}\n" for b in section.bullets))
        out += [f"![{caption}]({path})\n" for _, path, caption in section.figures]
        if i == 0:  # the answer first, then where everything else is
            out.append(
                "**Contents**\n\n"
                + "".join(f"- [{title}](#{slug})\n" for title, slug in _contents(sections))
                + f"\n{READING}\n"
            )
    return "\n".join(out)


# A run or entry id (ps-colocated-w2-b2-s0), which a browser would otherwise break at a hyphen
RUN_ID = re.compile(r"(?<![\w-])(?=[\w-]*\d)[a-z]\w*(?:-\w+)+")


def _inline(text: str) -> str:
    """Text for HTML: escaped, with Markdown's `code` as <code> (no Markdown left raw), and run
    ids kept whole on their line."""
    escaped = re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(text))
    return RUN_ID.sub(lambda m: f"<span class='id'>{m.group(0)}</span>", escaped)


def html_table(shown: pd.DataFrame) -> str:
    """A table as a reader sees it: numbers right-aligned and never broken, ids never broken,
    prose wrapping at its spaces; its notes under it."""
    numeric, wrap = numeric_columns(shown), wrapping_columns(shown)
    kinds = ["num" if n else "" if w else "key" for n, w in zip(numeric, wrap, strict=False)]
    cls = [f" class='{k}'" if k else "" for k in kinds]
    head = "".join(f"<th{c}>{_inline(str(h))}</th>" for c, h in zip(cls, shown.columns, strict=False))
    rows = "".join(
        "<tr>" + "".join(f"<td{c}>{_inline(str(v))}</td>" for c, v in zip(cls, row, strict=False)) + "</tr>"
        for row in shown.itertuples(index=False)
    )
    notes = "".join(f"<p class='note'>{_inline(n)}</p>" for n in shown.attrs.get("notes") or [])
    return f"<div class='table'><table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>{notes}"


def render_html(sections: list[Section], pngs: dict[str, bytes]) -> str:
    """The whole report in one file: figures are embedded, nothing is fetched from elsewhere."""
    esc = html.escape
    out = [
        "<!DOCTYPE html>",
        "<html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>{TITLE}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>{TITLE}</h1>",
    ]
    for i, section in enumerate(sections):
        out.append(f"<section id='{anchor(section.title)}'><h2>{esc(section.title)}</h2>")
        out += [f"<p>{_inline(text)}</p>" for text in section.text]
        table = _table(section)
        if table is not None:
            out.append(html_table(table))
        if section.bullets:
            out.append("<ul>" + "".join(f"<li>{_inline(b)}</li>" for b in section.bullets) + "</ul>")
        for name, _, caption in section.figures:
            data = base64.b64encode(pngs[name]).decode("ascii")
            out.append(
                f"<figure id='figure-{name}'><img alt='{esc(caption)}' "
                f"src='data:image/png;base64,{data}'><figcaption>{esc(caption)}"
                "</figcaption></figure>"
            )
        out.append("</section>")
        if i == 0:  # the answer first, then where everything else is
            out.append(
                "<nav class='contents' aria-label='Contents'><p>Contents</p><ol>"
                + "".join(f"<li><a href='#{slug}'>{esc(title)}</a></li>" for title, slug in _contents(sections))
                + f"</ol><p class='reading'>{esc(READING)}</p></nav>"
            )
    return "\n".join(out + ["</body></html>"]) + "\n"


# The end of a sentence in the answer: its words never hold one (numbers are 0.969x, not "0. 9").
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def answer_sentence(markdown: str) -> str | None:
    """The first sentence of the answer in a report.md that render_markdown wrote (its first
    section's first paragraph: the verdict, verdict.py), as the workflow's last words quote it;
    None where the report has no section."""
    found = re.search(r"^## .*\n\n(.+)$", markdown, re.MULTILINE)
    return SENTENCE_END.split(found[1].strip(), maxsplit=1)[0] if found else None
