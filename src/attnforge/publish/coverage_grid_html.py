"""The coverage page's grids as HTML: per kernel and profile, a table of the rows that hold something besides
refusals (toolkit x torch row headers, Python column headers), then the refused cells folded into a `<details>`,
one item per set of reasons with the cells it covers.

Cells stay short: a published wheel is its state and version, linked to its line in the published list; a
refused cell names its rule and links to its group. Everything is text a screen reader reads in order; the
`data-py` of a cell names its Python column for the narrow layout (the style sheet shows it when the table's
columns stack).
"""

from __future__ import annotations

import html

from attnforge.publish.coverage import ANY_PYTHON, STATE_LABELS, STATE_PLACES, Entry, Row, Section, summary
from attnforge.publish.coverage_views import RefusalGroup, folded_count, grid_rows, refusal_groups, rule_of


def esc(text: object) -> str:
    """HTML-escaped text (quotes too: safe in attributes)."""
    return html.escape(str(text), quote=True)


def state_word(state: str) -> str:
    return f'<strong class="state">{esc(STATE_LABELS[state])}</strong>'


def counts_text(counts: dict[str, int]) -> str:
    """`1 built · 80 not built · ...`: the states that occur, in state order."""
    return " · ".join(f"{n} {STATE_LABELS[s]}" for s, n in counts.items() if n) or "nothing"


def python_label(python: str) -> str:
    return "every Python" if python == ANY_PYTHON else f"Python {python}"


class GridIds:
    """Anchors shared by the grids and the published list: a wheel's line, a refusal group."""

    def __init__(self) -> None:
        self.wheels: dict[str, str] = {}  # filename -> id of its line in the published list

    def wheel(self, filename: str) -> str:
        return self.wheels.setdefault(filename, f"w{len(self.wheels) + 1}")

    @staticmethod
    def group(section: int, group: int) -> str:
        return f"r{section}-{group}"


def _entry(e: Entry, ids: GridIds, group_of: dict[str, str]) -> str:
    """One entry of a grid cell: the state word first, then the version and a link to what backs it."""
    cls = f'class="entry state-{e.state}"'
    if e.filename:
        return (
            f'<a {cls} href="#{ids.wheel(e.filename)}">{state_word(e.state)} '
            f'<span class="version">{esc(e.kernel_version)}</span></a>'
        )
    if STATE_PLACES[e.state] == "folded":
        links = ", ".join(f'<a href="#{group_of.get(r, "")}">{esc(rule_of(r))}</a>' for r in e.reasons)
        # the state's first word shows, all of it is read: the cell stays narrow, its text whole
        first, _, rest = STATE_LABELS[e.state].partition(" ")
        hidden = f'<span class="sr-only"> {esc(rest)}</span>' if rest else ""
        return f'<div {cls}><strong class="state">{esc(first)}{hidden}</strong>: {links}</div>'
    build = ""
    if e.cell_id:
        build = (
            '<details class="build"><summary>build it</summary>'
            f"<code>attnforge build --cell {esc(e.cell_id)}</code></details>"
        )
    return (
        f'<div {cls}>{state_word(e.state)} <span class="version">{esc(e.kernel_version)}</span>{build}</div>'
    )


def _row(section: Section, row: Row, ids: GridIds, group_of: dict[str, str]) -> str:
    cells = []
    if row.stable:
        entries = row.cells.get(ANY_PYTHON, [])
        span = max(1, len(section.pythons))
        cells.append(
            f'<td colspan="{span}" class="stable" data-py="every">'
            f'<p class="span">{esc(row.span_label)}</p>\n'
            + "\n".join(_entry(e, ids, group_of) for e in entries)
            + "</td>"
        )
    else:
        for python in section.pythons:
            entries = row.cells.get(python, [])
            label = f'data-py="{esc(python)}"'
            if entries:
                cells.append(f"<td {label}>" + "\n".join(_entry(e, ids, group_of) for e in entries) + "</td>")
            else:
                cells.append(
                    f'<td class="empty" {label}><span aria-hidden="true">–</span>'
                    '<span class="sr-only">not in the matrix</span></td>'
                )
    return (
        f'<tr data-states="{" ".join(row.states)}"><th scope="row">{esc(row.label)}</th>'
        + "".join(cells)
        + "</tr>"
    )


