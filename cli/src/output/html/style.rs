//! The page's own CSS and its one script, inline (the file must open with no
//! network): the script checks after the plots are parsed that each has drawn
//! data marks, calls `console.error("empty plot: <id>")` for one that has
//! not, and leaves the count of good plots in `document.body.dataset.plots`.

pub const CSS: &str = r#"
:root { --pass: #1a7f37; --warn: #9a6700; --fail: #b3261e; --muted: #57606a; --line: #d0d7de; }
* { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       color: #1f2328; margin: 0 auto; max-width: 1040px; padding: 0 24px 48px; background: #fff; }
h1 { margin: 0; font-size: 28px; letter-spacing: .02em; }
h2 { font-size: 20px; margin: 32px 0 8px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 16px; margin: 0 0 4px; }
.banner { margin: 24px 0 8px; padding: 16px 20px; border-radius: 8px; color: #fff; }
.banner p { margin: 6px 0 0; font-size: 16px; }
.banner .sub { opacity: .9; font-size: 14px; }
.v-pass { background: var(--pass); } .v-warn { background: var(--warn); }
.v-fail { background: var(--fail); } .v-incomplete, .v-unknown, .v-note { background: #57606a; }
.badge { display: inline-block; min-width: 44px; text-align: center; border-radius: 4px; color: #fff;
         font-size: 12px; font-weight: 600; padding: 1px 6px; margin-right: 6px; text-transform: uppercase; }
ol.findings { padding-left: 0; list-style: none; margin: 0; }
ol.findings li { padding: 6px 0; border-bottom: 1px solid #eaeef2; }
ol.findings .where { color: var(--muted); }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 0; }
dl.facts dt { font-weight: 600; color: var(--muted); } dl.facts dd { margin: 0; overflow-wrap: anywhere; }
table { border-collapse: collapse; width: 100%; font-size: 13px; margin: 4px 0 8px; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #eaeef2; vertical-align: top; }
th { background: #f6f8fa; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.c-pass { color: var(--pass); font-weight: 600; } td.c-warn { color: var(--warn); font-weight: 600; }
td.c-fail { color: var(--fail); font-weight: 600; }
.scroll { overflow-x: auto; }
h3.pairs { margin-top: 18px; } table.pairs { width: auto; } table.pairs tbody th { background: #f6f8fa; }
table.pairs td { text-align: right; font-variant-numeric: tabular-nums; min-width: 64px; }
table.pairs td.pair-fail { color: #5c0f0a; font-weight: 600; } table.pairs td.self { color: var(--muted); }
figure.plot { margin: 20px 0; padding: 12px; border: 1px solid var(--line); border-radius: 8px; }
figure.plot svg.chart { width: 100%; height: auto; display: block; }
ul.legend { list-style: none; padding: 0; margin: 6px 0 0; display: flex; flex-wrap: wrap; gap: 4px 18px; font-size: 13px; }
ul.legend li { display: flex; align-items: center; gap: 6px; }
.sw { display: inline-block; width: 22px; height: 12px; }
.sw.line { height: 3px; } .sw.dot { width: 10px; height: 10px; border-radius: 50%; }
.sw.outline { background: transparent !important; border: 3px solid; }
.sw.cross { width: 14px; height: 14px; background: transparent !important; position: relative; }
.sw.cross::before, .sw.cross::after { content: ""; position: absolute; left: 6px; top: -1px; width: 3px;
  height: 16px; background: var(--c); transform: rotate(45deg); }
.sw.cross::after { transform: rotate(-45deg); }
.note { color: var(--muted); font-size: 13px; margin: 6px 0 0; }
details { margin: 12px 0; } summary { cursor: pointer; font-weight: 600; }
footer { margin-top: 40px; color: var(--muted); font-size: 12px; }
@media print { figure.plot { break-inside: avoid; } }
"#;

pub const CHECK: &str = r#"
(function () {
  var good = 0;
  document.querySelectorAll("figure[data-plot]").forEach(function (f) {
    if (f.querySelectorAll("svg [data-mark]").length > 0) { good += 1; }
    else { console.error("empty plot: " + f.id); }
  });
  document.body.dataset.plots = String(good);
})();
"#;
