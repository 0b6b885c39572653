"""The page every HTML report of roofline's is made on: one self-contained file (no network, no external script
or font), its style, tables that sort when a header is clicked, and a self-test a headless browser runs
(`#selftest`: every table sorted both ways; a script error is noted on <body>)."""

from __future__ import annotations

import math
from html import escape

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
main{max-width:1180px;margin:0 auto;padding:20px 24px 60px}
h1{font-size:22px;margin:8px 0 2px}h3{font-size:15px;margin:18px 0 6px}h2{font-size:17px;margin:30px 0 8px;border-bottom:1px solid #d8dce3;padding-bottom:4px}
.sub{color:#5b6474}.card{background:#fff;border:1px solid #dde1e8;border-radius:6px;padding:12px 14px;margin:10px 0}
.sev{display:inline-block;min-width:56px;text-align:center;border-radius:4px;color:#fff;font-size:12px;padding:1px 6px;margin-right:8px}
.high{background:#c9372c}.medium{background:#d68a00}.low{background:#7a8494}
.gain{float:right;font-weight:600}.where{font-family:ui-monospace,monospace;color:#3b4a66}
.evidence{color:#5b6474;font-size:12.5px;margin-top:4px}
.verified{color:#1d5f8a;margin:4px 0}.verified.none{color:#8a6d1d}.cases{margin:2px 0 4px 18px;font-size:12.5px}
table{border-collapse:collapse;width:100%;background:#fff;font-size:13px}
th,td{padding:4px 8px;border-bottom:1px solid #eceef2;text-align:left;vertical-align:top}
th{background:#eef1f5;cursor:pointer;user-select:none;white-space:nowrap}th.sorted-asc:after{content:" \\25B2"}
th.sorted-desc:after{content:" \\25BC"}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px}
.legend span{display:inline-block;margin-right:14px;font-size:12px}.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
.bar{display:flex;height:16px;border-radius:3px;overflow:hidden;margin:6px 0}.bar div{height:100%}
details{margin-left:14px}summary{cursor:pointer}.tree{background:#fff;border:1px solid #dde1e8;border-radius:6px;padding:8px}
.note{color:#5b6474;font-size:12.5px}.scroll{overflow-x:auto}svg text{font:11px system-ui,sans-serif;fill:#3a4252}
td.code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px;white-space:pre}
pre{background:#fff;border:1px solid #dde1e8;border-radius:6px;padding:8px;overflow-x:auto;max-height:600px}
tr.cold td{color:#9aa1ad}
"""

# Sorting by clicking a header; errors are recorded on <body> so a headless browser test can see them.
SCRIPT = """
window.addEventListener('error', function (e) {
  document.body.setAttribute('data-script-error', String(e.message || e));
});
function cellValue(td) {
  var v = td.getAttribute('data-v');
  if (v !== null) { return parseFloat(v); }
  return td.textContent.trim().toLowerCase();
}
document.querySelectorAll('table.sortable').forEach(function (table) {
  table.querySelectorAll('th').forEach(function (th, col) {
    th.addEventListener('click', function () {
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      var desc = !th.classList.contains('sorted-desc');
      rows.sort(function (a, b) {
        var x = cellValue(a.cells[col]), y = cellValue(b.cells[col]);
        if (x === y) { return 0; }
        return (x < y ? -1 : 1) * (desc ? -1 : 1);
      });
      rows.forEach(function (r) { body.appendChild(r); });
      table.querySelectorAll('th').forEach(function (h) { h.classList.remove('sorted-asc', 'sorted-desc'); });
      th.classList.add(desc ? 'sorted-desc' : 'sorted-asc');
    });
  });
});
// #selftest (used by the tests in a headless browser): sort every table both ways, then say how it went.
if (location.hash === '#selftest') {
  var clicked = 0;
  document.querySelectorAll('table.sortable th').forEach(function (th) { th.click(); th.click(); clicked += 1; });
  document.body.setAttribute('data-selftest', clicked + ' ' + document.querySelectorAll('th.sorted-asc').length);
}
document.body.setAttribute('data-ready', '1');
"""


def num(x, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return ""
    return f"{x:,}" if isinstance(x, int) else f"{x:,.{digits}f}"


def table(columns: list[tuple[str, str]], rows: list[dict], table_id: str) -> str:
    """A sortable table. columns: (header, key); a key ending in ':n' is numeric (right-aligned, sorts by value),
    one ending in ':code' is source code."""
    head = "".join(f"<th>{escape(h)}</th>" for h, _ in columns)
    body = []
    for row in rows:
        cells = []
        for _, key in columns:
            value = row.get(key.removesuffix(":n").removesuffix(":code"))
            if key.endswith(":n"):
                raw = value[0] if isinstance(value, tuple) else value
                text = value[1] if isinstance(value, tuple) else num(value)
                data = f' data-v="{raw}"' if isinstance(raw, (int, float)) else ' data-v="-1e308"'
                cells.append(f'<td class="n"{data}>{escape(str(text))}</td>')
            elif key.endswith(":code"):   # source code: monospace, its indentation kept
                cells.append(f'<td class="code">{escape("" if value is None else str(value))}</td>')
            else:
                cells.append(f"<td>{escape('' if value is None else str(value))}</td>")
        css = row.get("_class")   # a row's own class: "cold" greys it
        body.append((f'<tr class="{escape(css)}">' if css else "<tr>") + "".join(cells) + "</tr>")
    if not rows:
        body.append(f'<tr><td colspan="{len(columns)}" class="note">none</td></tr>')
    return (f'<div class="scroll"><table class="sortable" id="{table_id}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def page(title: str, body: str) -> str:
    """The whole page: `body` (HTML) under the style, with the sorting script."""
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f'<meta name="viewport" content="width=device-width,initial-scale=1"><style>{CSS}</style></head>'
            f"<body><main>{body}</main><script>{SCRIPT}</script></body></html>")