def _pythons(pythons: list[str]) -> str:
    if pythons == [ANY_PYTHON]:
        return "every Python (stable ABI)"
    return "Python " + ", ".join(pythons)


def merge_labels(labels: list[str]) -> list[str]:
    """Row labels that differ only in their first part, written once: `CUDA 12.1 · torch 2.5` and
    `CUDA 12.2 · torch 2.5` -> `CUDA 12.1, 12.2 · torch 2.5`."""
    heads: dict[tuple[str, str], list[str]] = {}  # (first word, the rest after the first part) -> heads
    for label in labels:
        head, sep, tail = label.partition(" · ")
        heads.setdefault((head.split(" ", 1)[0], sep + tail), []).append(head)
    out = []
    for (word, tail), hs in heads.items():
        if len(hs) > 1 and all(h.startswith(word + " ") for h in hs):
            out.append(word + " " + ", ".join(h[len(word) + 1 :] for h in hs) + tail)
        else:
            out += [h + tail for h in hs]
    return out


def _group(anchor: str, group: RefusalGroup) -> str:
    """One reason: its sentence, then the rows it refuses gathered by the Pythons they cover."""
    by_pythons: dict[tuple[str, ...], list[str]] = {}
    for label, pythons in group.rows.items():
        by_pythons.setdefault(tuple(pythons), []).append(label)
    cells = "".join(
        f"<li>{esc(_pythons(list(pythons)))}: {esc('; '.join(merge_labels(labels)))}</li>"
        for pythons, labels in by_pythons.items()
    )
    n = group.count
    return (
        f'<li class="group" id="{anchor}" data-states="{" ".join(group.states)}">'
        f'<p class="why"><strong class="rules">{esc(group.rule)}</strong>, {n} cell{"s" if n != 1 else ""}: '
        f'{esc(group.reason.partition("] ")[2] or group.reason)}</p>\n<ul class="cells">{cells}</ul></li>'
    )


def section_html(n: int, section: Section, ids: GridIds) -> str:
    """One kernel and profile: its heading and counts, its grid, its refusals folded by reason."""
    heading = f"{section.kernel} · profile {section.profile}"
    groups = refusal_groups(section)
    group_of = {g.reason: GridIds.group(n, i) for i, g in enumerate(groups, 1)}
    rows = grid_rows(section)
    parts = [
        f'<section class="grid" id="grid-{n}" aria-labelledby="grid-{n}-h">',
        f'<h3 id="grid-{n}-h">{esc(heading)}</h3>',
        f'<p class="counts">{esc(counts_text(summary([section])))}</p>',
    ]
    if rows:
        columns = [f'<th scope="col">{esc(python_label(p))}</th>' for p in section.pythons]
        parts += [
            "<table>",
            f"<caption>{esc(section.kernel)}, profile {esc(section.profile)}: one row per toolkit and torch "
            "release, one column per Python version; rows refused in every cell are folded below</caption>",
            '<thead><tr><th scope="col">Toolkit · torch</th>'
            + ("".join(columns) or '<th scope="col">Python</th>')
            + "</tr></thead>",
            "<tbody>",
            *[_row(section, r, ids, group_of) for r in rows],
            "</tbody>",
            "</table>",
        ]
    else:
        parts.append('<p class="none">No cell of this profile is valid: every cell is refused by a rule.</p>')
    if groups:
        refused = folded_count(section)
        parts += [
            f'<details class="refusals" id="refused-{n}">',
            f"<summary>{refused} cell{'s' if refused != 1 else ''} refused by a rule, "
            f"under the {len(groups)} reason{'s' if len(groups) != 1 else ''} the rules give</summary>",
            '<ul class="groups">',
            *[_group(group_of[g.reason], g) for g in groups],
            "</ul>",
            "</details>",
        ]
    parts.append("</section>")
    return "\n".join(parts)
